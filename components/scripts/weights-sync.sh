#!/usr/bin/env bash
# On the head: copy the snapshot to one worker over the fabric unless it already matches, then
# verify files and bytes there. tar keeps the cache's symlinks (snapshots -> blobs) intact.
#   weights-sync.sh --host H --worker W --target ssh://user@ip:port --worker-bin DIR --cache-dir C
#                   --model M --manifest "commit files bytes" --timeout-minutes T [--fabric-key ...]
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host worker target worker-bin cache-dir model manifest timeout-minutes
read -r commit files bytes <<<"$ARG_MANIFEST"
worker_manifest() {
  fabric_ssh "$ARG_TARGET" "$(words bash "$ARG_WORKER_BIN/hf-manifest.sh" --host "$ARG_WORKER" \
    --cache-dir "$ARG_CACHE_DIR" --model "$ARG_MODEL" --revision "$commit")" 2>&1
}
check_fabric_ssh "$ARG_TARGET"
if [ "$(worker_manifest)" = "$ARG_MANIFEST" ]; then
  echo "$ARG_WORKER already has $ARG_MODEL@$commit ($files files, $bytes bytes); nothing copied"
  exit 0
fi
repo="models--${ARG_MODEL//\//--}"
hub="$ARG_CACHE_DIR/hub"
[ -d "$hub/$repo/snapshots/$commit" ] || fail "the head has no snapshot $commit of $ARG_MODEL" "the fetch step did not complete"
export_fabric_ssh
started=$SECONDS
set +e
timeout "${ARG_TIMEOUT_MINUTES}m" bash -c \
  'set -o pipefail; tar -C "$1" -cf - "$2/refs" "$2/blobs" "$2/snapshots/$3" | fabric_ssh "$4" "$5"' \
  weights-sync "$hub" "$repo" "$commit" "$ARG_TARGET" \
  "$(words mkdir -p "$hub") && $(words tar -C "$hub" -xf -)" >&2
status=$?
set -e
if [ "$status" -ne 0 ]; then
  cause="the fabric link to $ARG_TARGET dropped or the worker's disk is full"
  [ "$status" -eq 124 ] && cause="the copy is slower than timeouts.weightsTransferMinutes=$ARG_TIMEOUT_MINUTES allows"
  fail "copying $ARG_MODEL to $ARG_WORKER failed after $(( SECONDS - started ))s (exit $status)" "$cause"
fi
after="$(worker_manifest)"
[ "$after" = "$ARG_MANIFEST" ] \
  || fail "after the copy $ARG_WORKER reports '$after', the head has '$ARG_MANIFEST'" "the copy was incomplete (disk full?) or the cache is being changed concurrently"
echo "copied $ARG_MODEL@$commit to $ARG_WORKER ($files files, $bytes bytes) in $(( SECONDS - started ))s"
