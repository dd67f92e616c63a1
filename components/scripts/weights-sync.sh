#!/usr/bin/env bash
# On the head: bring one worker's copy of the snapshot to the head's over the fabric, sending only
# what the worker lacks, then verify files and bytes there. HF cache blobs are content-addressed
# (named by their sha256, or git sha1 for small files), so a blob the worker holds whole is kept;
# one it holds in part (a copy cut midway) is resumed from where it stopped and its sha256
# checked; only this revision's blobs are considered. tar keeps the snapshot's symlinks intact.
#   weights-sync.sh --host H --worker W --target ssh://user@ip:port --worker-bin DIR --cache-dir C
#                   --model M --manifest "commit files bytes" --timeout-minutes T
#                   [--progress-seconds S] [--stall-seconds S] [--fabric-key ...]
#                   [--relay CHAIN]  (the first worker's step: every worker, `name|destination|bin`)
# With --relay (two or more workers lack the revision, the head's fabric key managed), the blobs
# none of them holds go once through a chain of them (relay.sh): the head's link carries one
# copy, not one per worker. The rest (a blob held in part, the links) stays per worker.
# Prints `spark-vllm-weights-sent {json}` (bytes sent, blobs kept, resumed, sent) as its last line.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host worker target worker-bin cache-dir model manifest timeout-minutes
PROGRESS_SECONDS="${ARG_PROGRESS_SECONDS:-10}"
read -r commit files bytes <<<"$ARG_MANIFEST"
repo="models--${ARG_MODEL//\//--}"
hub="$ARG_CACHE_DIR/hub"
worker_blobs="$hub/$repo/blobs"

worker_manifest() {  # DEST BIN
  fabric_ssh "$1" "$(words bash "$2/hf-manifest.sh" --host "$ARG_WORKER" \
    --cache-dir "$ARG_CACHE_DIR" --model "$ARG_MODEL" --revision "$commit")" 2>&1 </dev/null
}
# blob_sizes DEST BIN: `NAME SIZE` of each of this revision's blobs DEST holds (0: absent).
blob_sizes() {
  local call
  call="$(words bash "$2/hf-blob-sizes.sh" --host "$ARG_WORKER" --cache-dir "$ARG_CACHE_DIR" --model "$ARG_MODEL")"
  printf '%s\n' "${!head_size[@]}" | fabric_ssh "$1" "$call" 2>&1
}
sent_line() {
  printf 'spark-vllm-weights-sent {"bytes":%s,"total":%s,"kept":%s,"resumed":%s,"sent":%s,"relayed":%s}\n' "$@"
}
meters="$(mktemp -d)"  # one dd progress log per transfer: what went into ssh, counted by dd
reporter=""
plans="$(mktemp -d)"  # the facts copy_plan.py decides from, and its plans
trap '[ -z "$reporter" ] || kill "$reporter" 2>/dev/null || true; rm -rf "$meters" "$meters.pid" "$meters.stalled" "$plans"; fabric_multiplex_end' EXIT
fabric_multiplex
check_fabric_ssh "$ARG_TARGET"
snapshot="$hub/$repo/snapshots/$commit"
# The revision's blobs (what its snapshot links to), with the head's sizes.
declare -A head_size=()
if [ -d "$snapshot" ]; then
  while read -r link; do
    blob="$(readlink -f "$link")"
    head_size["$(basename "$blob")"]="$(stat -c %s "$blob")"
  done < <(find "$snapshot" -type l)
fi
for name in "${!head_size[@]}"; do echo "$name ${head_size[$name]}"; done >"$plans/head"
export_fabric_ssh

# metered_send LOG DEST REMOTE_COMMAND [CHAIN]: stdin to DEST's REMOTE_COMMAND over the fabric,
# counted. Bounded by the step's timeout; prints the remote command's output. With CHAIN, under
# an agent holding the fabric key for CHAIN's hops alone (lib.sh with_relay_agent), forwarded.
metered_send() {
  local run=(bash -c) forward=""
  [ -z "${4:-}" ] || run=(bash -c 'with_relay_agent "$@"' metered-send "$4" bash -c) forward=-A
  timeout "${ARG_TIMEOUT_MINUTES}m" "${run[@]}" \
    'echo $$ >"$5"; set -o pipefail; dd bs=1M status=progress 2>"$1" | fabric_ssh $4 "$2" "$3"' \
    weights-sync "$1" "$2" "$3" "$forward" "$meters.pid"
}

# send_blobs DEST REMOTE CHAIN: the chain's blobs (relay_to_chain's `blobs`, under `hub`) as one
# tar stream, metered, to DEST's REMOTE through CHAIN.
send_blobs() {
  tar -C "$hub" -cf - "${blobs[@]}" | metered_send "$meters/relay" "$1" "$2" "$3"
}

relayed=0
# weights_fact DEST BIN: what the chain needs to know of a worker: `unreachable`, `has` (this
# revision, whole), or the size it holds of each of the revision's blobs (`NAME SIZE` lines).
weights_fact() {
  fabric_ssh "$1" true >/dev/null 2>&1 || { echo unreachable; return 0; }
  [ "$(worker_manifest "$1" "$2")" != "$ARG_MANIFEST" ] || { echo has; return 0; }
  local sizes
  sizes="$(blob_sizes "$1" "$2")" || { echo unreachable; return 0; }
  printf '%s\n' "$sizes"
}
# relay_to_chain: the blobs that none of --relay's workers lacking this revision holds at all,
# in one tar stream passed from worker to worker (relay.sh), when two or more lack it. Each
# worker's own step then sends what is left for it (a blob held in part, the snapshot's links).
relay_to_chain() {
  local line name dest bin fact chain="" members=0 size="" position=0 kind blob
  local -a lines blobs=() holdings=()
  local facts
  facts="$(mktemp -d)"
  probe_members "$ARG_RELAY" "$facts" weights_fact
  mapfile -t lines <<<"$ARG_RELAY"
  for line in "${lines[@]}"; do
    IFS='|' read -r name dest bin <<<"$line"
    position=$(( position + 1 ))
    fact="$(cat "$facts/$position")"
    case "$fact" in
      unreachable | "") note "$name cannot be reached over the fabric: its own step copies the weights"; continue ;;
      has) continue ;;
    esac
    printf '%s\n' "$fact" >"$plans/member$position"
    holdings+=("$plans/member$position")
    chain+="$line"$'\n' members=$(( members + 1 ))
  done
  rm -rf "$facts"
  chain="${chain%$'\n'}"
  [ "$members" -ge 2 ] || return 0
  while read -r kind blob; do
    case "$kind" in
      send) blobs+=("$repo/blobs/$blob") ;;
      total) size="$blob" ;;
    esac
  done < <(python3 "$SPARK_BIN/copy_plan.py" chain-blobs "$plans/head" "${holdings[@]}")
  [ -n "$size" ] || { note "planning the relay chain failed (copy_plan.py): each worker's own step copies"; return 0; }
  [ "${#blobs[@]}" -gt 0 ] || return 0
  local names started=$SECONDS sink
  names="$(chain_names "$chain")"
  sink="$(words mkdir -p "$hub") && $(words tar -C "$hub" -xf -)"
  note "relaying ${#blobs[@]} blob(s) of $ARG_MODEL@$commit ($size bytes) to $names in one chain"
  run_chain "$names" weights "$size" "$meters" "$PROGRESS_SECONDS" \
    send_blobs "$(chain_destination "$chain")" "$(chain_call "$sink" "$chain")" "$chain"
  mapfile -t lines <<<"$chain"
  for line in "${lines[@]}"; do
    IFS='|' read -r name dest bin <<<"$line"
    if [ "$(relayed_status "$chain_output" "$name")" = 0 ]; then
      relayed=$(( relayed + 1 ))
    else
      note "$name did not take the chain's blobs (relay status $(relayed_status "$chain_output" "$name"), stream exit $chain_exit): its own step sends what it lacks"
    fi
  done
  note "relayed ${#blobs[@]} blob(s) to $relayed of $members workers in $(( SECONDS - started ))s"
}
if [ -n "${ARG_RELAY:-}" ] && [ -n "${ARG_FABRIC_KEY:-}" ] && [ -d "$snapshot" ]; then
  relay_to_chain
fi

if [ "$(worker_manifest "$ARG_TARGET" "$ARG_WORKER_BIN")" = "$ARG_MANIFEST" ]; then
  echo "$ARG_WORKER has $ARG_MODEL@$commit ($files files, $bytes bytes); nothing more to copy"
  sent_line "$(metered_bytes "$meters")" "$bytes" "$files" 0 0 "$relayed"
  exit 0
fi
[ -d "$snapshot" ] || fail "the head has no snapshot $commit of $ARG_MODEL" "the fetch step did not complete"
sizes="$(blob_sizes "$ARG_TARGET" "$ARG_WORKER_BIN")" \
  || fail "cannot read which blobs $ARG_WORKER has: ${sizes//$'\n'/ }" "the worker's scripts are missing (run pulumi up again)"
printf '%s\n' "$sizes" >"$plans/worker"

# What is kept, resumed and sent whole, and why: copy_plan.py (table-tested).
kept=() resumed=() whole=() to_send=""
while read -r kind name have; do
  case "$kind" in
    kept) kept+=("$name") ;;
    resume) resumed+=("$name:$have") ;;
    send) whole+=("$repo/blobs/$name") ;;
    total) to_send="$name" ;;
  esac
done < <(python3 "$SPARK_BIN/copy_plan.py" blobs "$plans/head" "$plans/worker")
[ -n "$to_send" ] || fail "planning the copy of $ARG_MODEL to $ARG_WORKER failed" "the head's python3 (copy_plan.py) did not run"
echo "$ARG_WORKER: $ARG_MODEL@$commit: ${#kept[@]} blob(s) kept, ${#resumed[@]} resumed, ${#whole[@]} to send; $to_send of $bytes bytes to go" >&2

started=$SECONDS
report_progress "$ARG_WORKER" weights "$to_send" "$meters" "$PROGRESS_SECONDS" "${ARG_STALL_SECONDS:-0}" &
reporter=$!

failed() {
  local cause="the fabric link to $ARG_TARGET dropped or the worker's disk is full"
  if [ -e "$meters.stalled" ]; then
    fail "copying $ARG_MODEL to $ARG_WORKER stalled: nothing moved for ${ARG_STALL_SECONDS}s (timeouts.copyStallSeconds; $(cat "$meters.stalled") of $to_send bytes sent); the transfer was stopped, the next run resumes" \
      "$ARG_WORKER stopped taking the stream: its disk is wedged or full, or the fabric link stalled"
  fi
  [ "$1" -eq 124 ] && cause="the copy is slower than timeouts.weightsTransferMinutes=$ARG_TIMEOUT_MINUTES allows"
  fail "copying $ARG_MODEL to $ARG_WORKER failed after $(( SECONDS - started ))s (exit $1; $(metered_bytes "$meters") of $to_send bytes sent, the next run resumes)" "$cause"
}
index=0
for entry in "${resumed[@]}"; do
  name="${entry%%:*}" offset="${entry##*:}" index=$(( index + 1 ))
  blob="$worker_blobs/$name"
  set +e
  out="$(tail -c "+$(( offset + 1 ))" "$hub/$repo/blobs/$name" \
    | metered_send "$meters/$index" "$ARG_TARGET" "$(words cat) >> $(words "$blob") && $(words sha256sum "$blob")")"
  status=$?
  set -e
  [ "$status" -eq 0 ] || failed "$status"
  [ "${out%% *}" = "$name" ] \
    || fail "the resumed blob $name on $ARG_WORKER does not match its sha256 (${out%% *})" \
      "the part the worker held was not the blob's beginning; the next run sends it whole after you delete it there"
done
# Whole blobs first, the snapshot's links last: a cut leaves no link to a blob that is not there.
set +e
tar -C "$hub" -cf - "${whole[@]}" "$repo/refs" "$repo/snapshots/$commit" \
  | metered_send "$meters/tar" "$ARG_TARGET" "$(words mkdir -p "$hub") && $(words tar -C "$hub" -xf -)" >&2
status=$?
set -e
[ "$status" -eq 0 ] || failed "$status"
kill "$reporter" 2>/dev/null || true
reporter=""
after="$(worker_manifest "$ARG_TARGET" "$ARG_WORKER_BIN")"
[ "$after" = "$ARG_MANIFEST" ] \
  || fail "after the copy $ARG_WORKER reports '$after', the head has '$ARG_MANIFEST'" "the copy was incomplete (disk full?) or the cache is being changed concurrently"
sent="$(metered_bytes "$meters")"
echo "copied $ARG_MODEL@$commit to $ARG_WORKER ($files files, $bytes bytes; $sent bytes sent) in $(( SECONDS - started ))s"
sent_line "$sent" "$bytes" "${#kept[@]}" "${#resumed[@]}" "${#whole[@]}" "$relayed"
