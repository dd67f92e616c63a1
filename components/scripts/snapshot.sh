# Sourced by hf-manifest.sh, and sent ahead of facts.sh: how a model snapshot in the HF cache is
# described ("commit files bytes", symlinks followed), in one place.

# snapshot_manifest CACHE_DIR MODEL REVISION_OR_COMMIT: print the manifest; on failure print why
# (to stdout) and return 1. Missing, empty and dangling-link snapshots fail (the "0 weights" trap).
snapshot_manifest() {
  local repo="$1/hub/models--${2//\//--}" commit="$3" snapshot dangling files bytes
  if ! [[ "$commit" =~ ^[0-9a-f]{40}$ ]]; then
    [ -f "$repo/refs/$3" ] || { echo "no snapshot of $2@$3 under $1"; return 1; }
    commit="$(cat "$repo/refs/$3")"
  fi
  snapshot="$repo/snapshots/$commit"
  [ -d "$snapshot" ] || { echo "snapshot $commit of $2 is missing under $1"; return 1; }
  dangling="$(find "$snapshot" -xtype l | head -3 | paste -sd ' ' -)"
  [ -z "$dangling" ] || { echo "snapshot $commit of $2 has dangling links: $dangling"; return 1; }
  read -r files bytes < <(find -L "$snapshot" -type f -printf '%s\n' | awk '{n++; b += $1} END {printf "%d %d\n", n, b}')
  [ "$files" -gt 0 ] || { echo "snapshot $commit of $2 is empty"; return 1; }
  echo "$commit $files $bytes"
}
