#!/usr/bin/env bash
# On the head, for one worker, before anything is copied over the fabric: both ends' MTU and
# negotiated speed, then (with --min-gbps above 0) the TCP throughput head -> worker measured for
# a few seconds (link_probe.py on both ends). Refuses a mismatched or unexpected MTU and a link
# below the floor, naming both hosts and the figures. Changes nothing.
#   fabric-link.sh --host HEAD --worker W --target ssh://USER@IP:PORT --interface IF
#                  --worker-interface IF --worker-ip IP --worker-bin DIR --mtu N|any
#                  --min-gbps F --seconds S [--fabric-key F --fabric-known-hosts F]
# Prints `spark-vllm-fabric-link {json}` as its last line.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host worker target interface worker-interface worker-ip worker-bin mtu min-gbps seconds

STREAMS=4
check_fabric_ssh "$ARG_TARGET"

# link_facts IF: "MTU SPEED" of an interface here (speed in Mb/s; -1 when the driver has none).
link_facts() {
  local speed
  speed="$(cat "/sys/class/net/$1/speed" 2>/dev/null || true)"
  printf '%s %s\n' "$(cat "/sys/class/net/$1/mtu")" "${speed:--1}"
}
read -r head_mtu head_speed < <(link_facts "$ARG_INTERFACE")
worker_if="/sys/class/net/$ARG_WORKER_INTERFACE"
worker_facts="$(fabric_ssh "$ARG_TARGET" \
  "$(words cat "$worker_if/mtu") && { $(words cat "$worker_if/speed") 2>/dev/null || echo -1; }" 2>&1)" \
  || fail "cannot read $ARG_WORKER's fabric interface $ARG_WORKER_INTERFACE: ${worker_facts//$'\n'/ }" \
    "hosts[].fabricInterface is wrong for $ARG_WORKER"
worker_mtu="$(sed -n 1p <<<"$worker_facts")"
worker_speed="$(sed -n 2p <<<"$worker_facts")"

if [ "$head_mtu" != "$worker_mtu" ]; then
  fail "the fabric's MTU differs between the ends: $ARG_HOST $ARG_INTERFACE has $head_mtu, $ARG_WORKER $ARG_WORKER_INTERFACE has $worker_mtu" \
    "an MTU mismatch (one end was changed or not persisted): set the same MTU on both ends (9000 for RoCE: ip link set dev IF mtu 9000, and in netplan)"
fi
if [ "$ARG_MTU" != any ] && [ "$head_mtu" != "$ARG_MTU" ]; then
  fail "the fabric's MTU is $head_mtu on $ARG_HOST $ARG_INTERFACE and $ARG_WORKER $ARG_WORKER_INTERFACE, fabric.mtu expects $ARG_MTU" \
    "the interfaces were not configured for jumbo frames, or fabric.mtu is wrong"
fi

speeds="negotiated speed: $ARG_HOST ${head_speed} Mb/s, $ARG_WORKER ${worker_speed} Mb/s"
gbps=null
# Whether to measure at all stays here: it is decided before python3 is known to be on the head,
# and without it the step must name that, not fail on a missing interpreter.
if awk -v f="$ARG_MIN_GBPS" 'BEGIN { exit !(f > 0) }'; then
  command -v python3 >/dev/null \
    || fail "python3 is not installed on the head; the link test needs it" \
      "install python3 (DGX OS has it), or set fabric.minLinkGbps: 0 to skip the test"
  receiver="$(words python3 "$ARG_WORKER_BIN/link_probe.py" receive --bind "$ARG_WORKER_IP" \
    --streams "$STREAMS" --timeout $((ARG_SECONDS + 30)))"
  coproc RECEIVER { fabric_ssh "$ARG_TARGET" "$receiver" 2>&1; }
  listening=""
  read -r -t 20 listening <&"${RECEIVER[0]}" || true
  if [[ "$listening" != "listening "* ]]; then
    kill "$RECEIVER_PID" 2>/dev/null || true
    fail "the link test's receiver did not start on $ARG_WORKER: ${listening:-no answer in 20 s}" \
      "python3 is missing on $ARG_WORKER (set fabric.minLinkGbps: 0 to skip the test), or its fabric IP is wrong"
  fi
  set +e
  sent="$(timeout $((ARG_SECONDS + 60)) python3 "$SPARK_BIN/link_probe.py" send \
    --to "$ARG_WORKER_IP:${listening#listening }" --streams "$STREAMS" --seconds "$ARG_SECONDS" 2>&1)"
  status=$?
  set -e
  wait "$RECEIVER_PID" 2>/dev/null || true
  result="$(sed -n 's/^link //p' <<<"$sent" | tail -n 1)"
  if [ "$status" -ne 0 ] || [ -z "$result" ]; then
    fail "the link test from $ARG_HOST to $ARG_WORKER ($ARG_WORKER_IP) failed: ${sent//$'\n'/ }" \
      "the fabric dropped the connection, or a firewall on $ARG_WORKER blocks the fabric"
  fi
  gbps="$(sed -n 's/.*"gbps": \([0-9.]*\).*/\1/p' <<<"$result")"
  verdict="$(python3 "$SPARK_BIN/link_probe.py" floor --gbps "$gbps" --min-gbps "$ARG_MIN_GBPS")"
  if [ "$verdict" = below ]; then
    fail "the fabric from $ARG_HOST to $ARG_WORKER measured $gbps Gbit/s ($STREAMS TCP streams, ${ARG_SECONDS} s), below fabric.minLinkGbps $ARG_MIN_GBPS ($speeds; MTU $head_mtu)" \
      "a degraded cable or port (a negotiated speed below the link's rating), an MTU mismatch along the path, the wrong interface (hosts[].fabricInterface/fabricIp on a slower NIC), or traffic shaping"
  fi
fi
printf 'spark-vllm-fabric-link {"worker":"%s","gbps":%s,"mtu":%s,"headSpeedMbps":%s,"workerSpeedMbps":%s}\n' \
  "$ARG_WORKER" "$gbps" "$head_mtu" "$head_speed" "$worker_speed"
