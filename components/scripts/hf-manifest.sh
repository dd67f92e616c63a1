#!/usr/bin/env bash
# On any node: describe a model snapshot in the HF cache as "commit files bytes" (symlinks followed).
#   hf-manifest.sh --host H --cache-dir D --model ORG/NAME --revision REV_OR_COMMIT
# Fails when the snapshot is missing, empty, or has dangling links (the "0 weights" rsync trap).
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host cache-dir model revision
repo="$ARG_CACHE_DIR/hub/models--${ARG_MODEL//\//--}"
commit="$ARG_REVISION"
if ! [[ "$commit" =~ ^[0-9a-f]{40}$ ]]; then
  [ -f "$repo/refs/$ARG_REVISION" ] || fail "no snapshot of $ARG_MODEL@$ARG_REVISION under $ARG_CACHE_DIR" "the weights were never fetched or copied to this host"
  commit="$(cat "$repo/refs/$ARG_REVISION")"
fi
snapshot="$repo/snapshots/$commit"
[ -d "$snapshot" ] || fail "snapshot $commit of $ARG_MODEL is missing under $ARG_CACHE_DIR" "the weights were never fetched or copied to this host"
dangling="$(find "$snapshot" -xtype l | head -3 | paste -sd ' ' -)"
[ -z "$dangling" ] || fail "snapshot $commit of $ARG_MODEL has dangling links: $dangling" "an interrupted or symlink-unaware copy (blobs missing)"
read -r files bytes < <(find -L "$snapshot" -type f -printf '%s\n' | awk '{n++; b += $1} END {printf "%d %d\n", n, b}')
[ "$files" -gt 0 ] || fail "snapshot $commit of $ARG_MODEL is empty" "an interrupted download or copy"
echo "$commit $files $bytes"
