#!/usr/bin/env bash
# On every host (opt-in, fabric.firewall): drop TCP to the cluster's ports (Ray's, or with executor mp
# the rendezvous and vLLM's message queues) arriving on any interface but
# loopback and the fabric. Ray listens on all interfaces and runs code for whoever reaches it.
#   firewall.sh apply|remove --host H --fabric-interface IF --tcp-ports "6379,6380,10002:10999"
# Idempotent: the rules live in one chain of their own, rebuilt on every apply.
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host fabric-interface tcp-ports
chain="SPARK-VLLM-RAY"
as_root=()
if [ "$(id -u)" != 0 ]; then as_root=(sudo -n); fi
ipt() { "${as_root[@]}" iptables -w 10 "$@"; }
command -v iptables >/dev/null || fail "iptables is not installed" "install iptables, or set fabric.firewall: false"
ipt -L INPUT -n >/dev/null 2>&1 \
  || fail "cannot change the firewall as $(id -un)" "run as root, or allow 'sudo -n iptables' for this user"
case "$action" in
  apply)
    ipt -N "$chain" 2>/dev/null || ipt -F "$chain"
    ipt -A "$chain" -i lo -j RETURN
    ipt -A "$chain" -i "$ARG_FABRIC_INTERFACE" -j RETURN
    # multiport takes at most 15 ports per rule (a range counts twice): one rule per port.
    for port in ${ARG_TCP_PORTS//,/ }; do
      ipt -A "$chain" -p tcp --dport "$port" -j DROP
    done
    ipt -C INPUT -j "$chain" 2>/dev/null || ipt -I INPUT -j "$chain"
    echo "cluster ports ${ARG_TCP_PORTS} accepted only on lo and $ARG_FABRIC_INTERFACE"
    ;;
  remove)
    while ipt -D INPUT -j "$chain" 2>/dev/null; do :; done
    ipt -F "$chain" 2>/dev/null || true
    ipt -X "$chain" 2>/dev/null || true
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
