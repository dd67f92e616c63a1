#!/usr/bin/env bash
# The firewall guard: the entrypoint of `<prefix>-firewall` on every host (bash -c, self-contained).
# It runs the host's own iptables and ip6tables (through a read-only view of the host's root, with
# CAP_NET_ADMIN in the host's network namespace: no root login or sudo needed) and keeps one chain
# per deployment, jumped to from a parent chain every deployment on the host shares:
#   INPUT (first rule) -> SPARK-VLLM -> SPARK-VLLM-<deployment> (one per stack on the host)
# A deployment's chain, in order: loopback returns; established connections return (a mistake in
# the list never cuts the SSH session that could fix it); the fabric interface returns; packets
# for loopback or the fabric's addresses that came in on any other interface drop (Linux accepts
# a packet for any of its addresses on any interface: a neighbour routing the fabric subnet
# through a host's management IP would reach every socket bound to the fabric IP); then the
# cluster's TCP ports drop (sockets bound to every address).
#   firewall.sh guard  --chain C --fabric-interface IF --fabric-ip IP --tcp-ports 6379,10002:10999 \
#                      --digest D [--markers applied-s1=D1,...] --root /host --dir /host<state>/firewall \
#                      --interval S
#   firewall.sh remove --chain C --root /host --dir /host<state>/firewall   (docker exec, at delete)
#   firewall.sh remove --host H --fabric-interface IF --tcp-ports P   (on the host: the delete an
#     older release stored for its firewall step, which took its chain down as root or sudo -n)
# A deployment's chain is written whole by `iptables-restore --noflush` (one transaction: the
# kernel never sees it half built, iptables/nft.c nft_chain_restore flushes a redeclared chain
# inside the batch), and no guard ever flushes the parent or another deployment's chain, so two
# stacks on one host never open each other's ports.
# While the rules hold, <dir>/applied holds `<boot id> <digest>`, refreshed every interval: the
# Ray and vLLM containers' gate (firewall-gate.sh) starts nothing until it finds it. With several
# servers each one's gate reads its own marker (--markers: name=digest of the ports it needs),
# so a server added later changes these rules, never a running server's gate. Docker starts
# this container again at boot (restart: always), so a reboot puts the rules back by itself.
set -uo pipefail
action="${1:-}"; shift || true
chain="" interface="" fabric_ip="" ports="" digest="" markers="" root="/host" dir="" interval=10 legacy=""
while [ $# -gt 0 ]; do
  case "$1" in
    --host) legacy="$2" ;;
    --chain) chain="$2" ;;
    --fabric-interface) interface="$2" ;;
    --fabric-ip) fabric_ip="$2" ;;
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
parent="SPARK-VLLM"  # shared by every deployment on the host: never flushed
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

# local_addresses FAMILY: the fabric interface's addresses (and the configured fabric IP, for
# the boot before the interface has it), each as iptables writes a host address.
local_addresses() {
  local cmd="$1" address
  if [ "$cmd" = iptables ]; then
    [ -z "$fabric_ip" ] || echo "$fabric_ip/32"
    for address in $(ipt ip -4 -o addr show dev "$interface" 2>/dev/null | awk '{print $4}'); do
      echo "${address%/*}/32"
    done
  else
    for address in $(ipt ip -6 -o addr show dev "$interface" 2>/dev/null | awk '{print $4}'); do
      echo "${address%/*}/128"
    done
  fi
}

# rules FAMILY: the deployment's chain, one rule per line, as `-A CHAIN` takes it.
rules() {
  local cmd="$1" address port
  echo "-i lo -j RETURN"
  echo "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"
  echo "-i $interface -j RETURN"
  # Loopback's addresses from another interface (a host with route_localnet): Prometheus,
  # Grafana, the front's metrics and vLLM's own port listen there.
  if [ "$cmd" = iptables ]; then echo "-d 127.0.0.0/8 -j DROP"; fi
  for address in $(local_addresses "$cmd" | sort -u); do echo "-d $address -j DROP"; done
  # multiport takes at most 15 ports per rule (a range counts twice): one rule per port.
  for port in ${ports//,/ }; do echo "-p tcp -m tcp --dport $port -j DROP"; done
}

# restore_text FAMILY: the deployment's chain whole, for `iptables-restore --noflush`.
restore_text() {
  local rule
  printf '*filter\n:%s - [0:0]\n' "$chain"
  while read -r rule; do printf -- '-A %s %s\n' "$chain" "$rule"; done < <(rules "$1")
  printf 'COMMIT\n'
}

declare -A applied_text=() applied_listing=()

# holds FAMILY: INPUT jumps to the parent first, the parent to this chain, and the chain is the
# one this guard last wrote (iptables' own listing of it, unchanged) for today's rules.
holds() {
  local cmd="$1"
  local listing
  listing="$(ipt "$cmd" -w 10 -S INPUT 2>/dev/null)" || return 1
  [ "$(sed -n 2p <<<"$listing")" = "-A INPUT -j $parent" ] || return 1
  [ "$(grep -cxE -- "-A INPUT -j ($parent|$chain)" <<<"$listing")" -eq 1 ] || return 1
  ipt "$cmd" -w 10 -C "$parent" -j "$chain" 2>/dev/null || return 1
  [ "${applied_text[$cmd]:-}" = "$(restore_text "$cmd")" ] || return 1
  [ "${applied_listing[$cmd]:-}" = "$(ipt "$cmd" -w 10 -S "$chain" 2>/dev/null)" ] || return 1
}

# first_in_input FAMILY: INPUT's first rule jumps to the parent, and no other rule of INPUT does.
# Moved in one transaction (deletes and the insert commit together): no moment without the jump.
# Another guard moving it at the same moment fails this one's deletes: read again and retry.
first_in_input() {
  local cmd="$1" listing count attempt
  for attempt in 1 2 3; do
    listing="$(ipt "$cmd" -w 10 -S INPUT)" || return 1
    count="$(grep -cx -- "-A INPUT -j $parent" <<<"$listing")"
    [ "$(sed -n 2p <<<"$listing")" = "-A INPUT -j $parent" ] && [ "$count" -eq 1 ] && return 0
    {
      printf '*filter\n'
      for (( ; count > 0; count-- )); do printf -- '-D INPUT -j %s\n' "$parent"; done
      printf -- '-I INPUT 1 -j %s\nCOMMIT\n' "$parent"
    } | ipt "$cmd-restore" -w 10 --noflush && return 0
    [ "$attempt" -lt 3 ] && sleep 0.$(( RANDOM % 5 + 1 ))
  done
  return 1
}

# apply FAMILY: write the chain whole, then hook it in. Only adds and one-rule deletes of our own
# jumps: nothing another deployment relies on is ever flushed or left open.
apply() {
  local cmd="$1" text
  text="$(restore_text "$cmd")"
  ipt "$cmd-restore" -w 10 --noflush <<<"$text" || return 1
  ipt "$cmd" -w 10 -N "$parent" 2>/dev/null || true
  ipt "$cmd" -w 10 -C "$parent" -j "$chain" 2>/dev/null \
    || ipt "$cmd" -w 10 -A "$parent" -j "$chain" || return 1
  first_in_input "$cmd" || return 1
  # An older release jumped from INPUT to this chain directly: the parent does it now.
  while ipt "$cmd" -w 10 -D INPUT -j "$chain" 2>/dev/null; do :; done
  applied_text[$cmd]="$text"
  applied_listing[$cmd]="$(ipt "$cmd" -w 10 -S "$chain")"
}

# remove FAMILY: this deployment's chain out, then the parent when no deployment is left in it
# (one transaction: it fails, changing nothing, while another deployment's jump is there).
remove() {
  local cmd="$1"
  while ipt "$cmd" -w 10 -D "$parent" -j "$chain" 2>/dev/null; do :; done
  while ipt "$cmd" -w 10 -D INPUT -j "$chain" 2>/dev/null; do :; done
  ipt "$cmd" -w 10 -F "$chain" 2>/dev/null || true
  ipt "$cmd" -w 10 -X "$chain" 2>/dev/null || true
  if ! ipt "$cmd" -w 10 -S "$parent" 2>/dev/null | grep -q -- "^-A "; then
    printf '*filter\n-D INPUT -j %s\n-X %s\nCOMMIT\n' "$parent" "$parent" \
      | ipt "$cmd-restore" -w 10 --noflush 2>/dev/null || true
  fi
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
          if ! ipt sh -c "command -v $cmd && command -v $cmd-restore" >/dev/null 2>&1; then
            problem="the host has no $cmd or $cmd-restore: install iptables (its $cmd drops the cluster's ports)"
            break
          fi
          holds "$cmd" && continue
          [ -n "$last" ] && say "$cmd: the chain $chain changed or is gone: applying it again"
          # Not in a subshell: apply remembers what it wrote, for holds.
          if ! apply "$cmd" > "$dir/apply.out" 2>&1; then
            problem="$cmd could not apply the chain $chain: $(head -c 2000 "$dir/apply.out")"
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
        [ "$last" = ok ] || say "ports ${ports} and the fabric's addresses accepted only on lo and $interface ($(families | tr '\n' ' '))"
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
