#!/usr/bin/env bash
# On a worker in a copy's chain (head -> w1 -> w2 -> ...): store the stream on stdin here with
# --sink and, as it arrives, pass the same bytes on to the next worker over the fabric. The
# head's link then carries one copy for the whole chain, and each worker's link one more.
#   relay.sh --host H --sink CMD [--chain MEMBERS --known-hosts K --agent-key PUB]
# MEMBERS: the workers after this one, a `name|destination|bin` line each (lib.sh relay_call).
# The hop to the next worker signs in with the head's fabric key through the agent the head
# forwards for this one copy, limited to the chain's hops (copy_relay.py relay_agent: the key
# never lands on a worker, signs for nothing else, and nothing is left here once the copy ends),
# and checks the next worker's host key against the head's pins (--known-hosts).
# Prints `spark-vllm-relayed NAME STATUS` for this worker and, passed back up the chain, for
# each worker after it. A next hop that fails does not stop this worker's own copy (tee -p
# carries on with the outputs that still read), nor the reverse.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host sink
export SPARK_BIN  # the sink may name this worker's own scripts
store() {
  local status=0
  bash -c "$ARG_SINK" >&2 || status=$?
  echo "spark-vllm-relayed $ARG_HOST $status"
}
if [ -z "${ARG_CHAIN:-}" ]; then
  store
  exit 0
fi
require known-hosts agent-key
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
printf '%s\n' "$ARG_KNOWN_HOSTS" >"$work/known_hosts"
printf '%s\n' "$ARG_AGENT_KEY" >"$work/fabric.pub"
chmod 600 "$work/fabric.pub"  # ssh reads an -i file as a private key first
# fabric_ssh with the head's pins and, by its public half, the forwarded key (ssh -i takes a
# public key file to pick that key from the agent).
ARG_FABRIC_KEY="$work/fabric.pub" ARG_FABRIC_KNOWN_HOSTS="$work/known_hosts"
mkfifo "$work/stream"
store <"$work/stream" &
stored=$!
next="$(chain_destination "$ARG_CHAIN")"
set +e
tee -p "$work/stream" \
  | fabric_ssh -A "$next" "$(relay_call "$ARG_SINK" "$ARG_CHAIN" "$ARG_KNOWN_HOSTS" "$ARG_AGENT_KEY")"
passed=$?
set -e
[ "$passed" -eq 0 ] || note "$ARG_HOST: passing the stream on to $next failed (ssh exit $passed)"
wait "$stored" || true
