#!/usr/bin/env bash
# On the head: make the model snapshot complete in the HF cache, then print its manifest.
#   weights-fetch.sh --host H --state-dir D --cache-dir C --model M --revision R --timeout-minutes T
# The token (possibly empty) is read from stdin and handed to the container on its stdin. The
# download runs as the SSH user, so the cache never fills with root-owned files.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host state-dir cache-dir model revision timeout-minutes
image="$(cat "$ARG_STATE_DIR/image-id" 2>/dev/null)" \
  || fail "no image recorded in $ARG_STATE_DIR/image-id" "the image step has not run on the head"
mkdir -p "$ARG_CACHE_DIR" || fail "cannot create $ARG_CACHE_DIR" "model.cacheDir is not writable by $(id -un)"
set +e
output="$(timeout "${ARG_TIMEOUT_MINUTES}m" docker run --rm -i --network host \
  --user "$(id -u):$(id -g)" -e HF_HOME=/hf -e HF_HUB_DISABLE_PROGRESS_BARS=1 \
  -v "$ARG_CACHE_DIR:/hf" -v "$SPARK_BIN/hf_fetch.py:/spark-vllm/hf_fetch.py:ro" \
  --entrypoint python3 "$image" /spark-vllm/hf_fetch.py "$ARG_MODEL" "$ARG_REVISION" 2>&1)"
status=$?
set -e
if [ "$status" -ne 0 ]; then
  cause="no network to huggingface.co, a wrong model.id/revision, or a gated model without a valid hfToken"
  [ "$status" -eq 124 ] && cause="the download is slower than timeouts.weightsTransferMinutes=$ARG_TIMEOUT_MINUTES allows"
  fail "fetching $ARG_MODEL@$ARG_REVISION failed: $(tail -n 3 <<<"$output" | paste -sd ' ' -)" "$cause"
fi
note "$output"
step_seconds  # before the manifest: the fetch's last line
bash "$SPARK_BIN/hf-manifest.sh" --host "$ARG_HOST" --cache-dir "$ARG_CACHE_DIR" --model "$ARG_MODEL" --revision "$ARG_REVISION"
