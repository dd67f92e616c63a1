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
# noticed within ~30 s (ServerAlive) instead of hanging the transfer forever.
fabric_ssh() {
  local opts=(-o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=10
              -o ServerAliveCountMax=3 -o LogLevel=ERROR)
  if [ -n "${ARG_FABRIC_KEY:-}" ]; then
    opts+=(-i "$ARG_FABRIC_KEY" -o IdentitiesOnly=yes
           -o "UserKnownHostsFile=$(ssh_option_value "$ARG_FABRIC_KNOWN_HOSTS")"
           -o StrictHostKeyChecking=yes)
  fi
  ssh "${opts[@]}" "$@"
}

# export_fabric_ssh: make fabric_ssh (and what it uses) callable from a `bash -c` child, which a
# `timeout` around a pipeline needs.
export_fabric_ssh() {
  export -f fabric_ssh ssh_option_value
  export ARG_FABRIC_KEY="${ARG_FABRIC_KEY:-}" ARG_FABRIC_KNOWN_HOSTS="${ARG_FABRIC_KNOWN_HOSTS:-}"
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

# container_state NAME: "running", "exited", ... or "missing".
container_state() {
  docker inspect --format '{{.State.Status}}' "$1" 2>/dev/null || echo missing
}
