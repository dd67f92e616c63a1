#!/usr/bin/env bash
# On the head: the named keys' map file for the front (HAProxy's `map_str`: `<key> <name>` per
# line), written whole from stdin into the secrets directory beside `bearer`, private (the front
# reads it as root when it loads its configuration). Nothing of the keys is printed.
#   front-keys-file.sh write|remove --host H --file F
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host file
case "$action" in
  write)
    mkdir -p -m 700 "$(dirname "$ARG_FILE")"
    umask 077
    cat > "$ARG_FILE.tmp"
    mv "$ARG_FILE.tmp" "$ARG_FILE"
    echo "named keys written: $(grep -c . "$ARG_FILE" || true)"
    ;;
  remove) rm -f "$ARG_FILE" "$ARG_FILE.tmp" ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
