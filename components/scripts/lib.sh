# Sourced by every spark-vllm step script. Gives one failure format that names the host, the step
# and the likely cause, a flag parser, and the fabric SSH options shared by every head->worker hop.
set -euo pipefail

SPARK_STEP="$(basename "$0" .sh)"
# shellcheck disable=SC2034  # read by the scripts that source this file
SPARK_BIN="$(cd "$(dirname "$0")" && pwd)"
SPARK_STARTED_US="${EPOCHREALTIME//[!0-9]/}"

# step_seconds: `spark-vllm-seconds S.S` on stdout, how long this step has run so far (the
# cold-start figures of the `models` output, stacks/plan/cold_start.py).
step_seconds() {
  local tenths=$(( (${EPOCHREALTIME//[!0-9]/} - SPARK_STARTED_US) / 100000 ))
  printf 'spark-vllm-seconds %d.%d\n' $(( tenths / 10 )) $(( tenths % 10 ))
}

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
  ssh "${opts[@]}" "$@"
}

# check_fabric_ssh DEST: fail clearly when the head cannot open a session to a worker.
check_fabric_ssh() {
  local out status=0
  out="$(fabric_ssh "$1" true 2>&1)" || status=$?
  if [ "$status" -ne 0 ]; then
    out="${out//$'\n'/ }"
    fail "the head cannot SSH to $1 over the fabric: ${out:-no answer} (ssh exit $status)" \
      "the worker's sshd is down or not listening on its fabric IP, the fabric link is down, the fabric trust (key/known host) is missing, or (Permission denied) the head reaches it from an address other than its fabricIp, the one address the key is authorized from (\`ip route get <worker fabricIp>\` on the head must say \`src <head fabricIp>\`)"
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

# container_state NAME: "running", "exited", ... or "missing".
container_state() {
  docker inspect --format '{{.State.Status}}' "$1" 2>/dev/null || echo missing
}

# empty DIR: remove everything inside DIR, or fail naming what stopped it. What the containers
# wrote as root is removed from a container of $ARG_IMAGE (the serving image) as root. DIR must
# be the directory itself: a link, or a path that a link on the way leads elsewhere (realpath),
# is refused before anything is deleted; inside it, find deletes links, never what they name.
empty() {
  local dir=$1 status=0 why real
  if [ -L "$dir" ]; then
    fail "$dir is a symbolic link (to $(readlink -- "$dir")), not the directory spark-vllm made: nothing deleted" \
      "someone replaced it with a link: remove the link (rm $dir), check what it leads to, then run the destroy again"
  fi
  [ -d "$dir" ] || return 0
  real="$(realpath -e -- "$dir")" || fail "cannot resolve $dir: nothing deleted" "a directory on its way was removed or is unreadable"
  if [ "$real" != "$dir" ]; then
    fail "$dir leads to $real (a link on its way), not the directory spark-vllm made: nothing deleted" \
      "a parent of hosts[].stateDir or model.cacheDir was replaced with a link: put the real directory back, or remove what is left by hand"
  fi
  # From /: GNU find fails when it cannot return to a working directory it may not enter.
  cd /
  find "$dir" -mindepth 1 -delete 2>/dev/null && return 0
  why="$(timeout 240 docker run --rm --pull never --network none --user 0:0 \
    --entrypoint find -v "$dir:/empty" "$ARG_IMAGE" /empty -mindepth 1 -delete 2>&1 >/dev/null)" \
    || status=$?
  find "$dir" -mindepth 1 -delete 2>/dev/null && return 0
  case "$status" in
    124) why="emptying it from the serving image took over 240 s" ;;
    0) why="files the containers' user (root) left" ;;
    *) why="it holds files of the containers' user (root), and emptying it from the serving image $ARG_IMAGE failed: ${why:-exit $status}" ;;
  esac
  fail "could not remove what is in $dir: $why" \
    "remove it by hand as root (sudo rm -rf $dir), then run the destroy again"
}
