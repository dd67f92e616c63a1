#!/usr/bin/env bash
# On a worker: load the image stream the head sends on stdin (copy_image.py), then give the
# image the pinned name every container uses (stacks/plan/image.py PINNED_REPOSITORY).
#   image-load.sh STAGE_NAME PINNED zstd|plain
#   image-load.sh stop STAGE_NAME   (what an earlier or stalled load of STAGE_NAME left running)
# What arrives is staged beside this script's directory, in image-stage/STAGE_NAME
# (image_stage.py receive), so a copy cut midway resumes; the stage goes once the load
# succeeded. The process group is recorded in image-stage/STAGE_NAME.pid first, so the head can
# stop a stalled load (`stop`, which copy_image.py runs).
set -euo pipefail
bin="$(cd "$(dirname "$0")" && pwd)"
# started PID: when the process began (clock ticks since boot, /proc/PID/stat's 22nd field,
# read after the name, which may hold spaces): with the PID, it names one process for good.
started() {
  local stat fields
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  read -r -a fields <<<"${stat##*) }"
  echo "${fields[19]}"
}
if [ "$1" = stop ]; then
  # Only a load of ours: the group's leader must be the process the pidfile names, started when
  # it says (a PID reused since, even by another load, is left be).
  pidfile="$(dirname "$bin")/image-stage/$2.pid"
  read -r group since <"$pidfile" 2>/dev/null || true
  case "${group:-}" in
    "" | *[!0-9]*) ;;
    *) if [ -n "${since:-}" ] && [ "$(started "$group")" = "$since" ] \
          && grep -qs image-load "/proc/$group/cmdline"; then
         kill -KILL -- "-$group" || true
       fi ;;
  esac
  rm -f "$pidfile"
  exit 0
fi
stage="$(dirname "$bin")/image-stage/$1"
pinned=$2
mkdir -p "$stage"
read -r _ _ _ _ group _ </proc/$$/stat
echo "$group $(started "$group")" >"$stage.pid"
decompress=(cat)
[ "$3" != zstd ] || decompress=(zstd -d -q)
loaded="$("${decompress[@]}" | python3 "$bin/image_stage.py" receive "$stage" | docker load)"
printf '%s\n' "$loaded"
# `Loaded image: NAME` for a stream saved by name, `Loaded image ID: ID` for one saved by ID.
image="$(sed -n 's/^Loaded image\( ID\)\{0,1\}: //p' <<<"$loaded" | tail -n 1)"
[ -n "$image" ] || { echo "docker load named no image" >&2; exit 1; }
docker tag "$image" "$pinned"
rm -rf "$stage" "$stage.pid"
