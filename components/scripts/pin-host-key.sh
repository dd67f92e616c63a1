#!/usr/bin/env bash
# On the head: pin a worker's host key under its fabric IP in the head's fabric known_hosts.
#   pin-host-key.sh add|remove --host H --state-dir D --address IP [--key "type base64"]
# Without --key, the key lines are read from stdin (as printed by authorize-key.sh).
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host state-dir address
umask 077
known="$ARG_STATE_DIR/fabric_known_hosts"
mkdir -p -m 700 "$ARG_STATE_DIR"
touch "$known"
# Workers are pinned concurrently: one writer at a time, each through its own temp file.
exec 9>"$known.lock"
flock -w 30 9 || fail "$known is locked by another step for over 30 s" "a stuck earlier run on the head"
tmp="$(mktemp "$known.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
others() { awk -v a="$ARG_ADDRESS" '$1 != a' "$known"; }
case "$action" in
  add)
    if [ -n "${ARG_KEY:-}" ]; then keys="$ARG_KEY"; else keys="$(awk 'NF >= 2 {print $1, $2}')"; fi
    [ -n "$keys" ] || fail "no host key to pin for $ARG_ADDRESS" \
      "the worker's host key is neither configured (hosts[].hostKey / ssh.knownHostsFile) nor readable in /etc/ssh"
    { others; while read -r type blob _; do printf '%s %s %s\n' "$ARG_ADDRESS" "$type" "$blob"; done <<<"$keys"; } > "$tmp"
    mv "$tmp" "$known"
    ;;
  remove)
    others > "$tmp" && mv "$tmp" "$known"
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
