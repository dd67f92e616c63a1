#!/usr/bin/env bash
# On the head: stream the image to one worker over the fabric, unless it already has the same ID.
#   image-sync.sh --host H --worker W --target ssh://user@ip:port --image-id ID --ref REF
#                 --timeout-minutes M [--compress zstd|none] [--progress-seconds S]
#                 [--fabric-key K --fabric-known-hosts F]
#                 [--remove yes]   (the destroy step: remove the image from the worker instead)
# `docker load` tags only after the whole stream arrived, so a cut link leaves nothing tagged.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host worker target image-id ref timeout-minutes
if [ "${ARG_REMOVE:-no}" = yes ]; then
  # Destroy with image.keepOnDestroy false: untag and remove it on the worker (gone is fine).
  fabric_ssh "$ARG_TARGET" "$(words docker image rm "$ARG_REF" "$ARG_IMAGE_ID") >/dev/null 2>&1 || true"
  exit 0
fi
remote_id() {
  fabric_ssh "$ARG_TARGET" "$(words docker image inspect --format '{{.Id}}' "$ARG_IMAGE_ID") 2>/dev/null || true"
}
check_fabric_ssh "$ARG_TARGET"
if [ "$(remote_id)" = "$ARG_IMAGE_ID" ]; then
  echo "$ARG_WORKER already has $ARG_REF ($ARG_IMAGE_ID); nothing copied"
  exit 0
fi
docker image inspect "$ARG_IMAGE_ID" >/dev/null 2>&1 \
  || fail "image $ARG_IMAGE_ID is not on the head" "it was removed after the pull; run 'pulumi up --refresh'"
# Save by reference when it names this exact image (keeps the tag), else by ID.
source_ref="$ARG_IMAGE_ID"
[ "$(docker image inspect --format '{{.Id}}' "$ARG_REF" 2>/dev/null)" = "$ARG_IMAGE_ID" ] && source_ref="$ARG_REF"
compress="cat"; decompress="cat"
if [ "${ARG_COMPRESS:-none}" = zstd ] && command -v zstd >/dev/null \
   && fabric_ssh "$ARG_TARGET" "command -v zstd" >/dev/null 2>&1; then
  compress="zstd -1 -T0 -q"; decompress="zstd -d -q"
fi
export_fabric_ssh
started=$SECONDS
# Progress every few seconds: the saved stream's bytes (before compression), of the image's size.
meters="$(mktemp -d)"
size="$(docker image inspect --format '{{.Size}}' "$ARG_IMAGE_ID")"
report_progress "$ARG_WORKER" image "$size" "$meters" "${ARG_PROGRESS_SECONDS:-10}" &
reporter=$!
trap 'kill "$reporter" 2>/dev/null || true; rm -rf "$meters"' EXIT
set +e
timeout "${ARG_TIMEOUT_MINUTES}m" bash -c \
  'set -o pipefail; docker save "$1" | dd bs=1M status=progress 2>"$5" | $2 | fabric_ssh "$3" "$4 | docker load"' \
  image-sync "$source_ref" "$compress" "$ARG_TARGET" "$decompress" "$meters/save" >&2
status=$?
set -e
kill "$reporter" 2>/dev/null || true
elapsed=$(( SECONDS - started ))
if [ "$status" -ne 0 ]; then
  cause="the fabric link to $ARG_TARGET dropped, the worker's disk is full, or its Docker daemon failed"
  [ "$status" -eq 124 ] && cause="the transfer is slower than timeouts.imageTransferMinutes=$ARG_TIMEOUT_MINUTES allows"
  fail "copying $ARG_REF to $ARG_WORKER failed after ${elapsed}s (exit $status); nothing was tagged there" "$cause"
fi
[ "$(remote_id)" = "$ARG_IMAGE_ID" ] \
  || fail "after the copy $ARG_WORKER does not have image $ARG_IMAGE_ID" "the worker's Docker daemon rejected the image (architecture? disk?)"
echo "copied $ARG_REF ($ARG_IMAGE_ID) to $ARG_WORKER in ${elapsed}s"
