#!/usr/bin/env bash
# The firewall guard: the entrypoint of `<prefix>-firewall` on every host (bash -c, self-contained).
# It runs the host's own iptables and ip6tables (through a read-only view of the host's root, with
# CAP_NET_ADMIN in the host's network namespace: no root login or sudo needed) and keeps one chain
# that drops the cluster's TCP ports on every interface but loopback and the fabric.
#   firewall.sh guard  --chain C --fabric-interface IF --tcp-ports 6379,10002:10999 --digest D \
#                      [--markers applied-s1=D1,...] --root /host --dir /host<state>/firewall --interval S
#   firewall.sh remove --chain C --root /host --dir /host<state>/firewall   (docker exec, at delete)
#   firewall.sh remove --host H --fabric-interface IF --tcp-ports P   (on the host: the delete an
#     older release stored for its firewall step, which took its chain down as root or sudo -n)
# While the rules hold, <dir>/applied holds `<boot id> <digest>`, refreshed every interval: the
# Ray and vLLM containers' gate (firewall-gate.sh) starts nothing until it finds it. With several
# servers each one's gate reads its own marker (--markers: name=digest of the ports it needs),
# so a server added later changes these rules, never a running server's gate. Docker starts
# this container again at boot (restart: always), so a reboot puts the rules back by itself.
set -uo pipefail
action="${1:-}"; shift || true
chain="" interface="" ports="" digest="" markers="" root="/host" dir="" interval=10 legacy=""
while [ $# -gt 0 ]; do
  case "$1" in
    --host) legacy="$2" ;;
    --chain) chain="$2" ;;
    --fabric-interface) interface="$2" ;;
    --tcp-ports) ports="$2" ;;
    --digest) digest="$2" ;;
    --markers) markers="$2" ;;
    --root) root="$2" ;;
    --dir) dir="$2" ;;
    --interval) interval="$2" ;;
    *) echo "spark-vllm firewall: unknown flag $1 (a bug in spark-vllm: please report it)" >&2; exit 2 ;;
  esac
  shift 2
done
say() { printf 'spark-vllm firewall: %s\n' "$*" >&2; }
marker="$dir/applied" error_file="$dir/error" removed="$dir/removed"
# Every marker this guard keeps: `applied` with --digest, then each --markers name=digest.
marked=("applied=$digest")
IFS=',' read -r -a extra <<<"$markers"
marked+=("${extra[@]}")
mark_all() {
  local entry
  for entry in "${marked[@]}"; do
    printf '%s %s\n' "$boot_id" "${entry#*=}" > "$dir/${entry%%=*}.tmp" \
      && mv "$dir/${entry%%=*}.tmp" "$dir/${entry%%=*}"
  done
}
unmark_all() {
  local entry
  for entry in "${marked[@]}"; do rm -f "$dir/${entry%%=*}"; done
}
# iptables' lock file beside the marker: the host's /run is not writable from here. Legacy
# iptables takes it (XTABLES_LOCKFILE, libxtables); with the nft backend, the default on
# Debian 12 and Ubuntu 22.04 on, the kernel applies each change whole and no lock is needed.
ipt() { chroot "$root" env XTABLES_LOCKFILE="${dir#"$root"}/xtables.lock" "$@"; }
if [ -n "$legacy" ]; then
  chain="${chain:-SPARK-VLLM-RAY}" dir="${dir:-/nonexistent}"
  ipt() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
fi

families() {
  echo iptables
  # IPv6 present on the host: torch's TCPStore listens on [::], so its rules are needed too.
  if [ -e /proc/net/if_inet6 ]; then echo ip6tables; fi
}

# The rules, one per line, as `<cmd> -A` / `-C` take them after the chain name.
rules() {
  echo "-i lo -j RETURN"
  echo "-i $interface -j RETURN"
  # multiport takes at most 15 ports per rule (a range counts twice): one rule per port.
  local port
  for port in ${ports//,/ }; do echo "-p tcp -m tcp --dport $port -j DROP"; done
}

# holds FAMILY: the chain has exactly our rules, and INPUT jumps to it first.
holds() {
  local cmd="$1" rule count
  [ "$(ipt "$cmd" -w 10 -S INPUT 2>/dev/null | sed -n 2p)" = "-A INPUT -j $chain" ] || return 1
  count=$(ipt "$cmd" -w 10 -S "$chain" 2>/dev/null | grep -c -- "^-A $chain ") || return 1
  [ "$count" -eq "$(rules | wc -l)" ] || return 1
  while read -r rule; do
    # shellcheck disable=SC2086  # a rule is several words
    ipt "$cmd" -w 10 -C "$chain" $rule 2>/dev/null || return 1
  done < <(rules)
}

apply() {
  local cmd="$1" rule
  ipt "$cmd" -w 10 -N "$chain" 2>/dev/null || ipt "$cmd" -w 10 -F "$chain" || return 1
  while read -r rule; do
    # shellcheck disable=SC2086
    ipt "$cmd" -w 10 -A "$chain" $rule || return 1
  done < <(rules)
  while ipt "$cmd" -w 10 -D INPUT -j "$chain" 2>/dev/null; do :; done
  ipt "$cmd" -w 10 -I INPUT 1 -j "$chain"
}

remove() {
  local cmd="$1"
  while ipt "$cmd" -w 10 -D INPUT -j "$chain" 2>/dev/null; do :; done
  ipt "$cmd" -w 10 -F "$chain" 2>/dev/null || true
  ipt "$cmd" -w 10 -X "$chain" 2>/dev/null || true
}

case "$action" in
  guard)
    if [ -z "$chain" ] || [ -z "$interface" ] || [ -z "$ports" ] || [ -z "$digest" ] || [ -z "$dir" ]; then
      say "--chain, --fabric-interface, --tcp-ports, --digest and --dir are required (a bug in spark-vllm: please report it)"
      exit 2
    fi
    mkdir -p "$dir"
    unmark_all; rm -f "$removed"
    trap 'unmark_all; exit 0' TERM INT
    boot_id="$(cat /proc/sys/kernel/random/boot_id)"
    last=""
    while :; do
      problem=""
      if [ -e "$removed" ]; then
        problem="removed"
      else
        for cmd in $(families); do
          if ! ipt sh -c "command -v $cmd" >/dev/null 2>&1; then
            problem="the host has no $cmd: install iptables (its $cmd drops the cluster's ports)"
            break
          fi
          holds "$cmd" && continue
          [ -n "$last" ] && say "$cmd: the chain $chain changed or is gone: applying it again"
          if ! out="$(apply "$cmd" 2>&1)"; then
            problem="$cmd could not apply the chain $chain: ${out:-no output}"
            break
          fi
        done
        # A delete that ran while this pass checked or applied (`remove` marks, then removes)
        # could see its removal undone here; taking the chain down again after the mark closes
        # that window (the CI's destroy once left the chain so).
        if [ -e "$removed" ]; then
          for cmd in $(families); do remove "$cmd"; done
          problem="removed"
        fi
      fi
      if [ -z "$problem" ]; then
        mark_all
        rm -f "$error_file"
        [ "$last" = ok ] || say "ports ${ports} accepted only on lo and $interface ($(families | tr '\n' ' '))"
        last=ok
      elif [ "$problem" != removed ]; then
        unmark_all
        printf '%s\n' "$problem" > "$error_file"
        [ "$last" = "$problem" ] || say "$problem"
        last="$problem"
      fi
      sleep "$interval" & wait $!
    done
    ;;
  remove)
    if [ -z "$chain" ] || [ -z "$dir" ]; then say "--chain and --dir are required"; exit 2; fi
    if [ -d "$dir" ]; then touch "$removed"; rm -f "$marker" "$dir"/applied-s*; fi
    for cmd in $(families); do remove "$cmd"; done
    say "chain $chain removed"
    ;;
  *) say "unknown action '$action' (a bug in spark-vllm: please report it)"; exit 2 ;;
esac
