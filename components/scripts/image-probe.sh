#!/usr/bin/env bash
# On a worker: what the head's image copy needs to know of it, in one answer (copy_image.py
# parse_image_probe reads it; every Docker question bounded, a wedged daemon answers nothing):
#   image-probe.sh PINNED STAGE_NAME SECONDS
# Sections, each after a `== NAME` line: `pinned` (docker image inspect PINNED, empty when it is
# not here), `staged` (`NAME SIZE` of each member a cut copy staged in image-stage/STAGE_NAME),
# `zstd` (yes|no: it can unpack a zstd stream), `layers` (each image's layers, a JSON list a
# line), then `end` (the answer is whole); a blank line before each header, whatever the
# answer before it ended with. Reads only.
set -uo pipefail
pinned=$1 stage="$(dirname "$(cd "$(dirname "$0")" && pwd)")/image-stage/$2" seconds=$3
echo "== pinned"
timeout "$seconds" docker image inspect "$pinned" 2>/dev/null
printf '\n== staged\n'
find "$stage" -type f -size +0 -printf '%P %s\n' 2>/dev/null
printf '\n== zstd\n'
if command -v zstd >/dev/null; then echo yes; else echo no; fi
printf '\n== layers\n'
timeout "$seconds" docker image ls -q --no-trunc | sort -u \
  | xargs -r timeout "$seconds" docker image inspect --format '{{json .RootFS.Layers}}' 2>/dev/null
printf '\n== end\n'
