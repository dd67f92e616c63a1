#!/usr/bin/env bash
# On the head: the named keys' map file for the front (HAProxy's `map_str`: `<key> <name>` per
# line) and, beside it, `upstream.map` (`operator Bearer <apiKey>`: what a named key's request
# carries on to vLLM, which checks only the operator's key). Both from stdin, the operator's key
# on its first line; written whole into the secrets directory beside `bearer`, private (the
# front reads them as root when it loads its configuration). Nothing of the keys is printed.
#   front-keys-file.sh write|remove --host H --file F
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host file
upstream="$(dirname "$ARG_FILE")/upstream.map"
case "$action" in
  write)
    mkdir -p -m 700 "$(dirname "$ARG_FILE")"
    umask 077
    IFS= read -r operator || true
    [ -n "$operator" ] || fail "no operator key on stdin" "a bug in spark-vllm: please report it"
    cat > "$ARG_FILE.tmp"
    printf 'operator Bearer %s\n' "$operator" > "$upstream.tmp"
    mv "$upstream.tmp" "$upstream"
    mv "$ARG_FILE.tmp" "$ARG_FILE"
    echo "named keys written: $(grep -c . "$ARG_FILE" || true)"
    ;;
  remove) rm -f "$ARG_FILE" "$ARG_FILE.tmp" "$upstream" "$upstream.tmp" ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
