# Sourced by every spark-vllm step script. Gives one failure format that names the host, the step
# and the likely cause, a flag parser, and the fabric SSH options shared by every head->worker hop.
set -euo pipefail

SPARK_STEP="$(basename "$0" .sh)"
# shellcheck disable=SC2034  # read by the scripts that source this file
SPARK_BIN="$(cd "$(dirname "$0")" && pwd)"

# fail WHAT [LIKELY_CAUSE]: print one clear message and stop this step.
fail() {
  printf 'spark-vllm: %s: %s: %s\n' "${ARG_HOST:-$(hostname)}" "$SPARK_STEP" "$1" >&2
  if [ -n "${2:-}" ]; then
    printf '  likely cause: %s\n' "$2" >&2
  fi
  exit 1
}

note() { printf '%s\n' "$*" >&2; }

# parse_flags --some-flag VALUE ... sets ARG_SOME_FLAG=VALUE (every flag takes one value).
parse_flags() {
  local key value
  while [ $# -gt 0 ]; do
    case "$1" in
      --*=*) key="${1%%=*}"; value="${1#*=}"; shift ;;
      --*)
        [ $# -ge 2 ] || fail "flag $1 has no value" "a bug in spark-vllm: please report it"
        key="$1"; value="$2"; shift 2 ;;
      *) fail "unexpected argument '$1'" "a bug in spark-vllm: please report it" ;;
    esac
    key="${key#--}"; key="${key//-/_}"
    printf -v "ARG_${key^^}" '%s' "$value"
  done
}

# require NAME...: every named ARG_ variable must be set.
require() {
  local name var
  for name in "$@"; do
    var="ARG_${name^^}"; var="${var//-/_}"
    [ -n "${!var+x}" ] || fail "missing --$name" "a bug in spark-vllm: please report it"
  done
}

# words WORD...: one command line for a remote shell, every word quoted (the one quoting rule for
# what these scripts send over SSH: a path with a space or a quote stays one word).
words() {
  local quoted
  printf -v quoted '%q ' "$@"
  printf '%s' "${quoted% }"
}

# ssh_option_value VALUE: VALUE as OpenSSH reads an option's value (`ssh -o`), one word even
# with a space or a quote: double-quoted, `\` and `"` escaped (misc.c argv_split).
ssh_option_value() {
  local value="${1//\\/\\\\}"
  value="${value//\"/\\\"}"
  printf '"%s"' "$value"
}

# fabric_ssh DEST COMMAND...: the head reaching a worker over the fabric. Bounded: a dead peer is
# noticed within ~30 s (ServerAlive) instead of hanging the transfer forever. AES-GCM is put
# first (`^`: ahead of OpenSSH's own order, chacha20 first): where ssh's cipher is the limit, as
# on a 200G fabric, the benchmark measured it 1.3x faster than chacha20 (README, Performance),
# and the Sparks' Grace CPU has the AES instructions it needs, as x86 hosts have AES-NI.
fabric_ssh() {
  local opts=(-o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=10
              -o ServerAliveCountMax=3 -o LogLevel=ERROR -o Ciphers=^aes128-gcm@openssh.com)
  if [ -n "${ARG_FABRIC_KEY:-}" ]; then
    opts+=(-i "$ARG_FABRIC_KEY" -o IdentitiesOnly=yes
           -o "UserKnownHostsFile=$(ssh_option_value "$ARG_FABRIC_KNOWN_HOSTS")"
           -o StrictHostKeyChecking=yes)
  fi
  # Not a call that forwards the agent: the master would forward its own (none).
  if [ -n "${FABRIC_MUX:-}" ] && [ "${1:-}" != -A ]; then
    opts+=(-o ControlMaster=auto -o "ControlPath=$FABRIC_MUX/%C" -o ControlPersist=10)
  fi
  ssh "${opts[@]}" "$@"
}

# fabric_multiplex: this script's later fabric_ssh calls share one connection per worker (an
# OpenSSH ControlMaster), so each short question costs a round trip, not a new handshake (about
# 0.3 s each in the lab; a copy asks a worker a dozen). fabric_multiplex_end closes them; a
# master left behind ends by itself 10 s after its last use.
fabric_multiplex() {
  FABRIC_MUX="$(mktemp -d /tmp/spark-vllm-mux.XXXXXX)"
  export FABRIC_MUX
}
fabric_multiplex_end() {
  local socket
  [ -n "${FABRIC_MUX:-}" ] || return 0
  for socket in "$FABRIC_MUX"/*; do
    [ -S "$socket" ] && ssh -o "ControlPath=$socket" -O exit spark-vllm-mux >/dev/null 2>&1
  done
  rm -rf "$FABRIC_MUX"
}

# export_fabric_ssh: make fabric_ssh (and what it uses) callable from a `bash -c` child, which a
# `timeout` around a pipeline needs.
export_fabric_ssh() {
  export -f fabric_ssh ssh_option_value with_relay_agent relay_agent_limits
  export ARG_FABRIC_KEY="${ARG_FABRIC_KEY:-}" ARG_FABRIC_KNOWN_HOSTS="${ARG_FABRIC_KNOWN_HOSTS:-}"
  export FABRIC_MUX="${FABRIC_MUX:-}"
}

# check_fabric_ssh DEST: fail clearly when the head cannot open a session to a worker.
check_fabric_ssh() {
  local out status=0
  out="$(fabric_ssh "$1" true 2>&1)" || status=$?
  if [ "$status" -ne 0 ]; then
    out="${out//$'\n'/ }"
    fail "the head cannot SSH to $1 over the fabric: ${out:-no answer} (ssh exit $status)" \
      "the worker's sshd is down or not listening on its fabric IP, the fabric link is down, or the fabric trust (key/known host) is missing"
  fi
}

# -- the relay chain: one stream from the head through several workers (relay.sh) -------------
# A chain is one `name|destination|bin` line per worker, in the order the stream passes them (the
# config refuses `|` and line breaks in paths, so neither splits a line wrongly).

# chain_destination CHAIN: where the chain's first member is reached over the fabric.
chain_destination() {
  local name dest bin
  IFS='|' read -r name dest bin <<<"${1%%$'\n'*}"
  printf '%s' "$dest"
}

# chain_names CHAIN: the members' names, comma-separated (for progress lines and notes).
chain_names() {
  cut -d'|' -f1 <<<"$1" | paste -sd, -
}

# probe_members CHAIN DIR FUNCTION: `FUNCTION DEST BIN` for every member at once (their ssh
# handshakes and questions in parallel, not one member after another), each one's output in
# DIR/1, DIR/2, ... in the chain's order.
probe_members() {
  local line name dest bin index=0
  local -a lines pids=()
  mapfile -t lines <<<"$1"
  for line in "${lines[@]}"; do
    IFS='|' read -r name dest bin <<<"$line"
    index=$(( index + 1 ))
    "$3" "$dest" "$bin" >"$2/$index" 2>/dev/null </dev/null &
    pids+=("$!")
  done
  wait "${pids[@]}" || true
}

# relay_call SINK CHAIN KNOWN_HOSTS AGENT_KEY: the command line that runs relay.sh on CHAIN's
# first member: it stores its stdin with SINK and passes it on to the rest of CHAIN. One level
# of quoting whatever the chain's length: each member builds the call for the next.
relay_call() {
  local name dest bin rest=""
  IFS='|' read -r name dest bin <<<"${2%%$'\n'*}"
  [[ "$2" != *$'\n'* ]] || rest="${2#*$'\n'}"
  words bash "$bin/relay.sh" --host "$name" --sink "$1" --chain "$rest" \
    --known-hosts "$3" --agent-key "$4"
}

# chain_call SINK CHAIN: relay_call as the head makes it, with its pins and its fabric key's
# public half (the chain's hops check the one and sign with the other through the agent).
chain_call() {
  relay_call "$1" "$2" "$(cat "$ARG_FABRIC_KNOWN_HOSTS")" "$(cat "$ARG_FABRIC_KEY.pub")"
}

# relay_agent_limits CHAIN: where the forwarded key may sign in (ssh-add -h, OpenSSH 8.9 on):
# the head to the first member, then each member to the next, one ssh-add argument a line.
# Root on a relaying worker can use the key only to reach the next member, only while the copy
# runs, and never take it (an agent signs; it does not hand the key out).
relay_agent_limits() {
  local name dest bin hop from=""
  while IFS='|' read -r name dest bin; do
    hop="${dest#ssh://}" && hop="${hop%:*}"  # user@ip
    printf -- '-h\n%s\n' "${from:+$from>}$hop"
    from="${hop#*@}"
  done <<<"$1"
}

# with_relay_agent CHAIN COMMAND...: COMMAND under an ssh-agent of its own holding the fabric key
# for CHAIN's hops alone (relay_agent_limits; each hop is bound to the host key the head pinned
# for it). The agent ends with COMMAND. Fails (exit 97) where ssh-add cannot limit the key: no
# unlimited key is ever forwarded.
with_relay_agent() {
  RELAY_LIMITS="$(relay_agent_limits "$1")"
  export RELAY_LIMITS
  shift
  ssh-agent bash -c '
    keys="$(mktemp)"
    # ssh-add -H looks the hops up by host name alone: the pins without their [ip]:port form.
    sed -E "s/^\[([^]]*)\]:[0-9]+ /\1 /" "$ARG_FABRIC_KNOWN_HOSTS" >"$keys"
    mapfile -t limits <<<"$RELAY_LIMITS"
    if ! out="$(ssh-add -q -H "$keys" "${limits[@]}" "$ARG_FABRIC_KEY" 2>&1)"; then
      rm -f "$keys"
      echo "ssh-add cannot limit the forwarded key to the relay hops (OpenSSH 8.9 or later needed): $(tr "\n" " " <<<"$out")" >&2
      exit 97
    fi
    rm -f "$keys"
    exec "$@"' with-relay-agent "$@"
}

# relayed_status CHAIN_OUTPUT NAME: the exit status relay.sh reported for NAME ("none" if it
# reported nothing: the hop to it failed before its copy began).
relayed_status() {
  awk -v name="$2" '$1 == "spark-vllm-relayed" && $2 == name { s = $3 } END { print (s == "" ? "none" : s) }' <<<"$1"
}

# metered_bytes DIR: the bytes the transfers metered into DIR have carried so far. Each transfer
# runs `dd bs=1M status=progress 2>DIR/<name>` in its pipe; dd's last record counts its bytes.
metered_bytes() {
  local log total=0 count
  for log in "$1"/*; do
    [ -s "$log" ] || continue
    count="$(tr '\r' '\n' <"$log" | awk '$2 == "bytes" { n = $1 } END { print n + 0 }')"
    total=$(( total + count ))
  done
  echo "$total"
}

# report_progress WORKER WHAT TOTAL_BYTES DIR SECONDS [STALL_SECONDS]: every SECONDS, one line into
# the step's output (`spark2: image 120 of 980 MB, 48 MB/s, ETA 17 s`); run it in the
# background. Its sleep is killed with it: a sleep left behind would hold the step's output open
# until it ends. With STALL_SECONDS, a watchdog too: a stream still in flight (its dd has not
# ended) that moved no byte for that long is stopped (stop_stalled) and DIR.stalled records
# where: a wedged peer fails the copy then, not after the whole transfer timeout.
report_progress() {
  local started=$SECONDS sent elapsed rate nap="" last=-1 moved=$SECONDS
  trap '[ -z "$nap" ] || kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do
    sleep "$5" & nap=$!
    wait "$nap" || return 0
    sent="$(metered_bytes "$4")" elapsed=$(( SECONDS - started ))
    if [ "$sent" != "$last" ]; then
      last="$sent" moved=$SECONDS
    elif [ "${6:-0}" -gt 0 ] && [ $(( SECONDS - moved )) -ge "$6" ] && in_flight "$4"; then
      stop_stalled "$4" "$sent"
      return 0
    fi
    rate=$(( sent / (elapsed > 0 ? elapsed : 1) ))
    printf '%s: %s %s of %s MB, %s MB/s, ETA %s s\n' "$1" "$2" $(( sent / 1000000 )) \
      $(( $3 / 1000000 )) $(( rate / 1000000 )) $(( rate > 0 ? ($3 - sent) / rate : 0 )) >&2
  done
}

# in_flight DIR: the stream metered into DIR last (its log is the newest: an earlier one, a
# relay's that was stopped, never ends its log) is still running: its dd has not printed its
# end record. Once it has, a quiet while is the worker loading what it got.
in_flight() {
  local newest
  # shellcheck disable=SC2012  # the logs are ours, plain names (save, relay, part1...)
  newest="$(ls -t "$1" 2>/dev/null | head -n 1)"
  [ -n "$newest" ] && ! grep -q 'records out' "$1/$newest"
}

# run_chain NAMES WHAT TOTAL_BYTES DIR SECONDS COMMAND...: COMMAND sends a relay chain's stream
# (metered into DIR), watched by report_progress (its watchdog included); sets `chain_output`
# (what the members reported: relayed_status) and `chain_exit`, and forgets a stall afterwards,
# since each member's own step copies what the chain did not bring. The reporter's pid is in
# `reporter` meanwhile, for the caller's EXIT trap.
run_chain() {
  local names=$1 what=$2 total=$3 dir=$4 seconds=$5
  shift 5
  report_progress "$names" "$what" "$total" "$dir" "$seconds" "${ARG_STALL_SECONDS:-0}" &
  reporter=$!
  # shellcheck disable=SC2034  # chain_output and chain_exit are the caller's to read
  chain_exit=0 chain_output="$("$@")" || chain_exit=$?
  kill "$reporter" 2>/dev/null || true
  reporter=""
  forget_stall "$dir"
}

# forget_stall DIR: after a relay chain, whose members' own steps copy what it did not bring
# (each on its own watchdog): say that it stalled, and let the copy after it start afresh.
forget_stall() {
  [ -e "$1.stalled" ] || return 0
  note "the relay chain stalled after $(cat "$1.stalled") bytes: stopped"
  rm -f "$1.stalled"
}

# stop_stalled DIR BYTES: record the stall (DIR.stalled: the bytes sent) and stop the transfer
# whose `bash -c` wrote its PID to DIR.pid: its whole process group (the `timeout` around it made
# one), or that process alone when the group is this script's own.
stop_stalled() {
  local pid group
  echo "$2" >"$1.stalled"
  pid="$(cat "$1.pid" 2>/dev/null)" || return 0
  group="$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')"
  if [ -n "$group" ] && [ "$group" != "$(ps -o pgid= -p $$ | tr -d ' ')" ]; then
    kill -TERM -- "-$group" 2>/dev/null || true
  else
    kill -TERM "$pid" 2>/dev/null || true
  fi
}

# container_state NAME: "running", "exited", ... or "missing".
container_state() {
  docker inspect --format '{{.State.Status}}' "$1" 2>/dev/null || echo missing
}
