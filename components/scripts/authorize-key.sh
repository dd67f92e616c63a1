#!/usr/bin/env bash
# On a worker, over its own connection: authorize (or revoke) the head's fabric key.
#   authorize-key.sh add|remove --host H --marker M      (add reads the public key line on stdin)
# Lines are found again by the marker in the key's comment, so removal needs no input.
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host marker
umask 077  # authorized_keys is rewritten through a temp file: keep it private
auth="$HOME/.ssh/authorized_keys"
mkdir -p -m 700 "$HOME/.ssh"
touch "$auth" && chmod 600 "$auth"
without_marker() { grep -vF -- "$ARG_MARKER" "$auth" || true; }
case "$action" in
  add)
    key_line="$(head -n 1)"
    grep -qF -- "$ARG_MARKER" <<<"$key_line" || fail "the key to authorize lacks the marker $ARG_MARKER" "a bug in spark-vllm: please report it"
    { without_marker; printf '%s\n' "$key_line"; } > "$auth.spark-vllm.tmp"
    mv "$auth.spark-vllm.tmp" "$auth"
    # The worker's own host keys, read over its authenticated connection (for pinning on the head).
    cat /etc/ssh/ssh_host_*_key.pub 2>/dev/null || true
    ;;
  remove)
    without_marker > "$auth.spark-vllm.tmp"
    mv "$auth.spark-vllm.tmp" "$auth"
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
