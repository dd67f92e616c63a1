#!/usr/bin/env bash
# On the head, once the image and the weights are on every node and before Ray or the server
# starts from them: the memory the server will find on each node (memory-probe.sh, run there
# over the fabric), against what vllm.gpuMemoryUtilization asks, or, with `auto`, the highest
# utilization every node can give less the safety margin. A server of this deployment that is
# running now gives back what it asked for (its own --gpu-memory-utilization) on the nodes it runs
# on (its launcher's --expect-ips) when it restarts.
#   memory-check.sh --host HEAD --nodes "name|dest|bin|containers|fabricip<newline>..." --image NAME --gpus yes|no
#                   --drop-page-cache yes|no --utilization F|auto --margin-fraction F
#                   --min-margin-bytes N --server-container NAME [--server-dest ssh://...]
#                   [--fabric-key F --fabric-known-hosts F]   (--server-dest: a server on a worker)
#                   [--kv-cache auto|BYTES --snapshot DIR --tensor-parallel N --pipeline-parallel N
#                    --max-model-len N --kv-cache-dtype D --reserve-bytes N [--block-size N]
#                    [--load-format F]
#                    [--include JSON] [--exclude JSON]]   (vllm.kvCache; the model's patterns)
# Beside other servers, the fleet's shares on the head (../front/shares from these scripts, a
# header then `servedName|container|dest|share|host,...` per server in the fleet's order): each
# server after this one that is not running yet keeps its share free on the nodes it shares with
# this one (a fixed fraction and what a server takes beside it); the later `auto` ones take at
# least their least share, and with `auto` split what is left with this one. A later server that
# runs already holds its memory (not counted twice): only a fraction raised since is kept free.
# Prints `spark-vllm-memory-sizing {json}` as its last line; with --kv-cache, its `kvCache` holds
# what kv_sizing.py derived from the fraction chosen here, on the node with the least memory.
# This script reads the facts (the servers' containers, each node's memory); every decision is
# memory_plan.py's, which says what it reads.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host nodes image gpus drop-page-cache utilization margin-fraction min-margin-bytes \
  server-container

# inspect_server NAME [DEST]: "running [args...]" when it runs, here or on its worker; one line.
inspect_server() {
  local call=(docker inspect --format '{{.State.Status}} {{json .Args}}' "$1") seen
  if [ -n "${2:-}" ] && [ "$2" != - ]; then
    # Bounded: fabric_ssh's connect timeout and keepalives, and the inspect's own timeout there.
    seen="$(fabric_ssh "$2" "timeout 60 $(words "${call[@]}")" 2>/dev/null || true)"
  else
    seen="$(timeout 60 "${call[@]}" 2>/dev/null || true)"
  fi
  printf '%s' "${seen%%$'\n'*}"
}

# plan COMMAND: memory_plan.py's answer (the facts on stdin); its refusal fails this step.
plan() {
  local out status=0 problem cause
  out="$(python3 "$SPARK_BIN/memory_plan.py" "$1" --nodes "$ARG_NODES" \
    --server-container "$ARG_SERVER_CONTAINER" --shares "$SPARK_BIN/../front/shares" \
    "${@:2}")" || status=$?
  if [ "$status" -ne 0 ]; then
    problem="$(sed -n 's/^problem: //p' <<<"$out")" cause="$(sed -n 's/^cause: //p' <<<"$out")"
    fail "${problem:-deciding the memory failed (exit $status): ${out//$'\n'/ }}" \
      "${cause:-the python3 on the head (3.8 or later is needed)}"
  fi
  printf '%s\n' "$out"
}

# Our server's state and arguments (here, or on its worker over the fabric), each later
# server's in the fleet's shares, then each node's memory.
facts="server $(inspect_server "$ARG_SERVER_CONTAINER" "${ARG_SERVER_DEST:-}")"$'\n'
later="$(plan later </dev/null)"
while IFS='|' read -r -u 3 container dest; do
  [ -n "$container" ] || continue
  facts+="later $container $(inspect_server "$container" "$dest")"$'\n'
done 3<<<"$later"

# One node a line (a state dir may hold a space); fd 3, since ssh reads stdin.
while IFS='|' read -r -u 3 node dest bin containers _; do
  [ -n "$node" ] || continue
  probe=(bash "$bin/memory-probe.sh" --host "$node" --image "$ARG_IMAGE" --gpus "$ARG_GPUS"
         --drop-page-cache "$ARG_DROP_PAGE_CACHE" --container-names "$containers")
  status=0
  if [ "$dest" = - ]; then
    out="$("${probe[@]}" 2>&1)" || status=$?
  else
    out="$(fabric_ssh "$dest" "$(words "${probe[@]}")" 2>&1)" || status=$?
  fi
  line="$(grep '^spark-vllm-memory ' <<<"$out" | tail -n 1 || true)"
  if [ "$status" -ne 0 ] || [ -z "$line" ]; then
    fail "measuring the memory on $node failed: ${out//$'\n'/ }" \
      "the node is unreachable over the fabric, or its Docker daemon does not answer"
  fi
  facts+="probe $node ${line#spark-vllm-memory }"$'\n'
done 3<<<"$ARG_NODES"

kv_flags=()
if [ -n "${ARG_KV_CACHE:-}" ]; then
  kv_flags=(--kv-cache "$ARG_KV_CACHE" --snapshot "$ARG_SNAPSHOT"
            --tensor-parallel "$ARG_TENSOR_PARALLEL" --pipeline-parallel "$ARG_PIPELINE_PARALLEL"
            --max-model-len "$ARG_MAX_MODEL_LEN" --kv-cache-dtype "$ARG_KV_CACHE_DTYPE"
            --reserve-bytes "$ARG_RESERVE_BYTES")
  [ -z "${ARG_BLOCK_SIZE:-}" ] || kv_flags+=(--block-size "$ARG_BLOCK_SIZE")
  [ -z "${ARG_LOAD_FORMAT:-}" ] || kv_flags+=(--load-format "$ARG_LOAD_FORMAT")
  [ -z "${ARG_INCLUDE:-}" ] || kv_flags+=(--include "$ARG_INCLUDE")
  [ -z "${ARG_EXCLUDE:-}" ] || kv_flags+=(--exclude "$ARG_EXCLUDE")
fi
step_seconds
plan decide --utilization "$ARG_UTILIZATION" --margin-fraction "$ARG_MARGIN_FRACTION" \
  --min-margin-bytes "$ARG_MIN_MARGIN_BYTES" "${kv_flags[@]}" <<<"$facts"
