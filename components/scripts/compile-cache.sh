#!/usr/bin/env bash
# A node's compile caches (vLLM's torch.compile artifacts, FlashInfer's JIT kernels, Triton's,
# Inductor's and CUDA's), bound into its vLLM and Ray containers so a replaced server starts warm.
#   compile-cache.sh report --host H --dir D
#   compile-cache.sh remove --host H --dir D --ray-dir R --image IMAGE_ID --keep yes|no
# The containers write as their own user (root in vLLM's images): the cache, and Ray's session
# files in R. `remove` empties R (the scripts step removes the directory itself) and, unless
# kept, the cache: as this user where it can, else from a container of the serving image as
# root, which an SSH user who is not root needs. The directories are this deployment's (the
# caller checks the leaf's owner).
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host dir

# empty DIR: remove everything inside DIR, or fail naming what stopped it.
empty() {
  local dir=$1 status=0 why
  [ -d "$dir" ] || return 0
  # From /: GNU find fails when it cannot return to a working directory it may not enter.
  cd /
  find "$dir" -mindepth 1 -delete 2>/dev/null && return 0
  why="$(timeout 240 docker run --rm --pull never --network none --user 0:0 \
    --entrypoint find -v "$dir:/empty" "$ARG_IMAGE" /empty -mindepth 1 -delete 2>&1 >/dev/null)" \
    || status=$?
  find "$dir" -mindepth 1 -delete 2>/dev/null && return 0
  case "$status" in
    124) why="emptying it from the serving image took over 240 s" ;;
    0) why="files the containers' user (root) left" ;;
    *) why="it holds files of the containers' user (root), and emptying it from the serving image $ARG_IMAGE failed: ${why:-exit $status}" ;;
  esac
  fail "could not remove what is in $dir: $why" \
    "remove it by hand as root (sudo rm -rf $dir), then run the destroy again"
}

case "$action" in
  report)
    [ -d "$ARG_DIR" ] || fail "$ARG_DIR is missing" "the stack's directory was removed: run 'pulumi up --refresh'"
    echo "compile cache: $(du -sh "$ARG_DIR" 2>/dev/null | cut -f1) in $ARG_DIR"
    ;;
  remove)
    require ray-dir image keep
    empty "$ARG_RAY_DIR"
    [ -d "$ARG_DIR" ] || exit 0
    if [ "$ARG_KEEP" = yes ]; then
      echo "compile cache kept in $ARG_DIR (vllm.compileCache.keepOnDestroy)"
      exit 0
    fi
    empty "$ARG_DIR"
    rmdir "$ARG_DIR"
    echo "compile cache removed from $ARG_DIR"
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
