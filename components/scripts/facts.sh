# Facts about one host, read-only, gathered by the program on every run over the host's own SSH
# connection (sent on stdin after snapshot.sh and dir_safety, so it needs nothing installed on
# the host):
#   bash -s -- STATE_DIR CACHE_DIR [GUARD_CONTAINER]
# Prints "spark-vllm-facts 1". Then, when another local user could change what is in the state
# directory or the cache (dir_safety.py), "unsafe WHY" for each reason and nothing more: no
# receipt is read there (a snapshot's check runs the state's weights_filter.py). Else one line
# per receipt (receipt.sh): "STEP TOKEN" when every
# check recorded with it still holds, "STEP - WHY" when one does not. Every check is bounded.
# Then "slot K KEY" for each server's slot the head recorded (stacks/fleet.py assign_slots),
# "guard LINE" for each container the memory guard stopped that is stopped still,
# "key-label NAME VALUE" for each container with a key label, then what the running dockerd
# gives every container: "dockerd-arg --default-ulimit=V" per such flag and "daemon-json JSON",
# its config file on one line (JSON strings hold no raw newline); then, when the host has its
# own NCCL, "nccl PATH RESOLVED".
set -uo pipefail
state_dir="$1"
cache_dir="$2"
guard="${3:-}"

# holds CHECK-FIELDS...: succeed silently, or print why the check fails.
holds() {
  case "$1" in
    files)
      shift
      for path in "$@"; do [ -s "$path" ] || { echo "$path is gone or empty"; return 1; }; done ;;
    sha256sums)
      (cd "$2" 2>/dev/null && timeout 60 sha256sum --quiet --status -c .sha256sums 2>/dev/null) \
        || { echo "files in $2 were changed or removed"; return 1; } ;;
    mark)
      [ "$(cat "$2/.spark-vllm-mark.$step" 2>/dev/null)" = "$3" ] \
        || { echo "$2 was removed or recreated"; return 1; } ;;
    image)
      timeout 20 docker image inspect "$2" >/dev/null 2>&1 || { echo "image $2 is gone"; return 1; } ;;
    snapshot)
      # snapshot|CACHE|MODEL|COMMIT|FILES|BYTES[|INCLUDE|EXCLUDE] (receipt.sh); the patterns are
      # matched by the state dir's weights_filter.py, which the step that wrote this ran.
      local now filter=()
      [ "$#" -le 6 ] || filter=("$state_dir/bin/weights_filter.py" "$7" "$8")
      now="$(timeout 60 bash -c "$(declare -f snapshot_manifest); snapshot_manifest \"\$@\"" _ "$2" "$3" "$4" "${filter[@]}")"
      [ "$now" = "$4 $5 $6" ] || { echo "model $3: ${now:-no answer} (was $4 $5 $6)"; return 1; } ;;
    known-host)
      ssh-keygen -F "$3" -f "$2" >/dev/null 2>&1 || { echo "$2 no longer pins $3"; return 1; } ;;
    authorized)
      # The key's comment (its last field) is the marker, whole: spark1's is not spark10's; with
      # a third field, the line's first is `from="<it>"` (authorize-key.sh).
      MARKER="$2" FROM="${3:-}" awk '$NF == ENVIRON["MARKER"] \
          && (ENVIRON["FROM"] == "" || $1 == "from=\"" ENVIRON["FROM"] "\"") { found = 1 }
        END { exit !found }' "$HOME/.ssh/authorized_keys" 2>/dev/null \
        || { echo "the key marked $2 is no longer authorized${3:+ from $3 alone}"; return 1; } ;;
    *) echo "unknown check $1"; return 1 ;;
  esac
}

echo "spark-vllm-facts 1"
if ! command -v python3 >/dev/null; then
  echo "unsafe python3 is not installed: cannot check who may write $state_dir; fix: install python3"
  exit 0
fi
if ! unsafe="$(dir_safety "$state_dir" "$cache_dir" 2>&1)"; then
  while IFS= read -r line; do echo "unsafe $line"; done <<<"${unsafe:-the ownership check failed}"
  exit 0
fi
for receipt in "$state_dir"/receipts/*; do
  [ -f "$receipt" ] || continue
  step="$(basename "$receipt")"
  token=""; why=""
  {
    read -r token
    while IFS='|' read -r -a fields; do
      [ "${#fields[@]}" -gt 0 ] || continue
      why="$(holds "${fields[@]}" </dev/null)" || break
      why=""
    done
  } < "$receipt"
  if [ -n "$token" ] && [ -z "$why" ]; then
    echo "$step $token"
  else
    echo "$step - ${why:-the receipt is empty}"
  fi
done
# The head's record of each server's slot (the front's configuration step writes it).
if [ -f "$state_dir/front/slots" ]; then
  while read -r slot key; do
    [ -n "$key" ] && echo "slot $slot $key"
  done < "$state_dir/front/slots"
fi
# The memory guard's stops (memory_guard.py's lines, the container's short ID in them) whose
# container is there and stopped still: the next `up` says so, before anything changes.
if [ -n "$guard" ]; then
  timeout 10 docker logs --tail 500 "$guard" 2>/dev/null | grep -F 'memory-guard: stopped' \
    | tail -n 20 | while IFS= read -r line; do
      id="$(sed -n 's/.*(id \([0-9a-f]\{12\}\),.*/\1/p' <<<"$line")"
      [ -n "$id" ] || continue
      running="$(timeout 10 docker inspect --format '{{.State.Running}}' "$id" 2>/dev/null)"
      [ "$running" = false ] && echo "guard $line"
    done
fi
# Each container's key label (stacks/plan/containers.py API_KEY_HASH_LABEL and secret_label: an
# earlier release's value is kept while the key is the same, so an upgrade replaces nothing).
# A host without Docker has none; one whose Docker does not answer says why.
if command -v docker >/dev/null; then
  if listed="$(timeout 20 docker ps -a --filter label=spark-vllm.api-key-sha256 \
      --format '{{.Names}} {{.Label "spark-vllm.api-key-sha256"}}' 2>&1)"; then
    while read -r name value; do
      [ -n "$value" ] && echo "key-label $name $value"
    done <<<"$listed"
  else
    echo "key-label-error docker ps: $(tail -n 2 <<<"${listed:-no answer within 20 s}" | paste -sd ' ' -)"
  fi
fi
# What dockerd adds to every container (default-ulimits): its command line and its config file.
dockerd_pid="$(cat /run/docker.pid 2>/dev/null || pgrep -xo dockerd 2>/dev/null)"
daemon_json=/etc/docker/daemon.json
if [ -n "$dockerd_pid" ] && [ -r "/proc/$dockerd_pid/cmdline" ]; then
  while IFS= read -r -d '' arg; do
    case "$arg" in
      --config-file=*) daemon_json="${arg#--config-file=}" ;;
      --default-ulimit=*) echo "dockerd-arg $arg" ;;
    esac
    [ "${previous:-}" = --default-ulimit ] && echo "dockerd-arg --default-ulimit=$arg"
    [ "${previous:-}" = --config-file ] && daemon_json="$arg"
    previous="$arg"
  done < "/proc/$dockerd_pid/cmdline"
fi
[ -r "$daemon_json" ] && echo "daemon-json $(tr -d '\n\r' < "$daemon_json")"
# The host's own NCCL (vllm.hostNccl mounts it): the loader cache's libnccl.so.2 (Debian's and
# Ubuntu's libnccl2 put it in /usr/lib/<arch>-linux-gnu) and the file it resolves to, whose name
# carries the release (stacks/plan/nccl.py reads it).
nccl="$(PATH="$PATH:/sbin:/usr/sbin" timeout 10 ldconfig -p 2>/dev/null \
  | awk '$1 == "libnccl.so.2" { print $NF; exit }')"
[ -n "$nccl" ] && echo "nccl $nccl $(readlink -f "$nccl" 2>/dev/null || echo "$nccl")"
exit 0
