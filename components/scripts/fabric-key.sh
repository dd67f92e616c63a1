#!/usr/bin/env bash
# On the head: the dedicated key the head uses to reach workers over the fabric.
#   fabric-key.sh ensure|remove --host H --state-dir D --comment C
# `ensure` is idempotent (an existing key is kept) and prints the public key line.
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host state-dir comment
key="$ARG_STATE_DIR/fabric_ed25519"
case "$action" in
  ensure)
    mkdir -p -m 700 "$ARG_STATE_DIR"
    if [ ! -f "$key" ]; then
      ssh-keygen -q -t ed25519 -N '' -C "$ARG_COMMENT" -f "$key" \
        || fail "could not create $key" "ssh-keygen is missing or $ARG_STATE_DIR is not writable"
    fi
    cat "$key.pub"
    ;;
  remove)
    rm -f "$key" "$key.pub" "$ARG_STATE_DIR/fabric_known_hosts" "$ARG_STATE_DIR/fabric_known_hosts.lock"
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
