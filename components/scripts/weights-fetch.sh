#!/usr/bin/env bash
# On the head: make the model snapshot complete in the HF cache, then print its manifest.
#   weights-fetch.sh --host H --state-dir D --cache-dir C --model M --revision R --timeout-minutes T
#                    [--include JSON] [--exclude JSON]
# The token (possibly empty) is read from stdin and handed to the container on its stdin. The
# download runs as the SSH user, so the cache never fills with root-owned files. The commit a
# branch or tag resolved to is recorded in the state dir, and every later fetch of the same
# model and revision fetches that commit (hf_fetch.py revision_to_fetch). Only the files the
# model's include/exclude patterns (JSON lists) keep are fetched, and counted in the manifest.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host state-dir cache-dir model revision timeout-minutes
include="${ARG_INCLUDE:-[]}" exclude="${ARG_EXCLUDE:-[]}"
image="$(cat "$ARG_STATE_DIR/image-id" 2>/dev/null)" \
  || fail "no image recorded in $ARG_STATE_DIR/image-id" "the image step has not run on the head"
mkdir -p "$ARG_CACHE_DIR" || fail "cannot create $ARG_CACHE_DIR" "model.cacheDir is not writable by $(id -un)"
pin_file="$ARG_STATE_DIR/weights-pins/${ARG_MODEL//\//--}@${ARG_REVISION//\//--}"
pin="$(cat "$pin_file" 2>/dev/null || true)"
set +e
output="$(timeout "${ARG_TIMEOUT_MINUTES}m" docker run --rm -i --network host \
  --user "$(id -u):$(id -g)" -e HF_HOME=/hf -e HF_HUB_DISABLE_PROGRESS_BARS=1 \
  -v "$ARG_CACHE_DIR:/hf" -v "$SPARK_BIN/hf_fetch.py:/spark-vllm/hf_fetch.py:ro" \
  --entrypoint python3 "$image" /spark-vllm/hf_fetch.py "$ARG_MODEL" "$ARG_REVISION" "$pin" \
  "$include" "$exclude" 2>&1)"
status=$?
set -e
if [ "$status" -ne 0 ]; then
  cause="no network to huggingface.co, a wrong model.id/revision, or a gated model without a valid hfToken"
  case "$output" in *"is pinned to"*)
    cause="$cause; or the commit $ARG_REVISION was pinned to here is no longer on the hub (its history rewritten): write the commit to serve as the revision" ;;
  esac
  case "$output" in *"not a commit"*)
    cause="something other than the hub client wrote that refs file (under $ARG_CACHE_DIR/hub): remove it and run pulumi up again (the fetch resolves the revision anew)" ;;
  esac
  [ "$status" -eq 124 ] && cause="the download is slower than timeouts.weightsTransferMinutes=$ARG_TIMEOUT_MINUTES allows"
  fail "fetching $ARG_MODEL@$ARG_REVISION failed: $(tail -n 3 <<<"$output" | paste -sd ' ' -)" "$cause"
fi
commit="$(sed -n 's/^fetched \([0-9a-f]\{40\}\)$/\1/p' <<<"$output" | tail -n 1)"
[ -n "$commit" ] || fail "fetching $ARG_MODEL@$ARG_REVISION named no commit: $(tail -n 3 <<<"$output" | paste -sd ' ' -)" \
  "the serving image's huggingface_hub returned no snapshot path"
note "$(grep -v '^fetched ' <<<"$output")"
manifest="$(bash "$SPARK_BIN/hf-manifest.sh" --host "$ARG_HOST" --cache-dir "$ARG_CACHE_DIR" \
  --model "$ARG_MODEL" --revision "$commit" --include "$include" --exclude "$exclude")"
mkdir -p "${pin_file%/*}"
printf '%s %s %s\n' "$ARG_MODEL" "$ARG_REVISION" "$commit" >"$pin_file.tmp" && mv "$pin_file.tmp" "$pin_file"
step_seconds  # before the manifest: the fetch's last line
echo "$manifest"
