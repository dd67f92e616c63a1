# Sourced by hf-manifest.sh and receipt.sh, and sent ahead of facts.sh: how a model snapshot in
# the HF cache is described ("commit files bytes", symlinks followed), in one place.

# snapshot_manifest CACHE_DIR MODEL REVISION_OR_COMMIT [FILTER_PY INCLUDE EXCLUDE]: print the
# manifest; on failure print why (to stdout) and return 1. Missing, empty and dangling-link
# snapshots fail (the "0 weights" trap), and so does a refs file that holds no commit. With the model's include/exclude patterns (JSON lists),
# only the files they keep count, matched by FILTER_PY (weights_filter.py, the host's python3)
# as the hub client's fetch matched them: a fuller snapshot fetched earlier describes the same.
snapshot_manifest() {
  local repo="$1/hub/models--${2//\//--}" commit="$3" snapshot dangling files bytes
  if ! [[ "$commit" =~ ^[0-9a-f]{40}$ ]]; then
    [ -f "$repo/refs/$3" ] || { echo "no snapshot of $2@$3 under $1"; return 1; }
    commit="$(head -c 200 "$repo/refs/$3")"
    # The hub client writes a commit there; anything else (`../../x`) would name another path.
    [[ "$commit" =~ ^[0-9a-f]{40}$ ]] || {
      commit="${commit:0:60}"; echo "$repo/refs/$3 holds '${commit//[^[:graph:] ]/?}', not a commit"
      return 1; }
  fi
  snapshot="$repo/snapshots/$commit"
  [ -d "$snapshot" ] || { echo "snapshot $commit of $2 is missing under $1"; return 1; }
  dangling="$(find "$snapshot" -xtype l | head -3 | paste -sd ' ' -)"
  [ -z "$dangling" ] || { echo "snapshot $commit of $2 has dangling links: $dangling"; return 1; }
  if [ -n "${4:-}" ]; then
    read -r files bytes < <(find -L "$snapshot" -type f -printf '%s %P\0' | python3 "$4" count "$5" "$6")
    [ "${files:-0}" -gt 0 ] \
      || { echo "no file of snapshot $commit of $2 is kept by include $5 exclude $6"; return 1; }
  else
    read -r files bytes < <(find -L "$snapshot" -type f -printf '%s\n' | awk '{n++; b += $1} END {printf "%d %d\n", n, b}')
  fi
  [ "${files:-0}" -gt 0 ] || { echo "snapshot $commit of $2 is empty"; return 1; }
  echo "$commit $files $bytes"
}
