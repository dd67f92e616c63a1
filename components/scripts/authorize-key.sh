#!/usr/bin/env bash
# On a worker, over its own connection: authorize (or revoke) the head's fabric key.
#   authorize-key.sh add --host H --marker M --from IPS   (reads the public key line on stdin)
#   authorize-key.sh remove --host H --marker M
# Lines are found again by the marker, the key's comment: the line's last field, compared whole
# (a marker ending in spark1 must not match spark10's line). The key is authorized only from
# IPS (`from="IPS"`, comma-separated IPv4 addresses: the fabric addresses that sign in with it),
# so a copy of the head's private key is of no use anywhere else; a line of an older release,
# without `from=`, is replaced by it.
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host marker
umask 077  # authorized_keys is rewritten through a temp file: keep it private
auth="$HOME/.ssh/authorized_keys"
mkdir -p -m 700 "$HOME/.ssh"
touch "$auth" && chmod 600 "$auth"
# Every line but those whose last field is the marker (from the environment: awk -v would
# interpret backslashes).
without_marker() { MARKER="$ARG_MARKER" awk 'NF == 0 || $NF != ENVIRON["MARKER"]' "$auth"; }
with_key() { without_marker && printf 'from="%s" %s\n' "$ARG_FROM" "$key_line"; }
# rewrite FUNCTION: authorized_keys becomes FUNCTION's output, written to a private temp file
# beside it and renamed over it, and only if FUNCTION succeeded (never a truncated file).
rewrite() {
  local tmp
  tmp="$(mktemp "$HOME/.ssh/.authorized_keys.XXXXXX")"
  chmod 600 "$tmp"
  if "$1" > "$tmp" && mv "$tmp" "$auth"; then return 0; fi
  rm -f "$tmp"
  fail "cannot rewrite $auth" "the disk is full, or $HOME/.ssh is not writable"
}
# One read-modify-write at a time (two deployments may update the same worker's file at once).
exec 9>"$HOME/.ssh/.spark-vllm.lock"
flock -w 30 9 || fail "another spark-vllm step held $HOME/.ssh/.spark-vllm.lock for 30 s" \
  "a stuck authorize-key.sh on this host: retry, or remove the lock's holder"
case "$action" in
  add)
    require from
    # Addresses only: a quote or a space would end the option and let the line say more.
    [[ "$ARG_FROM" =~ ^[0-9]+(\.[0-9]+){3}(,[0-9]+(\.[0-9]+){3})*$ ]] \
      || fail "the addresses to authorize the key from are not IPv4 addresses: '$ARG_FROM'" \
        "a bug in spark-vllm: please report it"
    key_line="$(head -n 1)"
    [ "$(awk '{ print $NF }' <<<"$key_line")" = "$ARG_MARKER" ] \
      || fail "the key to authorize lacks the marker $ARG_MARKER" "a bug in spark-vllm: please report it"
    rewrite with_key
    # The worker's own host keys, read over its authenticated connection (for pinning on the head).
    cat /etc/ssh/ssh_host_*_key.pub 2>/dev/null || true
    ;;
  remove)
    rewrite without_marker
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
