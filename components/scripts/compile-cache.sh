#!/usr/bin/env bash
# A node's compile caches (vLLM's torch.compile artifacts, FlashInfer's JIT kernels, Triton's,
# Inductor's and CUDA's), bound into its vLLM and Ray containers so a replaced server starts warm.
#   compile-cache.sh report --host H --dir D
#   compile-cache.sh remove --host H --dir D --image IMAGE_ID --keep yes|no
# The containers write it as their own user (root in vLLM's images), so `remove` empties it from
# a container of the serving image, as root, before removing the directory itself; an SSH user
# who is not root could not. The directory is this deployment's (the caller checks the leaf).
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host dir
case "$action" in
  report)
    [ -d "$ARG_DIR" ] || fail "$ARG_DIR is missing" "the stack's directory was removed: run 'pulumi up --refresh'"
    echo "compile cache: $(du -sh "$ARG_DIR" 2>/dev/null | cut -f1) in $ARG_DIR"
    ;;
  remove)
    require image keep
    [ -d "$ARG_DIR" ] || exit 0
    if [ "$ARG_KEEP" = yes ]; then
      echo "compile cache kept in $ARG_DIR (vllm.compileCache.keepOnDestroy)"
      exit 0
    fi
    if ! rm -rf "$ARG_DIR" 2>/dev/null; then
      # What is left is the containers' (root's): empty it from the serving image, never pulled.
      status=0
      why="$(timeout 240 docker run --rm --pull never --network none --user 0:0 \
        --entrypoint find -v "$ARG_DIR:/cache" "$ARG_IMAGE" /cache -mindepth 1 -delete 2>&1 >/dev/null)" \
        || status=$?
      if ! rm -rf "$ARG_DIR" 2>/dev/null; then
        case "$status" in
          124) why="emptying it from the serving image took over 240 s" ;;
          0) why="files the containers' user (root) left" ;;
          *) why="it holds files of the containers' user (root), and emptying it from the serving image $ARG_IMAGE failed: ${why:-exit $status}" ;;
        esac
        fail "could not remove $ARG_DIR: $why" \
          "remove it by hand as root (sudo rm -rf $ARG_DIR), then run the destroy again"
      fi
    fi
    echo "compile cache removed from $ARG_DIR"
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
