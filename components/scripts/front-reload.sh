#!/usr/bin/env bash
# On the head: the front takes a changed configuration without dropping what it serves. HAProxy's
# master (-W) re-executes itself on SIGUSR2; the old workers stop listening and finish their
# requests, streams included, within the configuration's `hard-stop-after` (front.py
# RELOAD_DRAIN_SECONDS). A configuration HAProxy refuses is not loaded: the old one serves.
# A front that started after the file was written runs it already (and one just started may not
# handle the signal yet): nothing to do. The last configuration the front ran is kept beside the
# file (`.good`): a refused one is replaced by it at once, so a restart of the front (a reboot,
# Docker's restart policy) never reads a configuration HAProxy refused; and the configuration
# step's receipt goes, so the next `pulumi up` writes and checks the new one again (rather than
# taking the one put back for it). --keys-map: the named keys' map the configuration reads, written
# by a step of its own: a front that started before it was last written reloads too; so does
# --tls-file, the front's certificate and key (front.tls, front-tls-file.sh).
#   front-reload.sh --host H --container C --file HOST_PATH --config CONTAINER_PATH --digest D
#                   [--keys-map HOST_PATH] [--tls-file HOST_PATH]
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host container file config digest
state="$(timeout 30 docker inspect -f '{{.State.Status}} {{.State.StartedAt}}' "$ARG_CONTAINER" 2>&1)" \
  || fail "cannot read the front's container $ARG_CONTAINER: ${state##*$'\n'}" \
    "Docker on the head did not answer, or the container is gone (pulumi up --refresh makes it again)"
status="${state%% *}"
good="$ARG_FILE.good"
# keep_good: the file the front runs now, kept whole for a later refusal to fall back to.
# Not fatal: the front took the configuration; without the copy a later refusal leaves its file.
keep_good() {
  { cp -p "$ARG_FILE" "$good.tmp" && mv -f "$good.tmp" "$good"; } 2>/dev/null \
    || note "could not keep a copy of the configuration beside it ($good): is the disk full?"
}
if [ "$status" != running ]; then  # restarting, exited, created: it reads the file when it starts
  echo "the front is $status: it reads configuration $ARG_DIGEST when it starts"
  exit 0
fi
started="$(date -d "${state#* }" +%s.%N 2>/dev/null || echo 0)"
written="$(stat -c %.9Y "$ARG_FILE" 2>/dev/null || echo 0)"
for beside in "${ARG_KEYS_MAP:-}" "${ARG_TLS_FILE:-}"; do
  [ -n "$beside" ] || continue
  beside_written="$(stat -c %.9Y "$beside" 2>/dev/null || echo 0)"
  written="$(awk -v a="$written" -v b="$beside_written" 'BEGIN { print (b > a) ? b : a }')"
done
if awk -v started="$started" -v written="$written" 'BEGIN { exit !(started >= written) }'; then
  keep_good
  echo "the front started with configuration $ARG_DIGEST"
  exit 0
fi
if ! out="$(timeout 60 docker exec "$ARG_CONTAINER" haproxy -c -q -f "$ARG_CONFIG" 2>&1)"; then
  restored="it stays on disk (no earlier configuration was kept)"
  if [ -f "$good" ] && cp -p "$good" "$ARG_FILE.tmp" && mv -f "$ARG_FILE.tmp" "$ARG_FILE"; then
    restored="the one it runs was put back on disk"
    # <state>/front/haproxy.cfg: the step that wrote it is front-config (stacks/plan/hosts.py).
    rm -f "$(dirname "$(dirname "$ARG_FILE")")/receipts/front-config"
  fi
  cause="a bug in spark-vllm (the configuration is its own): the previous one keeps serving; please report it"
  if [ -n "${ARG_TLS_FILE:-}" ]; then  # the one file of the user's it reads (front.tls)
    cause="front.tls's certificate and key do not belong together or HAProxy cannot read them (see its lines above; the head has no openssl to check them first); else $cause"
  fi
  fail "HAProxy refuses the front's new configuration ($restored): $(printf '%s' "$out" | tail -n 5)" "$cause"
fi
out="$(timeout 30 docker kill -s USR2 "$ARG_CONTAINER" 2>&1)" \
  || fail "the front did not take the signal to reload: ${out##*$'\n'}" \
    "Docker on the head did not answer; run 'pulumi up' again"
keep_good
echo "front reloaded: configuration $ARG_DIGEST"
