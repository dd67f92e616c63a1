# Sourced by the wait steps: when a wait fails, show what every node's containers said and name the
# known causes (../shared/ANCHORS.md) that the logs point at.

# One status line per container, on this host or a worker (the scan below reads "restarts N").
STATUS_FORMAT='{{.State.Status}} (exit {{.State.ExitCode}}, restarts {{.RestartCount}}, oom {{.State.OOMKilled}})'

# container_logs SPEC: SPEC is "node|dest|container" with dest "-" for this host.
container_logs() {
  local dest container
  IFS='|' read -r _ dest container <<<"$1"
  if [ "$dest" = "-" ]; then
    printf '%s\n' "$(container_status_line "$container")"
    docker logs --tail 50 "$container" 2>&1 || true
  else
    fabric_ssh "$dest" "$(words docker inspect --format "$STATUS_FORMAT" "$container") 2>/dev/null || echo missing; $(words docker logs --tail 50 "$container") 2>&1" 2>&1 \
      || echo "(could not reach $dest over the fabric to read its logs)"
  fi
}

# guard_stopped SPEC: what the node's memory guard (--guard-container) said when it stopped SPEC's
# container, this very one (its ID is in the line: an earlier container's stop is not this
# one's): the guard's line and its likely cause, or nothing.
guard_stopped() {
  local dest container cmd
  [ -n "${ARG_GUARD_CONTAINER:-}" ] || return 0
  IFS='|' read -r _ dest container <<<"$1"
  cmd="id=\$($(words docker inspect --format '{{.Id}}' "$container") 2>/dev/null | cut -c1-12) && [ -n \"\$id\" ] && $(words docker logs "$ARG_GUARD_CONTAINER") 2>&1 | grep -F -A1 \"(id \$id,\""
  if [ "$dest" = "-" ]; then
    bash -c "$cmd" 2>/dev/null || true
  else
    fabric_ssh "$dest" "$cmd" 2>/dev/null || true
  fi
}

container_status_line() {
  docker inspect --format "$STATUS_FORMAT" "$1" 2>/dev/null || echo missing
}

# report_nodes SPEC...: the last 50 log lines of every node's container, then the likely causes.
report_nodes() {
  local spec all_logs="" logs
  for spec in "$@"; do
    logs="$(container_logs "$spec")"
    all_logs+="$logs"$'\n'
    printf '\n--- %s: last 50 lines of %s ---\n%s\n' "${spec%%|*}" "${spec##*|}" "$logs" >&2
  done
  explain_known_causes "$all_logs" >&2
  check_nodes >&2
}

# check_rendezvous NODE RUNNER: with executor mp (--rendezvous IP:PORT), whether NODE reaches the
# head's rendezvous over the fabric, and why not (refused: nothing listens there; a timeout: a
# firewall or the fabric drops it).
check_rendezvous() {
  local -n runner="$2"
  [ -n "${ARG_RENDEZVOUS:-}" ] || return 0
  local ip="${ARG_RENDEZVOUS%:*}" port="${ARG_RENDEZVOUS##*:}" out
  # The address is an IPv4 and the port a number (typed config): safe inside the quotes.
  out="$("${runner[@]}" "timeout 5 bash -c 'exec 3<>/dev/tcp/$ip/$port' 2>/dev/null; echo rc=\$?" 2>&1 | tail -n 1)"
  case "$out" in
    rc=0) printf '  %s reaches the rendezvous %s\n' "$1" "$ARG_RENDEZVOUS" ;;
    rc=124) printf '  likely cause: %s cannot reach the rendezvous %s: the connection timed out (a firewall or the fabric drops it)\n' "$1" "$ARG_RENDEZVOUS" ;;
    *) printf '  likely cause: %s cannot reach the rendezvous %s: refused (%s): nothing listens there, so the server on the head is not running or still starting\n' "$1" "$ARG_RENDEZVOUS" "$out" ;;
  esac
}

# check_nodes: the known causes that can be checked on each node, not only read in its logs.
# Uses --node-checks "node|dest|bin ..." (dest "-" is this host), and --image, --model,
# --revision, --cache-dir when given.
check_nodes() {
  local node dest bin out run
  [ -n "${ARG_NODE_CHECKS:-}" ] || return 0
  printf '\n--- checked on every node ---\n'
  # One node a line (a state dir may hold a space); fd 3, since ssh reads stdin.
  while IFS='|' read -r -u 3 node dest bin; do
    [ -n "$node" ] || continue
    if [ "$dest" = "-" ]; then run=(bash -c); else run=(fabric_ssh "$dest"); fi
    if ! out="$("${run[@]}" "awk '/^MemAvailable:/ {print int(\$2 / 1024)}' /proc/meminfo" 2>&1)"; then
      printf '  likely cause: %s is unreachable over the fabric (%s)\n' "$node" "${out//$'\n'/ }"
      continue
    fi
    printf '  %s: %s MiB of memory available\n' "$node" "$out"
    [ "$dest" = "-" ] || check_rendezvous "$node" run
    if [ -n "${ARG_IMAGE:-}" ] \
       && ! "${run[@]}" "$(words docker image inspect "$ARG_IMAGE") >/dev/null 2>&1"; then
      printf '  likely cause: the image %s is missing on %s\n' "$ARG_IMAGE" "$node"
    fi
    if [ -n "${ARG_MODEL:-}" ] && ! out="$("${run[@]}" "$(words bash "$bin/hf-manifest.sh" --host "$node" \
        --cache-dir "$ARG_CACHE_DIR" --model "$ARG_MODEL" --revision "$ARG_REVISION")" 2>&1)"; then
      printf '  likely cause: %s\n' "$(grep -m1 'spark-vllm:' <<<"$out" || echo "$out")"
    fi
  done 3<<<"$ARG_NODE_CHECKS"
}

# explain_known_causes LOGS: one line per known pitfall whose fingerprint is in the logs.
explain_known_causes() {
  local logs="$1" found=0
  hint() { printf '  likely cause: %s\n' "$1"; found=1; }
  grep -q "No available node types can fulfill resource request" <<<"$logs" \
    && hint "a node joined Ray with a non-fabric IP (VLLM_HOST_IP/--node-ip-address do not match); compare 'ray nodes' with hosts[].fabricIp"
  grep -qiE "connectFullMesh|gloo.*127\.0\.0\.1|interface .* not found" <<<"$logs" \
    && hint "Gloo bound to loopback or a missing interface: check hosts[].fabricInterface on every node"
  grep -qiE "address already in use|bind.*failed" <<<"$logs" \
    && hint "a port is already taken on the host (another server or a stale container); free it or change vllm.port / ray.port"
  grep -qiE "less than desired GPU memory utilization|out of memory|OOMKilled|oom true" <<<"$logs" \
    && hint "not enough free (unified) memory: stop competing containers or lower vllm.gpuMemoryUtilization"
  grep -qiE "snapshot.*(missing|not found)|LocalEntryNotFoundError|No such file or directory.*huggingface" <<<"$logs" \
    && hint "the model snapshot is missing on a node: check the weights copy step"
  grep -qiE "No such image|pull access denied|manifest unknown" <<<"$logs" \
    && hint "the image is missing on a node: check the image distribution step"
  grep -qiE "unable to connect to GCS|Failed to connect to GCS|gcs.*timed out" <<<"$logs" \
    && hint "a worker cannot reach the Ray head over the fabric (firewall, wrong head fabric IP, or ray.port blocked)"
  grep -qE "restarts [1-9]" <<<"$logs" \
    && hint "a container is crash-looping (see its restart count above); its first error is in its log"
  grep -q "^missing" <<<"$logs" \
    && hint "a container is missing on a node (removed by hand, or the host rebooted without Docker restarting it)"
  [ "$found" = 1 ] || printf '  likely cause: not recognised; the log lines above are the evidence\n'
}
