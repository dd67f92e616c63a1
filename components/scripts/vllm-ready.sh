#!/usr/bin/env bash
# On the head: wait, bounded, until vLLM lists the served model and completes a real request.
#   vllm-ready.sh --host H --container C --container-scripts DIR --port P [--probe-host IP]
#                 --served-name N
#                 --timeout-seconds S --progress-seconds S --measure-completions N
#                 --expect-transport ib|none --executor ray|mp [--rendezvous IP:PORT]
#                 --nodes "name|dest|container ..." [--fabric-key ...] [--guard-container G]
#                 [--server-address A --server-port P]                    (API key on stdin)
# Every --progress-seconds it reports on stderr (streamed into the `pulumi up` output): the time
# waited, the probe's state and the server's latest progress line from its log.
. "$(dirname "$0")/lib.sh"
. "$SPARK_BIN/diagnose.sh"
parse_flags "$@"
require host container container-scripts port served-name timeout-seconds progress-seconds \
  measure-completions expect-transport executor nodes
read -r -a node_specs <<<"$ARG_NODES"
IFS= read -r api_key || true
deadline=$(( SECONDS + ARG_TIMEOUT_SECONDS ))
started=$SECONDS
last="no answer yet"
give_up() {
  report_nodes "${node_specs[@]}"
  fail "$1" "$(likely_cause "$2")"
}
# likely_cause DEFAULT: with executor mp, the head's launcher names the node that did not join
# the rendezvous or left it (mp_supervisor.py); that beats any general cause.
likely_cause() {
  local said=""
  if [ "$ARG_EXECUTOR" = mp ]; then
    said="$(docker logs --tail 400 "$ARG_CONTAINER" 2>&1 \
      | grep -E '^spark-vllm launcher: .*(did not join|left the rendezvous)' | tail -n 1 || true)"
  fi
  printf '%s' "${said:+${said#spark-vllm launcher: }; }$1"
}
# What vLLM logs while it loads (tqdm bars end in carriage returns), newest last. The server's
# start line: vLLM 0.32's "Starting vLLM server on", older releases' "Starting vLLM API server".
PROGRESS='to join the rendezvous|remote node\(s\) to join|checkpoint shards|Loading weights|Model loading took|Memory profiling|KV cache|CUDA graph|Graph capturing|init engine|Starting vLLM server on|Starting vLLM API server|Application startup complete'
server_progress() {
  local lines
  lines="$(docker logs --tail 400 "$ARG_CONTAINER" 2>&1 | tr '\r' '\n' | grep -v '^[[:space:]]*$' || true)"
  { grep -E "$PROGRESS" <<<"$lines" || tail -n 1 <<<"$lines"; } | tail -n 1 | cut -c1-200
}
# guarded: when a node's memory guard stopped one of this server's containers, that is the
# failure (the host was about to run out of memory), named with the guard's figures.
guarded() {
  local spec said
  for spec in "${node_specs[@]}"; do
    said="$(guard_stopped "$spec")"
    [ -n "$said" ] || continue
    report_nodes "${node_specs[@]}"
    fail "$(head -n 1 <<<"$said" | sed 's/^spark-vllm: //')" \
      "$(sed -n 's/^  likely cause: //p' <<<"$said" | head -n 1)"
  done
}
# The cold start, timed from the container's start (Docker's StartedAt): how long Docker took to
# start it, then its own port open (--server-port), /health answering (the probe gets past it),
# the first completion. Not measured when the server was ready at the first probe (a wait run
# again on a server that serves): `spark-vllm-start {json}`, stacks/plan/cold_start.py.
epoch() { date -d "$1" +%s.%N 2>/dev/null || true; }
read -r created started_at <<<"$(docker inspect --format '{{.Created}} {{.State.StartedAt}}' "$ARG_CONTAINER" 2>/dev/null || echo "- -")"
start_epoch="$(epoch "$started_at")"
healthy="" first_probe=1 warm=0
after_start() { awk -v a="$1" -v b="$start_epoch" 'BEGIN { printf "%.1f", a - b }'; }
start_figures() {
  if [ -z "$start_epoch" ] || [ "$warm" = 1 ]; then
    printf '\nspark-vllm-start {"measured":false}'
    return 0
  fi
  local port_open
  port_open="$(cat "$port_file" 2>/dev/null || true)"
  printf '\nspark-vllm-start {"measured":true,"containerStartSeconds":%s,"portOpenSeconds":%s,"healthSeconds":%s,"firstTokenSeconds":%s}' \
    "$(awk -v a="$start_epoch" -v b="$(epoch "$created")" 'BEGIN { printf "%.1f", a - b }')" \
    "$(if [ -n "$port_open" ]; then after_start "$port_open"; else echo null; fi)" \
    "$(after_start "${healthy:-$first_token}")" "$(after_start "$first_token")"
}
port_answers() {
  timeout 2 bash -c "exec 3<>/dev/tcp/$ARG_SERVER_ADDRESS/$ARG_SERVER_PORT" 2>/dev/null
}
# The port is watched apart, four times a second, not once per probe (every 2 s): a server
# that binds and answers within one probe's interval still shows when its port opened.
port_file="$(mktemp)"
port_watcher=""
if [ -n "${ARG_SERVER_PORT:-}" ]; then
  ( until port_answers; do
      [ "$SECONDS" -lt "$deadline" ] || exit 0
      sleep 0.25
    done
    printf '%s' "$EPOCHREALTIME" >"$port_file" ) &
  port_watcher=$!
fi
# (`|| true`: under errexit a failed kill of a watcher that already ended would fail the step.)
trap '[ -z "$port_watcher" ] || kill "$port_watcher" 2>/dev/null || true; rm -f "$port_file"' EXIT
reported=$SECONDS
guard_checked=$SECONDS
probe() {
  printf '%s\n' "$api_key" | timeout 150 docker exec -i "$ARG_CONTAINER" \
    python3 "$ARG_CONTAINER_SCRIPTS/vllm_probe.py" "$ARG_PORT" "$ARG_SERVED_NAME" \
    "${ARG_PROBE_HOST:-127.0.0.1}" "$@" 2>&1 | tail -n 1
}
# probe_watched: the probe, stopped as soon as the container restarts or stops under it: a
# `docker exec` into a container that dies meanwhile can hang until its timeout (150 s), which
# held the report of a server that exits at once for minutes (seen in the lab once the Docker
# provider's create, faithfully modelled, no longer failed first).
probe_watched() {
  local out pid
  out="$(mktemp)"
  probe >"$out" 2>/dev/null &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ "$(docker inspect --format '{{.RestartCount}} {{.State.Status}}' "$ARG_CONTAINER" 2>/dev/null)" != "0 running" ]; then
      pkill -TERM -P "$pid" 2>/dev/null || true
      break
    fi
  done
  wait "$pid" 2>/dev/null || true
  cat "$out"
  rm -f "$out"
}
# speed: "; speed: ..." from a few streamed completions once ready (vllm.measureCompletions).
speed() {
  [ "$ARG_MEASURE_COMPLETIONS" -gt 0 ] || return 0
  local result word ttft rate runs tokens version
  result="$(probe measure "$ARG_MEASURE_COMPLETIONS")" || true
  read -r word ttft rate runs tokens version <<<"$result" || true
  if [ "${word:-}" != speed ]; then
    printf '; speed: not measured (%s)' "${result:0:160}"
    return 0
  fi
  printf '; speed: time to first token %s s, decode %s tokens/s (median of %s streamed completions of %s tokens; server version %s)' \
    "$ttft" "$rate" "$runs" "$tokens" "$version"
}
# fabric_transport: a second line, which network NCCL chose (nccl_transport.py on the server's
# log, where Ray forwards every rank's lines); a loud warning when RDMA was expected but not used.
fabric_transport() {
  if [ "$ARG_EXPECT_TRANSPORT" != ib ]; then
    printf '\nfabric transport: not checked (no hosts[].rdmaHcas)'
    return 0
  fi
  local found
  found="$(timeout 60 docker logs "$ARG_CONTAINER" 2>&1 | timeout 60 docker exec -i "$ARG_CONTAINER" \
    python3 "$ARG_CONTAINER_SCRIPTS/nccl_transport.py" 2>&1 | tail -n 1)" || true
  case "$found" in
    ib*) ;;
    *) note "spark-vllm: $ARG_HOST: vllm-ready: WARNING: NCCL is not using RDMA between the nodes (it chose: ${found:-nothing readable}); tensor-parallel decode is then several times slower"
       note "  likely cause: NCCL_IB_HCA names no active HCA port (check hosts[].rdmaHcas with ibv_devinfo), the RoCE link is down, or the image's NCCL lacks IB support" ;;
  esac
  printf '\nfabric transport: %s' "${found:-unknown}"
}
while :; do
  state="$(container_state "$ARG_CONTAINER")"
  restarts="$(docker inspect --format '{{.RestartCount}}' "$ARG_CONTAINER" 2>/dev/null || echo 0)"
  # A stopped server, and every 10 s (a worker's rank stopped leaves the head's running a while).
  if [ -n "${ARG_GUARD_CONTAINER:-}" ] && { [ "$state" != running ] || [ $(( SECONDS - guard_checked )) -ge 10 ]; }; then
    guard_checked=$SECONDS
    guarded
  fi
  [ "$state" = running ] || [ "$state" = restarting ] || give_up \
    "the vLLM container $ARG_CONTAINER is $state after $(( SECONDS - started ))s ($restarts restarts; last probe: $last)" \
    "vLLM exited during start-up; its log above shows why"
  # A new container that restarted has crashed: Docker would retry it forever (with backoff).
  [ "$restarts" = 0 ] || give_up \
    "vLLM exited during start-up and Docker restarted it $restarts time(s) (last probe: $last)" \
    "vLLM refused its arguments or failed to load the model; its log above shows the first error"
  line="$(probe_watched)" || true
  case "$line" in
    ready*|waiting*) [ -n "$healthy" ] || healthy="$EPOCHREALTIME" ;;
  esac
  case "$line" in
    ready*)
      first_token="$EPOCHREALTIME"
      [ "$first_probe" = 0 ] || warm=1
      echo "vllm: ready after $(( SECONDS - started ))s; first completion: ${line#ready }$(speed)$(fabric_transport)$(start_figures)"
      exit 0 ;;
    unauthorized*) give_up "vLLM rejects the configured API key (${line#unauthorized })" \
                     "the container was started with another key; run 'pulumi up' again to replace it" ;;
    "") ;;
    *) last="$line" ;;
  esac
  first_probe=0
  if [ $(( SECONDS - reported )) -ge "$ARG_PROGRESS_SECONDS" ]; then
    reported=$SECONDS
    note "vllm: waiting $(( SECONDS - started ))s of ${ARG_TIMEOUT_SECONDS}s; probe: $last; server log: $(server_progress)"
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    give_up "vLLM was not ready within ${ARG_TIMEOUT_SECONDS}s (last probe: $last)" \
      "the engine is still loading (raise timeouts.vllmReadySeconds) or is hung (see the logs above)"
  fi
  sleep 2  # a probe is one docker exec and one request: a server that is up is seen within 2 s
done
