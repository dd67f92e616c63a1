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
# Beside other servers, the fleet's shares on the head (../front/shares from these scripts, a
# header then `servedName|container|dest|share|host,...` per server in the fleet's order): each
# server after this one that is not running yet keeps its share free on the nodes it shares with
# this one (a fixed fraction and what a server takes beside it); the later `auto` ones take at
# least their least share, and with `auto` split what is left with this one. A later server that
# runs already holds its memory (not counted twice): only a fraction raised since is kept free.
# Prints `spark-vllm-memory-sizing {json}` as its last line; with --kv-cache, its `kvCache` holds
# what kv_sizing.py derived from the fraction chosen here, on the node with the least memory.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host nodes image gpus drop-page-cache utilization margin-fraction min-margin-bytes \
  server-container

GIB=1073741824
running_utilization=0 running_ips=""
# inspect_server NAME [DEST]: "running [args...]" when it runs, here or on its worker.
inspect_server() {
  local call=(docker inspect --format '{{.State.Status}} {{json .Args}}' "$1")
  if [ -n "${2:-}" ] && [ "$2" != - ]; then
    # Bounded: fabric_ssh's connect timeout and keepalives, and the inspect's own timeout there.
    fabric_ssh "$2" "timeout 60 $(words "${call[@]}")" 2>/dev/null || true
  else
    timeout 60 "${call[@]}" 2>/dev/null || true
  fi
}

# arg_of ARGS FLAG: the value after FLAG in a server's arguments (a JSON list of strings).
arg_of() { grep -o "\"$2\",\"[^\"]*\"" <<<"$1" | head -n 1 | cut -d'"' -f4 || true; }

# The server's arguments when it runs: here, or on its worker (over the fabric).
server_seen="$(inspect_server "$ARG_SERVER_CONTAINER" "${ARG_SERVER_DEST:-}")"
if [ "${server_seen%% *}" = running ]; then
  running_utilization="$(arg_of "${server_seen#* }" --gpu-memory-utilization)"
  running_utilization="${running_utilization:-0}"
  running_ips=",$(arg_of "${server_seen#* }" --expect-ips),"
fi

SHARES_FILE="$SPARK_BIN/../front/shares"
overhead_fraction=0 min_auto_fraction=0
# later_servers: the shares' lines after this server's own, each with only the nodes it shares
# with this check (none when the shares do not list this server).
later_servers() {
  local mine="" found=false name container dest share hosts shared host
  while IFS='|' read -r node _; do mine+=",$node"; done <<<"$ARG_NODES"
  while IFS='|' read -r name container dest share hosts; do
    if [ "$container" = "$ARG_SERVER_CONTAINER" ]; then found=true; continue; fi
    if ! "$found" || [ -z "$hosts" ]; then continue; fi
    shared=""
    for host in ${hosts//,/ }; do [[ "$mine," == *",$host,"* ]] && shared+="${shared:+,}$host"; done
    [ -z "$shared" ] || printf '%s|%s|%s|%s|%s\n' "$name" "$container" "$dest" "$share" "$shared"
  done < <(tail -n +2 "$SHARES_FILE")
}
later=""
if [ -r "$SHARES_FILE" ]; then
  read -r header overhead_fraction min_auto_fraction < "$SHARES_FILE"
  [ "$header" = spark-vllm-shares ] || fail "the fleet's memory shares ($SHARES_FILE) are not ours" \
    "the file was changed by hand; run pulumi up again"
  later="$(later_servers)"
fi

# What the later servers keep free on each node: a fraction of its total, how many `auto` ones
# will share with this server, and who (for the messages).
declare -A kept_fraction=() later_autos=() kept_for=()
while IFS='|' read -r -u 3 later_name later_container later_dest later_share later_nodes; do
  [ -n "$later_name" ] || continue
  seen="$(inspect_server "$later_container" "$later_dest")"
  if [ "${seen%% *}" = running ]; then
    # It holds its memory already; a fixed fraction raised since needs the difference.
    later_running="$(arg_of "${seen#* }" --gpu-memory-utilization)"
    fraction="$(awk -v s="$later_share" -v r="${later_running:-0}" 'BEGIN {
      d = (s == "auto") ? 0 : s - r; printf "%.4f", (d > 0) ? d : 0 }')"
    how="running at ${later_running:-?}"
  else
    fraction="$(awk -v s="$later_share" -v o="$overhead_fraction" 'BEGIN {
      printf "%.4f", ((s == "auto") ? 0 : s) + o }')"
    how="not running yet"
  fi
  for node in ${later_nodes//,/ }; do
    kept_fraction[$node]="$(awk -v a="${kept_fraction[$node]:-0}" -v b="$fraction" 'BEGIN { printf "%.4f", a + b }')"
    if [ "$later_share" = auto ] && [ "$how" = "not running yet" ]; then
      later_autos[$node]=$(( ${later_autos[$node]:-0} + 1 ))
    fi
    kept_for[$node]+="${kept_for[$node]:+, }$later_name ($later_share, $how)"
  done
  note "memory: $later_name ($later_share) comes after this server on ${later_nodes//,/, }: $how"
done 3<<<"$later"

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
  # name total visible fits auto basis margin reserved (bytes left to the later servers; the
  # later `auto` ones take their least share in `fits`, and split with this one in `auto`)
  row="$(awk -v n="$node" -v t="$total" -v f="$free" -v o="$own" -v r="$given_back" \
    -v mf="$ARG_MARGIN_FRACTION" -v mm="$ARG_MIN_MARGIN_BYTES" -v b="$basis" \
    -v kf="${kept_fraction[$node]:-0}" -v k="${later_autos[$node]:-0}" \
    -v ma="$min_auto_fraction" 'BEGIN {
      given = r * t; if (o > given) given = o
      v = f + given; if (v > t) v = t
      margin = mf * t; if (mm > margin) margin = mm
      kept = kf * t
      fits = int((v - kept - k * ma * t) / t * 100) / 100; if (fits < 0) fits = 0
      a = int((v - margin - kept) / (1 + k) / t * 100) / 100; if (a < 0) a = 0
      printf "%s %.0f %.0f %.2f %.2f %s %.0f %.0f\n", n, t, v, fits, a, b, margin, kept + k * ma * t }')"
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
    problems=""
    while read -r node total visible _ _ _ margin reserved; do
      [ -n "$node" ] || continue
      problems+="$(awk -v n="$node" -v t="$total" -v v="$visible" -v m="$margin" -v g="$GIB" \
        'BEGIN { printf "%s: %.1f GiB free of %.1f GiB (margin %.1f GiB", n, v/g, t/g, m/g }')"
      [ -z "${kept_for[$node]:-}" ] || problems+="$(awk -v k="$reserved" -v g="$GIB" 'BEGIN { printf ", %.1f GiB", k/g }') kept for ${kept_for[$node]}"
      problems+="); "
    done <<<"$rows"
    fail "vllm.gpuMemoryUtilization auto: too little memory free for the server: ${problems%; }" \
      "other processes or containers hold the memory (an embeddings server, a stale vLLM?), or the page cache (set preflight.dropPageCache: true)"
  fi
else
  chosen="$ARG_UTILIZATION"
  while read -r node total visible fits node_auto basis _ reserved; do
    [ -n "$node" ] || continue
    if awk -v u="$chosen" -v t="$total" -v v="$visible" -v k="$reserved" 'BEGIN { exit !(u * t + k > v) }'; then
      problems+="$(awk -v n="$node" -v u="$chosen" -v t="$total" -v v="$visible" -v g="$GIB" -v b="$basis" \
        'BEGIN { printf "%s: %.2f x %.1f GiB = %.1f GiB asked, %.1f GiB free (%s)", n, u, t/g, u*t/g, v/g, b }')"
      [ -z "${kept_for[$node]:-}" ] || problems+="$(awk -v k="$reserved" -v g="$GIB" 'BEGIN { printf ", %.1f GiB", k/g }') kept for ${kept_for[$node]}"
      problems+="; "
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
