#!/usr/bin/env bash
# On the head: the named keys' map file for the front (HAProxy's `map_str`: `<key> <entry>` per
# line, the entry its name and a tag of its value: stacks/settings.py key_entry) and, beside
# it, `upstream.map` (`operator Bearer <apiKey>`: what a named key's request carries on to
# vLLM, which checks only the operator's key). Both from stdin, the operator's key
# on its first line; written whole into the front's secrets directory beside `bearer`, private
# (the front reads them as root when it loads its configuration). Nothing of the keys is
# printed.
# Beside them, `handover.pem`, made once when missing: the key pair of the front's table
# handover (stacks/plan/front.py HANDOVER_PEERS), a self-signed certificate then its private
# key, which HAProxy both presents and alone trusts; the deployment's own, never leaving the
# head.
#   front-keys-file.sh write|remove --host H --file F
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host file
dir="$(dirname "$ARG_FILE")"
upstream="$dir/upstream.map"
cert="$dir/handover.pem"
# 100 years: a pinned identity, not a chain anyone renews; HAProxy checks its dates all the same.
handover_pair() {
  command -v openssl >/dev/null \
    || fail "openssl is not installed on $ARG_HOST" \
            "the front's table handover needs a key pair made with it: install openssl (apt install openssl)"
  rm -f "$cert.key.tmp" "$cert.crt.tmp"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 36500 \
      -subj "/CN=spark-vllm front handover" -keyout "$cert.key.tmp" -out "$cert.crt.tmp" \
      >/dev/null 2>&1 \
    || fail "openssl could not make the front's handover key pair" "see \`openssl req -x509\` on $ARG_HOST"
  cat "$cert.crt.tmp" "$cert.key.tmp" > "$cert.tmp"
  rm -f "$cert.key.tmp" "$cert.crt.tmp"
  mv "$cert.tmp" "$cert"
  echo "front handover key pair made"
}
case "$action" in
  write)
    mkdir -p -m 700 "$dir"
    umask 077
    IFS= read -r operator || true
    [ -n "$operator" ] || fail "no operator key on stdin" "a bug in spark-vllm: please report it"
    cat > "$ARG_FILE.tmp"
    printf 'operator Bearer %s\n' "$operator" > "$upstream.tmp"
    [ -s "$cert" ] || handover_pair
    mv "$upstream.tmp" "$upstream"
    mv "$ARG_FILE.tmp" "$ARG_FILE"
    echo "named keys written: $(grep -c . "$ARG_FILE" || true)"
    ;;
  remove)
    rm -f "$ARG_FILE" "$ARG_FILE.tmp" "$upstream" "$upstream.tmp" "$cert" "$cert".*tmp
    rmdir "$dir" 2>/dev/null || true
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
