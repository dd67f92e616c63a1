#!/usr/bin/env bash
# On every host, the firewall's step: wait until the guard container (firewall.sh) holds this
# node's rules, or take them down when the deployment leaves (the step's delete).
#   firewall-step.sh wait   --host H --container NAME --dir <state>/firewall --digest D --timeout-seconds S
#   firewall-step.sh remove --host H --container NAME --dir <state>/firewall --chain C --label L
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host container dir
boot_id="$(cat /proc/sys/kernel/random/boot_id)"
case "$action" in
  wait)
    require digest timeout-seconds
    deadline=$(( SECONDS + ARG_TIMEOUT_SECONDS ))
    while :; do
      if [ "$(cat "$ARG_DIR/applied" 2>/dev/null)" = "$boot_id $ARG_DIGEST" ]; then
        docker logs --tail 1 "$ARG_CONTAINER" 2>&1 | sed 's/^spark-vllm firewall: //'
        exit 0
      fi
      error="$(cat "$ARG_DIR/error" 2>/dev/null || true)"
      state="$(docker inspect -f '{{.State.Status}}' "$ARG_CONTAINER" 2>/dev/null || echo missing)"
      if [ -n "$error" ] || [ "$SECONDS" -ge "$deadline" ]; then
        note "the firewall container's last lines:"
        docker logs --tail 10 "$ARG_CONTAINER" 2>&1 | sed 's/^/  /' >&2 || true
        fail "the firewall rules are not in place after $(( ARG_TIMEOUT_SECONDS - (deadline - SECONDS) ))s (container $ARG_CONTAINER: $state): ${error:-no answer}" \
          "the host's iptables (install iptables), or Docker refusing CAP_NET_ADMIN; nothing that listens is started without the rules (fabric.firewall: false turns them off, README Security)"
      fi
      sleep 1
    done
    ;;
  remove)
    require chain label
    # A container still behind the gate (an opt-out replaced it, or it is another run's) keeps
    # the rules: they leave with it, or at the next reboot.
    running="$(docker ps -q --filter "label=$ARG_LABEL=$ARG_CHAIN" | wc -l)"
    if [ "$running" -gt 0 ]; then
      echo "firewall rules kept: $running running container(s) rely on them"
    elif docker exec -i "$ARG_CONTAINER" bash -s -- remove --chain "$ARG_CHAIN" --dir "/host$ARG_DIR" < "$SPARK_BIN/firewall.sh"; then
      echo "firewall rules removed"
    else
      note "the firewall container is not running: its rules stay until the next reboot"
    fi
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
