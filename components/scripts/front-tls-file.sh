#!/usr/bin/env bash
# On the head: the certificate the front serves HTTPS with, then its private key (PEM, one file:
# HAProxy's `crt`), in the front's secrets directory, private (front.tls; stacks/plan/front.py
# TLS_CERT_NAME). Either the user's pair, on stdin (certificate first; nothing of the key is
# printed), checked to belong together when openssl is here; or, with --san (front.tls.selfSigned),
# a key pair and a self-signed certificate for that name made here once, and again only when the
# name changes (kept beside it, `.san`). The certificate (not secret) is printed either way,
# between its PEM lines, for the stack's outputs.
#   front-tls-file.sh write|remove --host H --file F [--san IP:ADDRESS|DNS:NAME]
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host file
dir="$(dirname "$ARG_FILE")"
# A self-signed pair for --san: 10 years (a certificate clients pin, not one anyone renews;
# HAProxy and clients check its dates all the same), P-256 as the handover's (front-keys-file.sh).
self_signed_pair() {
  command -v openssl >/dev/null \
    || fail "openssl is not installed on $ARG_HOST" \
            "front.tls.selfSigned makes the front's certificate with it: install openssl (apt install openssl), or give certificateFile and keyFile"
  rm -f "$ARG_FILE.key.tmp" "$ARG_FILE.crt.tmp"
  out="$(openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
      -subj "/CN=${ARG_SAN#*:}" -addext "subjectAltName=$ARG_SAN" \
      -addext "basicConstraints=critical,CA:FALSE" -addext "extendedKeyUsage=serverAuth" \
      -keyout "$ARG_FILE.key.tmp" -out "$ARG_FILE.crt.tmp" 2>&1)" \
    || fail "openssl could not make the front's certificate: ${out##*$'\n'}" \
            "openssl older than 1.1.1 (no -addext): see \`openssl version\` on $ARG_HOST"
  cat "$ARG_FILE.crt.tmp" "$ARG_FILE.key.tmp" > "$ARG_FILE.tmp"
  rm -f "$ARG_FILE.key.tmp" "$ARG_FILE.crt.tmp"
  mv "$ARG_FILE.tmp" "$ARG_FILE"
  printf '%s\n' "$ARG_SAN" > "$ARG_FILE.san"
  echo "front certificate made for $ARG_SAN"
}
# The user's pair, from stdin: both parts there, and (openssl at hand) the key the certificate's.
user_pair() {
  cat > "$ARG_FILE.tmp"
  if ! grep -q -- '-----BEGIN CERTIFICATE-----' "$ARG_FILE.tmp" \
      || ! grep -q -- 'PRIVATE KEY-----' "$ARG_FILE.tmp"; then
    rm -f "$ARG_FILE.tmp"
    fail "no certificate and key on stdin" "a bug in spark-vllm: please report it"
  fi
  if command -v openssl >/dev/null; then
    cert_key="$(openssl x509 -noout -pubkey -in "$ARG_FILE.tmp" 2>/dev/null)"
    own_key="$(openssl pkey -pubout -in "$ARG_FILE.tmp" 2>/dev/null)"
    if [ -z "$own_key" ] || [ "$cert_key" != "$own_key" ]; then
      rm -f "$ARG_FILE.tmp"
      fail "front.tls.keyFile is not the private key of front.tls.certificateFile" \
           "the two files are of different pairs (compare \`openssl x509 -noout -pubkey -in CERT\` with \`openssl pkey -pubout -in KEY\`)"
    fi
  fi
  mv "$ARG_FILE.tmp" "$ARG_FILE"
  rm -f "$ARG_FILE.san"
  echo "front certificate written"
}
case "$action" in
  write)
    mkdir -p -m 700 "$dir"
    umask 077
    if [ -n "${ARG_SAN:-}" ]; then
      if [ ! -s "$ARG_FILE" ] || [ "$(cat "$ARG_FILE.san" 2>/dev/null)" != "$ARG_SAN" ]; then
        self_signed_pair
      fi
    else
      user_pair
    fi
    sed -n '/-----BEGIN CERTIFICATE-----/,/-----END CERTIFICATE-----/p' "$ARG_FILE"
    ;;
  remove)
    rm -f "$ARG_FILE" "$ARG_FILE.san" "$ARG_FILE".*tmp "$ARG_FILE.tmp"
    rmdir "$dir" 2>/dev/null || true
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
