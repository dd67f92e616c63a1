# shellcheck shell=bash
# The gate in front of every Ray and vLLM container's own entrypoint (bash -c, self-contained):
#   firewall-gate MARKER DIGEST FRESH_SECONDS WAIT_SECONDS -- COMMAND...
# COMMAND starts only once the firewall guard (firewall.sh, its own container) holds this node's
# rules: MARKER holds this boot's ID and the rules' DIGEST and is at most FRESH_SECONDS old. At
# boot Docker starts containers in no order, so this waits, bounded, then exits non-zero (Docker
# restarts it with its backoff): nothing that listens starts while the cluster's ports are open.
set -uo pipefail
marker="$1" digest="$2" fresh="$3" wait_seconds="$4"
shift 4
[ "${1:-}" = -- ] && shift
say() { printf 'spark-vllm firewall gate: %s\n' "$*" >&2; }
boot_id="$(cat /proc/sys/kernel/random/boot_id)"
deadline=$(( SECONDS + wait_seconds ))
waited=""
while :; do
  if [ -s "$marker" ]; then
    read -r mark_boot mark_digest < "$marker" || true
    age=$(( $(date +%s) - $(stat -c %Y "$marker" 2>/dev/null || echo 0) ))
    if [ "${mark_boot:-}" = "$boot_id" ] && [ "${mark_digest:-}" = "$digest" ] && [ "$age" -le "$fresh" ]; then
      if [ -n "$waited" ]; then say "the firewall holds this node's rules: starting"; fi
      exec "$@"
    fi
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    error="$(cat "$(dirname "$marker")/error" 2>/dev/null)"
    say "this node's firewall rules are not in place after ${wait_seconds}s (${error:-the firewall container has not applied them}): not starting anything that listens; Docker restarts this container"
    exit 1
  fi
  if [ -z "$waited" ]; then say "waiting for the firewall container to apply this node's rules"; waited=1; fi
  sleep 2
done
