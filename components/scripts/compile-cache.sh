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
