#!/usr/bin/env bash
# On a worker: how many bytes it holds of each named blob of a model in its HF cache (0 when
# absent), so the head sends only what is missing. Names on stdin, one per line.
#   hf-blob-sizes.sh --host H --cache-dir D --model ORG/NAME
# Prints `NAME SIZE` per name. Reads only.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host cache-dir model
blobs="$ARG_CACHE_DIR/hub/models--${ARG_MODEL//\//--}/blobs"
while read -r name; do
  [[ "$name" =~ ^[0-9a-f]{40,64}$ ]] || fail "'$name' is not a blob name" "a bug in spark-vllm: please report it"
  printf '%s %s\n' "$name" "$(stat -c %s "$blobs/$name" 2>/dev/null || echo 0)"
done
