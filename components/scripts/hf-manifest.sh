#!/usr/bin/env bash
# On any node: describe a model snapshot in the HF cache as "commit files bytes" (symlinks followed).
#   hf-manifest.sh --host H --cache-dir D --model ORG/NAME --revision REV_OR_COMMIT
#                  [--include JSON --exclude JSON]
# With the model's include/exclude patterns (JSON lists), only the files they keep count.
# Fails when the snapshot is missing, empty, or has dangling links (the "0 weights" rsync trap).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/snapshot.sh"
parse_flags "$@"
require host cache-dir model revision
filter=()
if [ "${ARG_INCLUDE:-[]}" != "[]" ] || [ "${ARG_EXCLUDE:-[]}" != "[]" ]; then
  filter=("$SPARK_BIN/weights_filter.py" "${ARG_INCLUDE:-[]}" "${ARG_EXCLUDE:-[]}")
fi
manifest="$(snapshot_manifest "$ARG_CACHE_DIR" "$ARG_MODEL" "$ARG_REVISION" "${filter[@]}")" || {
  case "$manifest" in
    *"not a commit"*) fail "$manifest" "something other than the hub client wrote the refs file: remove it and run pulumi up again (the fetch resolves the revision anew)" ;;
    *dangling*) fail "$manifest" "an interrupted or symlink-unaware copy (blobs missing)" ;;
    *"is kept by"*) fail "$manifest" "the model's include/exclude leave none of its files" ;;
    *empty*) fail "$manifest" "an interrupted download or copy" ;;
    *) fail "$manifest" "the weights were never fetched or copied to this host" ;;
  esac
}
echo "$manifest"
