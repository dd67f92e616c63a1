#!/usr/bin/env bash
# On the head: check the pulled image is really there and record its ID for later steps.
#   image-record.sh --host H --state-dir D --image-id sha256:... --ref REF
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host state-dir image-id ref
actual="$(docker image inspect --format '{{.Id}}' "$ARG_IMAGE_ID" 2>/dev/null)" \
  || fail "image $ARG_REF ($ARG_IMAGE_ID) is not on the head" "it was removed after the pull; run 'pulumi up --refresh'"
mkdir -p -m 700 "$ARG_STATE_DIR"
printf '%s\n' "$actual" > "$ARG_STATE_DIR/image-id"
printf '%s\n' "$actual"
