#!/usr/bin/env bash
# On the head: wait, bounded, until every configured node has joined Ray with its fabric IP and
# all GPUs are declared. On timeout or a dead container: every node's last logs and likely causes.
#   ray-wait.sh --host H --container C --container-scripts DIR --expect-ips ip1,ip2 --gpus G
#               --timeout-seconds S
#               --nodes "name|dest|container name|dest|container ..." [--fabric-key ...]
. "$(dirname "$0")/lib.sh"
. "$SPARK_BIN/diagnose.sh"
parse_flags "$@"
require host container container-scripts expect-ips gpus timeout-seconds nodes
read -r -a node_specs <<<"$ARG_NODES"
deadline=$(( SECONDS + ARG_TIMEOUT_SECONDS ))
last=""
give_up() {
  report_nodes "${node_specs[@]}"
  fail "$1" "$2"
}
while :; do
  state="$(container_state "$ARG_CONTAINER")"
  [ "$state" = running ] || give_up "the Ray head container $ARG_CONTAINER is $state" \
    "Ray failed to start on the head (see its log above)"
  verdict="$(timeout 60 docker exec "$ARG_CONTAINER" python3 "$ARG_CONTAINER_SCRIPTS/ray_probe.py" \
    "$ARG_EXPECT_IPS" "$ARG_GPUS" 2>/dev/null | tail -n 1)" || verdict=""
  case "$verdict" in
    ready*) echo "ray: ${verdict#ready }"; exit 0 ;;
    stray*) give_up "a node joined Ray with a non-fabric IP ${verdict#stray } (expected only $ARG_EXPECT_IPS)" \
              "VLLM_HOST_IP/--node-ip-address resolved to another NIC on that node; check its hosts[].fabricIp" ;;
    leaving*) echo "ray: stopped Ray on hosts no longer in the stack: ${verdict#leaving }" ;;
    waiting*) last="$verdict" ;;
  esac
  if [ "$SECONDS" -ge "$deadline" ]; then
    give_up "Ray did not gather $ARG_GPUS GPU(s) on ${ARG_EXPECT_IPS} within ${ARG_TIMEOUT_SECONDS}s (last seen: ${last:-no answer from the head})" \
      "a worker cannot reach the head over the fabric, or its container is not running"
  fi
  sleep 3
done
