#!/usr/bin/env bash
# On the head: stream the image to one worker over the fabric, unless it already has the same ID.
#   image-sync.sh --host H --worker W --target ssh://user@ip:port --image-id ID --ref REF
#                 --timeout-minutes M [--compress zstd|none] [--progress-seconds S]
#                 [--fabric-key K --fabric-known-hosts F]
#                 [--remove yes]   (the destroy step: remove the image from the worker instead)
# `docker load` tags only after the whole stream arrived, so a cut link leaves nothing tagged.
# Layers the worker already holds (an update of an image it has) are not sent: the saved stream
# carries them as empty files, which `docker load` never reads (image_layers.py says why). A
# worker whose Docker keeps images in containerd (whose loader wants every blob) gets it whole,
# and so does a worker whose load of the thinned stream fails.
# Prints `spark-vllm-image-sent {"bytes": N, "layersKept": K, "layers": L}` once copied.
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
  echo 'spark-vllm-image-sent {"bytes": 0, "layersKept": 0, "layers": 0}'
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
layers="$(docker image inspect --format '{{json .RootFS.Layers}}' "$ARG_IMAGE_ID")"
layer_count="$(grep -o 'sha256:' <<<"$layers" | wc -l)"
# What the worker holds: its Docker's store, then every image's layers (one JSON list a line).
worker_layers="$(fabric_ssh "$ARG_TARGET" "docker info --format '{{json .DriverStatus}}'; docker image ls -q --no-trunc | sort -u | xargs -r docker image inspect --format '{{json .RootFS.Layers}}'" 2>/dev/null || true)"
held=0
if [[ "$worker_layers" != *io.containerd.snapshotter* ]]; then
  held="$(tail -n +2 <<<"$worker_layers" | python3 "$SPARK_BIN/image_layers.py" held "$layers" 2>/dev/null || echo 0)"
fi
# The index of the saved stream (which member holds which layer), once per image on this head.
index_dir="$(dirname "$SPARK_BIN")/image-index" index=""
if [ "$held" -gt 0 ]; then
  index="$index_dir/${ARG_IMAGE_ID#sha256:}.json"
  if [ ! -s "$index" ]; then
    # Copies to several workers run at once: each writes its own part, renamed into place.
    mkdir -p "$index_dir" && find "$index_dir" -name '*.json' ! -name "$(basename "$index")" -delete
    if docker save "$source_ref" | python3 "$SPARK_BIN/image_layers.py" index > "$index.$$"; then
      mv "$index.$$" "$index"
    else
      rm -f "$index.$$"; index="" held=0
      note "$ARG_WORKER: reading the saved image's layers failed: sending it whole"
    fi
  fi
fi
# The bytes to send: the saved stream less the layers the worker holds.
size="$(docker image inspect --format '{{.Size}}' "$ARG_IMAGE_ID")"
if [ -n "$index" ]; then
  size="$(python3 "$SPARK_BIN/image_layers.py" to-send "$index" "$held")"
  note "$ARG_WORKER holds $held of the image's $layer_count layers: sending the other $(( layer_count - held )) ($(( size / 1000000 )) MB)"
fi
meters="$(mktemp -d)"
report_progress "$ARG_WORKER" image "$size" "$meters" "${ARG_PROGRESS_SECONDS:-10}" &
reporter=$!
trap 'kill "$reporter" 2>/dev/null || true; rm -rf "$meters"' EXIT
# send HELD: the saved stream, its first HELD layers emptied (`whole`: all of it), to the worker.
send() {
  timeout "${ARG_TIMEOUT_MINUTES}m" bash -c \
    'set -o pipefail; held=$6 layers_py=$7 index=$8
     thin() { if [ "$held" = whole ]; then cat; else python3 "$layers_py" filter "$index" "$held"; fi; }
     docker save "$1" | thin | dd bs=1M status=progress 2>"$5" | $2 | fabric_ssh "$3" "$4 | docker load"' \
    image-sync "$source_ref" "$compress" "$ARG_TARGET" "$decompress" "$meters/save" "$1" \
    "$SPARK_BIN/image_layers.py" "$index" >&2
}
set +e
if [ -n "$index" ]; then
  send "$held"
  status=$?
  # Not when the link is what failed: the whole image would fail the same way, slower.
  if [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && fabric_ssh "$ARG_TARGET" true 2>/dev/null; then
    note "$ARG_WORKER: loading the image without the layers it holds failed (exit $status): sending it whole"
    held=0 size="$(docker image inspect --format '{{.Size}}' "$ARG_IMAGE_ID")"
    send whole
    status=$?
  fi
else
  send whole
  status=$?
fi
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
printf 'spark-vllm-image-sent {"bytes": %s, "layersKept": %s, "layers": %s}\n' \
  "$(metered_bytes "$meters")" "$held" "$layer_count"
