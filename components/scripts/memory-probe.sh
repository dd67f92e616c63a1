#!/usr/bin/env bash
# On one node, right before the server is sized: the memory it will find. With --gpus yes, what
# CUDA reports free (the image run once with the GPUs: cuda_free.py), otherwise the kernel's
# MemAvailable (page cache counted as reclaimable); with --drop-page-cache yes, the page cache is
# dropped first. Also what this deployment's own containers on the node hold (their cgroups),
# which a restart of the server gives back. Changes nothing but the page cache.
#   memory-probe.sh --host H --image NAME --gpus yes|no --drop-page-cache yes|no
#                   --container-names A,B
# Prints `spark-vllm-memory TOTAL FREE OWN BASIS MEMFREE MEMAVAILABLE` (bytes).
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host image gpus drop-page-cache container-names

if [ "$ARG_DROP_PAGE_CACHE" = yes ]; then
  sync
  if ! { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null \
     && ! echo 3 | sudo -n tee /proc/sys/vm/drop_caches >/dev/null 2>&1; then
    fail "cannot drop the page cache (preflight.dropPageCache)" \
      "user $(id -un) is not root and cannot run 'sudo -n tee /proc/sys/vm/drop_caches'; allow it, or set preflight.dropPageCache: false"
  fi
fi

MEMINFO="${SPARK_VLLM_MEMINFO:-/proc/meminfo}"  # the tests point it at a fixed one
meminfo() { awk -v key="$1:" '$1 == key { printf "%.0f", $2 * 1024 }' "$MEMINFO"; }
mem_total="$(meminfo MemTotal)"
mem_free="$(meminfo MemFree)"
mem_available="$(meminfo MemAvailable)"

total="$mem_total" free="$mem_available" basis=meminfo
if [ "$ARG_GPUS" = yes ]; then
  set +e
  cuda="$(timeout 180 docker run --rm --gpus all --network none \
    -v "$SPARK_BIN/cuda_free.py:/spark-vllm/cuda_free.py:ro" \
    --entrypoint python3 "$ARG_IMAGE" /spark-vllm/cuda_free.py 2>&1)"
  status=$?
  set -e
  line="$(grep '^cuda ' <<<"$cuda" | tail -n 1 || true)"
  if [ "$status" -ne 0 ] || [ -z "$line" ]; then
    fail "asking CUDA for the free memory failed (exit $status): $(tail -n 2 <<<"$cuda" | paste -sd ' ' -)" \
      "the image cannot use the GPU here (NVIDIA runtime, driver), or another process wedged the GPU"
  fi
  read -r _ free total <<<"$line"
  basis=cuda
fi

# What our own containers hold now (docker stats: "312.5MiB / 23.4GiB"): given back when the
# server restarts. GPU allocations may not be charged to a cgroup; memory-check.sh adds what a
# running server asked for.
own=0
for name in ${ARG_CONTAINER_NAMES//,/ }; do
  [ "$(container_state "$name")" = running ] || continue
  usage="$(timeout 30 docker stats --no-stream --format '{{.MemUsage}}' "$name" 2>/dev/null | awk '{print $1}')"
  own=$(( own + $(awk -v u="$usage" 'BEGIN {
    n = u + 0; unit = u; sub(/^[0-9.]+/, "", unit)
    m["B"] = 1; m["kB"] = 1e3; m["KiB"] = 1024; m["MB"] = 1e6; m["MiB"] = 1048576
    m["GB"] = 1e9; m["GiB"] = 1073741824; m["TB"] = 1e12; m["TiB"] = 1099511627776
    printf "%.0f", n * ((unit in m) ? m[unit] : 1) }') ))
done
printf 'spark-vllm-memory %s %s %s %s %s %s\n' "$total" "$free" "$own" "$basis" "$mem_free" "$mem_available"
