#!/usr/bin/env bash
# On the head: bring one worker's copy of the snapshot to the head's over the fabric, sending only
# what the worker lacks, then verify files and bytes there. HF cache blobs are content-addressed
# (named by their sha256, or git sha1 for small files), so a blob the worker holds whole is kept;
# one it holds in part (a copy cut midway) is resumed from where it stopped and its sha256
# checked; only this revision's blobs are considered. tar keeps the snapshot's symlinks intact.
#   weights-sync.sh --host H --worker W --target ssh://user@ip:port --worker-bin DIR --cache-dir C
#                   --model M --manifest "commit files bytes" --timeout-minutes T
#                   [--progress-seconds S] [--fabric-key ...]
# Prints `spark-vllm-weights-sent {json}` (bytes sent, blobs kept, resumed, sent) as its last line.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host worker target worker-bin cache-dir model manifest timeout-minutes
PROGRESS_SECONDS="${ARG_PROGRESS_SECONDS:-10}"
read -r commit files bytes <<<"$ARG_MANIFEST"
repo="models--${ARG_MODEL//\//--}"
hub="$ARG_CACHE_DIR/hub"
worker_blobs="$hub/$repo/blobs"

worker_manifest() {
  fabric_ssh "$ARG_TARGET" "$(words bash "$ARG_WORKER_BIN/hf-manifest.sh" --host "$ARG_WORKER" \
    --cache-dir "$ARG_CACHE_DIR" --model "$ARG_MODEL" --revision "$commit")" 2>&1
}
sent_line() {
  printf 'spark-vllm-weights-sent {"bytes":%s,"total":%s,"kept":%s,"resumed":%s,"sent":%s}\n' "$@"
}
check_fabric_ssh "$ARG_TARGET"
if [ "$(worker_manifest)" = "$ARG_MANIFEST" ]; then
  echo "$ARG_WORKER already has $ARG_MODEL@$commit ($files files, $bytes bytes); nothing copied"
  sent_line 0 "$bytes" "$files" 0 0
  exit 0
fi
snapshot="$hub/$repo/snapshots/$commit"
[ -d "$snapshot" ] || fail "the head has no snapshot $commit of $ARG_MODEL" "the fetch step did not complete"

# The revision's blobs (what its snapshot links to), with the head's sizes.
declare -A head_size=()
while read -r link; do
  blob="$(readlink -f "$link")"
  head_size["$(basename "$blob")"]="$(stat -c %s "$blob")"
done < <(find "$snapshot" -type l)
declare -A worker_size=()
sizes_call="$(words bash "$ARG_WORKER_BIN/hf-blob-sizes.sh" --host "$ARG_WORKER" \
  --cache-dir "$ARG_CACHE_DIR" --model "$ARG_MODEL")"
sizes="$(printf '%s\n' "${!head_size[@]}" | fabric_ssh "$ARG_TARGET" "$sizes_call" 2>&1)" \
  || fail "cannot read which blobs $ARG_WORKER has: ${sizes//$'\n'/ }" "the worker's scripts are missing (run pulumi up again)"
while read -r name size; do worker_size["$name"]="$size"; done <<<"$sizes"

# Kept: whole on the worker. Resumed: an LFS blob (sha256-named, so checkable) held in part.
# Sent whole: the rest (a git-sha1-named blob is small: sent again rather than resumed).
kept=() resumed=() whole=() to_send=0
for name in "${!head_size[@]}"; do
  have="${worker_size[$name]:-0}" want="${head_size[$name]}"
  if [ "$have" -eq "$want" ]; then
    kept+=("$name")
  elif [ "$have" -gt 0 ] && [ "$have" -lt "$want" ] && [[ "$name" =~ ^[0-9a-f]{64}$ ]]; then
    resumed+=("$name:$have"); to_send=$(( to_send + want - have ))
  else
    whole+=("$repo/blobs/$name"); to_send=$(( to_send + want ))
  fi
done
echo "$ARG_WORKER: $ARG_MODEL@$commit: ${#kept[@]} blob(s) kept, ${#resumed[@]} resumed, ${#whole[@]} to send; $to_send of $bytes bytes to go" >&2

export_fabric_ssh
started=$SECONDS
meters="$(mktemp -d)"  # one dd progress log per transfer: what went into ssh, counted by dd
report_progress "$ARG_WORKER" weights "$to_send" "$meters" "$PROGRESS_SECONDS" &
reporter=$!
trap 'kill "$reporter" 2>/dev/null || true; rm -rf "$meters"' EXIT

# metered_send LOG REMOTE_COMMAND: stdin to the worker's REMOTE_COMMAND over the fabric, counted.
# Bounded by the step's timeout; prints the remote command's output.
metered_send() {
  timeout "${ARG_TIMEOUT_MINUTES}m" bash -c \
    'set -o pipefail; dd bs=1M status=progress 2>"$1" | fabric_ssh "$2" "$3"' \
    weights-sync "$1" "$ARG_TARGET" "$2"
}
failed() {
  local cause="the fabric link to $ARG_TARGET dropped or the worker's disk is full"
  [ "$1" -eq 124 ] && cause="the copy is slower than timeouts.weightsTransferMinutes=$ARG_TIMEOUT_MINUTES allows"
  fail "copying $ARG_MODEL to $ARG_WORKER failed after $(( SECONDS - started ))s (exit $1; $(metered_bytes "$meters") of $to_send bytes sent, the next run resumes)" "$cause"
}
index=0
for entry in "${resumed[@]}"; do
  name="${entry%%:*}" offset="${entry##*:}" index=$(( index + 1 ))
  blob="$worker_blobs/$name"
  set +e
  out="$(tail -c "+$(( offset + 1 ))" "$hub/$repo/blobs/$name" \
    | metered_send "$meters/$index" "$(words cat) >> $(words "$blob") && $(words sha256sum "$blob")")"
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
  | metered_send "$meters/tar" "$(words mkdir -p "$hub") && $(words tar -C "$hub" -xf -)" >&2
status=$?
set -e
[ "$status" -eq 0 ] || failed "$status"
kill "$reporter" 2>/dev/null || true
after="$(worker_manifest)"
[ "$after" = "$ARG_MANIFEST" ] \
  || fail "after the copy $ARG_WORKER reports '$after', the head has '$ARG_MANIFEST'" "the copy was incomplete (disk full?) or the cache is being changed concurrently"
sent="$(metered_bytes "$meters")"
echo "copied $ARG_MODEL@$commit to $ARG_WORKER ($files files, $bytes bytes; $sent bytes sent) in $(( SECONDS - started ))s"
sent_line "$sent" "$bytes" "${#kept[@]}" "${#resumed[@]}" "${#whole[@]}"
