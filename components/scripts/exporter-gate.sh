# shellcheck shell=sh
# The firewall's gate for a container without bash (node_exporter's image is busybox): POSIX sh.
#   exporter-gate MARKER FRESH_SECONDS WAIT_SECONDS -- COMMAND...
# COMMAND starts once the guard holds this boot's rules, whichever they are (MARKER names this
# boot and is at most FRESH_SECONDS old): every version of them drops the exporter's port and
# the fabric's addresses on every interface but the fabric, where it listens. After a reboot it
# is thus never on the network before the guard is back. Otherwise as firewall-gate.sh, whose
# text stays as it is: it is in every Ray and vLLM container's configuration, and a change to it
# would replace every server.
marker="$1" fresh="$2" wait_seconds="$3"
shift 3
[ "${1:-}" = -- ] && shift
boot_id="$(cat /proc/sys/kernel/random/boot_id)"
deadline=$(( $(date +%s) + wait_seconds ))
while :; do
  if [ -s "$marker" ] && read -r mark_boot _ < "$marker" && [ "$mark_boot" = "$boot_id" ] \
     && [ $(( $(date +%s) - $(stat -c %Y "$marker") )) -le "$fresh" ]; then
    exec "$@"
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "spark-vllm firewall gate: this node's firewall rules are not in place after ${wait_seconds}s: not starting; Docker restarts this container" >&2
    exit 1
  fi
  sleep 2
done
