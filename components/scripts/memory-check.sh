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
#                    --max-model-len N --kv-cache-dtype D --reserve-bytes N]   (vllm.kvCache)
# Prints `spark-vllm-memory-sizing {json}` as its last line; with --kv-cache, its `kvCache` holds
# what kv_sizing.py derived from the fraction chosen here, on the node with the least memory.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host nodes image gpus drop-page-cache utilization margin-fraction min-margin-bytes \
  server-container

GIB=1073741824
running_utilization=0 running_ips=""
# The server's arguments when it runs: here, or on its worker (over the fabric).
server_inspect=(docker inspect --format '{{.State.Status}} {{json .Args}}' "$ARG_SERVER_CONTAINER")
if [ -n "${ARG_SERVER_DEST:-}" ]; then
  # Bounded: fabric_ssh's connect timeout and keepalives, and the inspect's own timeout there.
  server_seen="$(fabric_ssh "$ARG_SERVER_DEST" "timeout 60 $(words "${server_inspect[@]}")" 2>/dev/null || true)"
else
  server_seen="$(timeout 60 "${server_inspect[@]}" 2>/dev/null || true)"
fi
if [ "${server_seen%% *}" = running ]; then
  server_args="${server_seen#* }"
  # arg_after FLAG: the value after FLAG in the server's arguments (a JSON list of strings).
  arg_after() { grep -o "\"$1\",\"[^\"]*\"" <<<"$server_args" | head -n 1 | cut -d'"' -f4 || true; }
  running_utilization="$(arg_after --gpu-memory-utilization)"
  running_utilization="${running_utilization:-0}"
  running_ips=",$(arg_after --expect-ips),"
fi

rows="" auto="" problems=""
# One node a line (a state dir may hold a space); fd 3, since ssh reads stdin.
while IFS='|' read -r -u 3 node dest bin containers fabric_ip; do
  [ -n "$node" ] || continue
  given_back=0
  [[ "$running_ips" == *",$fabric_ip,"* ]] && given_back="$running_utilization"
  probe=(bash "$bin/memory-probe.sh" --host "$node" --image "$ARG_IMAGE" --gpus "$ARG_GPUS"
         --drop-page-cache "$ARG_DROP_PAGE_CACHE" --container-names "$containers")
  set +e
  if [ "$dest" = - ]; then
    out="$("${probe[@]}" 2>&1)"
  else
    out="$(fabric_ssh "$dest" "$(words "${probe[@]}")" 2>&1)"
  fi
  status=$?
  set -e
  line="$(grep '^spark-vllm-memory ' <<<"$out" | tail -n 1 || true)"
  if [ "$status" -ne 0 ] || [ -z "$line" ]; then
    fail "measuring the memory on $node failed: ${out//$'\n'/ }" \
      "the node is unreachable over the fabric, or its Docker daemon does not answer"
  fi
  read -r _ total free own basis mem_free mem_available <<<"$line"
  # name total visible fits auto basis (visible: what the server finds once ours is given back)
  row="$(awk -v n="$node" -v t="$total" -v f="$free" -v o="$own" -v r="$given_back" \
    -v mf="$ARG_MARGIN_FRACTION" -v mm="$ARG_MIN_MARGIN_BYTES" -v b="$basis" 'BEGIN {
      given = r * t; if (o > given) given = o
      v = f + given; if (v > t) v = t
      margin = mf * t; if (mm > margin) margin = mm
      fits = int(v / t * 100) / 100
      a = int((v - margin) / t * 100) / 100; if (a < 0) a = 0
      printf "%s %.0f %.0f %.2f %.2f %s %.0f\n", n, t, v, fits, a, b, margin }')"
  rows+="$row"$'\n'
  read -r _ _ _ _ node_auto _ _ <<<"$row"
  if [ -z "$auto" ] || awk -v a="$node_auto" -v m="$auto" 'BEGIN { exit !(a < m) }'; then
    auto="$node_auto"
  fi
  note "memory on $node: $(awk -v t="$total" -v f="$free" -v mf="$mem_free" -v ma="$mem_available" -v g="$GIB" -v b="$basis" \
    'BEGIN { printf "%.1f GiB free of %.1f GiB (%s; MemFree %.1f GiB, MemAvailable %.1f GiB)", f/g, t/g, b, mf/g, ma/g }')"
done 3<<<"$ARG_NODES"

kept=false
if [ "$ARG_UTILIZATION" = auto ]; then
  chosen="$auto"
  # A running server whose fraction still fits keeps it: a re-run of this check (a changed
  # connection, a new image) must not resize, and so replace, a server for a hundredth.
  if awk -v r="$running_utilization" -v a="$auto" 'BEGIN { exit !(r > 0 && r <= a) }'; then
    chosen="$running_utilization" kept=true
    note "memory: the running server's $running_utilization still fits every node (auto allows $auto): kept"
  fi
  if awk -v a="$auto" 'BEGIN { exit !(a < 0.05) }'; then
    problems="$(awk -v g="$GIB" '{ printf "%s: %.1f GiB free of %.1f GiB (margin %.1f GiB); ", $1, $3/g, $2/g, $7/g }' <<<"$rows")"
    fail "vllm.gpuMemoryUtilization auto: too little memory free for the server: ${problems%; }" \
      "other processes or containers hold the memory (an embeddings server, a stale vLLM?), or the page cache (set preflight.dropPageCache: true)"
  fi
else
  chosen="$ARG_UTILIZATION"
  while read -r node total visible fits node_auto basis _; do
    [ -n "$node" ] || continue
    if awk -v u="$chosen" -v t="$total" -v v="$visible" 'BEGIN { exit !(u * t > v) }'; then
      problems+="$(awk -v n="$node" -v u="$chosen" -v t="$total" -v v="$visible" -v g="$GIB" -v b="$basis" \
        'BEGIN { printf "%s: %.2f x %.1f GiB = %.1f GiB asked, %.1f GiB free (%s); ", n, u, t/g, u*t/g, v/g, b }')"
    fi
  done <<<"$rows"
  if [ -n "$problems" ]; then
    fits="$(awk 'NF && (!seen++ || $4 < m) { m = $4 } END { printf "%.2f", m }' <<<"$rows")"
    fail "vllm.gpuMemoryUtilization $chosen does not fit: ${problems%; }; the highest value that fits every node is $fits (auto would choose $auto, with its safety margin)" \
      "other processes or containers hold the memory, or the page cache (preflight.dropPageCache: true); lower vllm.gpuMemoryUtilization or set it to auto"
  fi
fi

kv_json=""
if [ -n "${ARG_KV_CACHE:-}" ]; then
  budget="$(awk -v u="$chosen" 'NF { b = u * $2; if (!n++ || b < m) m = b } END { printf "%.0f", m }' <<<"$rows")"
  set +e
  kv="$(python3 "$SPARK_BIN/kv_sizing.py" --snapshot "$ARG_SNAPSHOT" --budget-bytes "$budget" \
    --reserve-bytes "$ARG_RESERVE_BYTES" --kv-cache "$ARG_KV_CACHE" \
    --tensor-parallel "$ARG_TENSOR_PARALLEL" --pipeline-parallel "$ARG_PIPELINE_PARALLEL" \
    --max-model-len "$ARG_MAX_MODEL_LEN" --kv-cache-dtype "$ARG_KV_CACHE_DTYPE" 2>&1)"
  status=$?
  set -e
  if [ "$status" -ne 0 ]; then
    problem="$(sed -n 's/^problem: //p' <<<"$kv")" cause="$(sed -n 's/^cause: //p' <<<"$kv")"
    fail "${problem:-vllm.kvCache: sizing the KV cache failed (exit $status): ${kv//$'\n'/ }}" \
      "${cause:-the python3 on the head (3.8 or later is needed)}"
  fi
  kv_json="$(sed -n 's/^spark-vllm-kv //p' <<<"$kv")"
  note "$(sed -n 's/^note: //p' <<<"$kv")"
fi

nodes_json="$(awk -v g="$GIB" 'NF { printf "%s\"%s\":{\"totalGib\":%.1f,\"freeGib\":%.1f,\"fits\":%s,\"basis\":\"%s\"}", (n++ ? "," : ""), $1, $2/g, $3/g, $4, $6 }' <<<"$rows")"
printf 'spark-vllm-memory-sizing {"gpuMemoryUtilization":"%s","mode":"%s","kept":%s,"nodes":{%s}%s}\n' \
  "$chosen" "$([ "$ARG_UTILIZATION" = auto ] && echo auto || echo fixed)" "$kept" "$nodes_json" \
  "${kv_json:+,\"kvCache\":$kv_json}"
