#!/usr/bin/env bash
# On any node: describe a model snapshot in the HF cache as "commit files bytes" (symlinks followed).
#   hf-manifest.sh --host H --cache-dir D --model ORG/NAME --revision REV_OR_COMMIT
# Fails when the snapshot is missing, empty, or has dangling links (the "0 weights" rsync trap).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/snapshot.sh"
parse_flags "$@"
require host cache-dir model revision
manifest="$(snapshot_manifest "$ARG_CACHE_DIR" "$ARG_MODEL" "$ARG_REVISION")" || {
  case "$manifest" in
    *dangling*) fail "$manifest" "an interrupted or symlink-unaware copy (blobs missing)" ;;
    *empty*) fail "$manifest" "an interrupted download or copy" ;;
    *) fail "$manifest" "the weights were never fetched or copied to this host" ;;
  esac
}
echo "$manifest"
