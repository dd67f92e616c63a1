#!/usr/bin/env bash
# On the head: check the pulled image is really there, record its ID for later steps, and give
# it the pinned name every container uses (stacks/plan/image.py PINNED_REPOSITORY).
#   image-record.sh record --host H --state-dir D --image-id sha256:... --ref REF --pinned NAME
#                          [--record-file NAME]   (in D; image-id, image.ref's, by default)
#   image-record.sh remove --host H --pinned NAME --keep yes|no
# `remove` (the step's delete) takes the pinned name off. With image.keepOnDestroy (`--keep
# yes`) it does so only while the image has another name: when the pinned name is its last,
# removing the name would remove the image the user asked to keep. Never while a container (of
# another stack on the host, which shares the name) uses the image.
. "$(dirname "$0")/lib.sh"
action="${1:-}"; shift || true
parse_flags "$@"
require host pinned
case "$action" in
  record)
    require state-dir image-id ref
    actual="$(docker image inspect --format '{{.Id}}' "$ARG_IMAGE_ID" 2>/dev/null)" \
      || fail "image $ARG_REF ($ARG_IMAGE_ID) is not on the head" "it was removed after the pull; run 'pulumi up --refresh'"
    docker tag "$ARG_IMAGE_ID" "$ARG_PINNED" \
      || fail "cannot name image $ARG_IMAGE_ID $ARG_PINNED on the head" "its Docker daemon refused the tag (docker info there)"
    mkdir -p -m 700 "$ARG_STATE_DIR"
    printf '%s\n' "$actual" > "$ARG_STATE_DIR/${ARG_RECORD_FILE:-image-id}"
    printf '%s\n' "$actual" ;;
  remove)
    require keep
    names="$(docker image inspect --format '{{len .RepoTags}}' "$ARG_PINNED" 2>/dev/null)" || exit 0
    # The pinned name is every stack's on this host (by content): another stack's containers
    # (this one's are gone by now) run by it, so it stays while any container uses the image.
    users="$(docker ps -aq --filter "ancestor=$ARG_PINNED" 2>/dev/null | wc -l)"
    if [ "$users" -gt 0 ]; then
      echo "the name $ARG_PINNED stays: $users container(s) of another deployment use it"
    elif [ "$ARG_KEEP" = no ] || [ "$names" -gt 1 ]; then
      docker image rm --no-prune "$ARG_PINNED" >/dev/null \
        || fail "cannot take the name $ARG_PINNED off the head's image" "a container still uses it (docker ps -a there)"
    fi ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
