#!/usr/bin/env bash
# Facts gathered from one host before anything changes on it; fails on the first requirement the
# host does not meet, naming it. Prints the facts as one JSON line on success. Changes nothing.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host role fabric-interface fabric-ip head-fabric-ip ports guarded cluster-fabric-ips \
  shared-fabric min-free-memory-bytes \
  memory-fraction min-free-disk-bytes disk-paths require-gpus require-nvidia-runtime \
  container-names deployment rdma-hcas known-bad allow-known-bad min-shm-bytes shm-use-bytes
SYSFS="${SPARK_VLLM_SYSFS:-/sys}"  # the tests point it at a fake RDMA tree
ROOT="${SPARK_VLLM_ROOT:-/}"  # and at a fake /proc and /sys for the kernel's command line
SHM="${SPARK_VLLM_SHM:-/dev/shm}"
command -v python3 >/dev/null \
  || fail "python3 is not installed" "preflight's checks need the host's python3 (DGX OS has it): install it"

# --- kernel and driver (known-bad releases: stacks/plan/hardware.py and preflight.knownBad) ----
kernel="$(cat "$ROOT/proc/sys/kernel/osrelease")"
driver="$(cat /sys/module/nvidia/version 2>/dev/null || true)"
if [ -z "$driver" ] && command -v nvidia-smi >/dev/null; then
  driver="$(timeout 30 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)"
fi
known_bad=""
IFS=';' read -ra entries <<<"$ARG_KNOWN_BAD"
for entry in "${entries[@]}"; do
  IFS='|' read -r kind pattern reason source <<<"$entry"
  if [ "$kind" = kernel ]; then value="$kernel"; else value="$driver"; fi
  [ -n "$value" ] || continue
  # shellcheck disable=SC2053  # the version is a shell pattern on purpose
  [[ "$value" == $pattern ]] || continue
  what="the $kind $value is known to break this workload: $reason${source:+ ($source)}"
  if [ "$ARG_ALLOW_KNOWN_BAD" = yes ]; then
    known_bad+="${known_bad:+; }$what"
  else
    fail "$what" \
      "boot a $kind release not on the list (the previous one is usually still installed), or set preflight.allowKnownBad: true to deploy anyway"
  fi
done
# Kexec HandOver on a 7.0-series kernel, from its command line and KHO's state (host_rules.py).
kho="$(python3 "$SPARK_BIN/host_rules.py" kho --host "$ARG_HOST" --root "$ROOT" \
  --allow "$ARG_ALLOW_KNOWN_BAD")" || exit 1
[ -z "$kho" ] || known_bad+="${known_bad:+; }$kho"

# --- docker -----------------------------------------------------------------------------------
command -v docker >/dev/null || fail "the docker CLI is not installed" "Docker is missing on this host"
docker_version="$(timeout 20 docker version --format '{{.Server.Version}}' 2>&1)" \
  || fail "the Docker daemon does not answer: ${docker_version//$'\n'/ }" \
       "dockerd is stopped, or user $(id -un) is not in the docker group"
runtimes="$(timeout 20 docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}')"
if [ "$ARG_REQUIRE_NVIDIA_RUNTIME" = yes ] && ! grep -qw nvidia <<<"$runtimes"; then
  fail "Docker has no nvidia runtime (runtimes: $runtimes)" \
    "the NVIDIA Container Toolkit is not installed or not configured (nvidia-ctk runtime configure)"
fi

# --- GPUs ---------------------------------------------------------------------------------------
gpus_seen=0
if [ "$ARG_REQUIRE_GPUS" -gt 0 ]; then
  command -v nvidia-smi >/dev/null || fail "nvidia-smi is not installed" "the NVIDIA driver is missing"
  gpus_seen="$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  [ "$gpus_seen" -ge "$ARG_REQUIRE_GPUS" ] \
    || fail "nvidia-smi lists $gpus_seen GPU(s), the config declares $ARG_REQUIRE_GPUS" \
         "the driver is not loaded, or hosts[].gpus is wrong"
fi

# --- memory (unified on GB10: what the GPU can take is what the OS has free) --------------------
mem_total=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 1024 ))
mem_available=$(( $(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024 ))
mem_needed="$ARG_MIN_FREE_MEMORY_BYTES"
by_fraction="$(awk -v t="$mem_total" -v f="$ARG_MEMORY_FRACTION" 'BEGIN {printf "%.0f", t * f}')"
[ "$by_fraction" -gt "$mem_needed" ] && mem_needed="$by_fraction"
own_containers_running() {
  local name
  for name in ${ARG_CONTAINER_NAMES//,/ }; do
    [ "$(container_state "$name")" = running ] && return 0
  done
  return 1
}
if [ "$mem_available" -lt "$mem_needed" ] && ! own_containers_running; then
  hogs="$(timeout 30 docker stats --no-stream --format '{{.Name}} {{.MemUsage}}' 2>/dev/null | head -5 | paste -sd ';' - || true)"
  fail "only $(( mem_available / 1048576 )) MiB of memory free, $(( mem_needed / 1048576 )) MiB needed${hogs:+ (running containers: $hogs)}" \
    "other processes or containers hold the memory (an embeddings server?); stop them, or lower vllm.gpuMemoryUtilization / preflight.minFreeMemoryGib"
fi

# --- shared memory: the containers use the host's /dev/shm (--ipc=host) ----------------------
python3 "$SPARK_BIN/host_rules.py" shm --host "$ARG_HOST" --path "$SHM" \
  --need-bytes "$ARG_MIN_SHM_BYTES" --use-bytes "$ARG_SHM_USE_BYTES" \
  --memory-fraction "$ARG_MEMORY_FRACTION" || exit 1

# --- disk -------------------------------------------------------------------------------------
existing_parent() {
  local path="$1"
  while [ ! -e "$path" ]; do path="$(dirname "$path")"; done
  printf '%s' "$path"
}
disk_free_min=""
for path in ${ARG_DISK_PATHS//,/ }; do
  free="$(df -PB1 "$(existing_parent "$path")" | awk 'NR == 2 {print $4}')"
  [ "$free" -ge "$ARG_MIN_FREE_DISK_BYTES" ] \
    || fail "only $(( free / 1073741824 )) GiB free under $path, $(( ARG_MIN_FREE_DISK_BYTES / 1073741824 )) GiB needed for the image and weights" \
         "the disk is full: remove old images (docker image prune) or models, or lower preflight.minFreeDiskGib"
  if [ -z "$disk_free_min" ] || [ "$free" -lt "$disk_free_min" ]; then disk_free_min="$free"; fi
done

# --- fabric -----------------------------------------------------------------------------------
iface="$ARG_FABRIC_INTERFACE"
[ -e "/sys/class/net/$iface" ] \
  || fail "the fabric interface $iface does not exist (interfaces: $(cd /sys/class/net && echo *))" \
       "hosts[].fabricInterface is wrong for this host (names can differ between hosts)"
state="$(cat "/sys/class/net/$iface/operstate")"
[ "$state" = up ] || [ "$state" = unknown ] \
  || fail "the fabric interface $iface is $state" "the cable or the link partner is down"
addresses="$(ip -o -4 addr show dev "$iface" | awk '{print $4}' | cut -d/ -f1 | paste -sd ' ' -)"
grep -qw -- "$ARG_FABRIC_IP" <<<"$addresses" \
  || fail "the fabric interface $iface has ${addresses:-no IPv4 address}, not $ARG_FABRIC_IP" \
       "hosts[].fabricIp is wrong for this host, or the interface lost its address"
for hca in ${ARG_RDMA_HCAS//,/ }; do
  [ -d "$SYSFS/class/infiniband/$hca" ] \
    || fail "the RDMA device $hca does not exist (devices: $(cd "$SYSFS/class/infiniband" 2>/dev/null && echo *))" \
      "hosts[].rdmaHcas is wrong for this host (ibv_devinfo lists the names), or the RDMA driver is not loaded"
  port_states="$(cat "$SYSFS/class/infiniband/$hca"/ports/*/state 2>/dev/null | paste -sd ',' - || true)"
  grep -q ACTIVE <<<"$port_states" \
    || fail "the RDMA device $hca has no active port (${port_states:-no ports})" \
      "the RoCE link is down: the cable, the link partner, or the port is not configured"
done
fabric_mtu="$(cat "/sys/class/net/$iface/mtu")"
if [ "$ARG_ROLE" = worker ]; then
  ip route get "$ARG_HEAD_FABRIC_IP" 2>/dev/null | grep -qw "dev $iface" \
    || fail "traffic to the head's fabric IP $ARG_HEAD_FABRIC_IP would not leave through $iface" \
         "the head's fabricIp is wrong, or the fabric subnet is routed through another interface"
  # A refusal still proves the head answers on the fabric; only silence is a failure.
  if ! probe="$(timeout 5 bash -c "exec 3<>/dev/tcp/$ARG_HEAD_FABRIC_IP/22" 2>&1)" \
     && ! grep -q "refused" <<<"$probe"; then
    fail "the head's fabric IP $ARG_HEAD_FABRIC_IP does not answer (${probe:-no answer within 5 s})" \
      "the fabric link is down, or the head's fabricIp is wrong"
  fi
fi

# A fabric that is the management network: this session came from outside the cluster through
# the fabric interface, so the firewall (which admits whatever arrives there) would admit it.
if [ "$ARG_SHARED_FABRIC" != yes ] && [ "${SSH_CONNECTION:-}" ]; then
  read -r client _ <<<"$SSH_CONNECTION"
  if ip route get "$client" 2>/dev/null | grep -qw "dev $iface" \
     && [[ ",$ARG_CLUSTER_FABRIC_IPS," != *",$client,"* ]]; then
    fail "this SSH session (from $client) reaches the host through its fabric interface $iface" \
      "the fabric is also the management network: the firewall admits everything on $iface to Ray's and vLLM's ports; reach the hosts over another network, or set fabric.sharedWithManagement: true if no one else is on it"
  fi
fi

# --- containers and ports ---------------------------------------------------------------------
for name in ${ARG_CONTAINER_NAMES//,/ }; do
  owner="$(docker inspect --format '{{index .Config.Labels "spark-vllm.deployment"}}' "$name" 2>/dev/null)" || continue
  if [ "$owner" != "$ARG_DEPLOYMENT" ]; then
    fail "a container named $name already exists ($(container_state "$name"), ${owner:+deployment $owner}${owner:-not made by spark-vllm})" \
      "a stale container from an earlier manual or other run; remove it with 'docker rm -f $name' and run again"
  fi
done
# in_list PORT LIST: PORT is one of LIST's ports (`6379`) or inside one of its ranges (`10002:10999`).
in_list() {
  local port=$1 item
  for item in ${2//,/ }; do
    case "$item" in
      *:*) [ "$port" -ge "${item%%:*}" ] && [ "$port" -le "${item##*:}" ] && return 0 ;;
      *) [ "$port" = "$item" ] && return 0 ;;
    esac
  done
  return 1
}
# The firewall drops ARG_GUARDED on every interface but loopback and the fabric: never SSH's.
read -r _ _ _ ssh_port <<<"${SSH_CONNECTION:-- - - -}"
if [ "$ssh_port" != - ] && in_list "$ssh_port" "$ARG_GUARDED"; then
  fail "this SSH session arrived on port $ssh_port, which the firewall would drop on every interface but the fabric" \
    "a port or range in the config covers this host's SSH port; move it (the firewall would cut SSH for good)"
fi
# Every listening socket: `PORT PID NAME` (PID and NAME `-` where ss cannot see whose it is).
listeners="$(ss -Hltnp 2>/dev/null | awk '{
  n = split($4, a, ":"); pid = "-"; name = "-"
  if (match($0, /users:\(\("[^"]*",pid=[0-9]+/)) {
    u = substr($0, RSTART + 9, RLENGTH - 9); split(u, b, "\",pid="); name = b[1]; pid = b[2]
  }
  print a[n], pid, name
}' | sort -u)"
# This deployment's containers (a port they hold is this stack's, on a second run), and every
# spark-vllm deployment's (another stack's guard drops what its containers listen on too).
containers() { docker ps -q --no-trunc --filter "label=spark-vllm.deployment$1" 2>/dev/null | paste -sd "|" - || true; }
own_ids="$(containers "=$ARG_DEPLOYMENT")" spark_ids="$(containers "")"
in_one_of() { [ "$1" != - ] && [ -n "$2" ] && grep -qE "$2" "/proc/$1/cgroup" 2>/dev/null; }
while read -r port pid name; do
  [ -n "$port" ] || continue
  if in_list "$port" "$ARG_GUARDED" && [[ "$name" == sshd* ]]; then
    fail "sshd listens on port $port, which the firewall would drop on every interface but the fabric" \
      "a port or range in the config covers one of this host's SSH ports; move it (the firewall would cut SSH for good)"
  fi
  if in_list "$port" "$ARG_PORTS"; then  # this stack will listen there: only its own may
    in_one_of "$pid" "$own_ids" && continue
  elif in_list "$port" "$ARG_GUARDED"; then  # only guarded (the other executor's ports)
    in_one_of "$pid" "$spark_ids" && continue
  else
    continue
  fi
  # Whose it is cannot be seen (another user's process, as a non-root SSH user): as before, a
  # port is taken to be this stack's while one of its containers runs.
  [ "$pid" = - ] && own_containers_running && continue
  holder=""; [ "$name" = - ] || holder=" by $name (pid $pid)"
  fail "port $port is already in use$holder" \
    "another server or a stale container holds it (host networking), or a range in the config covers a port in use; stop it or change the port or range in the config"
done <<<"$listeners"

json_text() { local v="${1//\\/\\\\}"; printf '%s' "${v//\"/\\\"}"; }
printf '{"host":"%s","role":"%s","docker":"%s","gpus":%s,"memTotalBytes":%s,"memAvailableBytes":%s,"diskFreeBytes":%s,"fabricInterface":"%s","fabricIp":"%s","fabricMtu":%s,"kernel":"%s","nvidiaDriver":"%s","knownBad":"%s"}\n' \
  "$ARG_HOST" "$ARG_ROLE" "$docker_version" "$gpus_seen" "$mem_total" "$mem_available" \
  "${disk_free_min:-0}" "$iface" "$ARG_FABRIC_IP" "$fabric_mtu" "$(json_text "$kernel")" \
  "$(json_text "$driver")" "$(json_text "$known_bad")"
