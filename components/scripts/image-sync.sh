#!/usr/bin/env bash
# On the head: stream the image to one worker over the fabric, unless it already has it.
#   image-sync.sh --host H --worker W --target ssh://user@ip:port --image-id ID --ref REF
#                 --pinned NAME --worker-bin DIR --timeout-minutes M [--compress zstd|none]
#                 [--progress-seconds S]
#                 [--stall-seconds S] (a stream that moves nothing for S seconds is stopped)
#                 [--fabric-key K --fabric-known-hosts F]
#                 [--relay CHAIN]  (the first worker's step: every worker, `name|destination|bin`)
#                 [--remove yes]   (the destroy step: remove the image from the worker instead)
# The worker loads it with its own image-load.sh (in DIR, its scripts), which stages what arrives
# beside DIR and names the image NAME, the name every container uses there. "Has it" means NAME
# is there with the head's image's content (image_layers.py identity): an image ID differs
# between Docker's classic store and the containerd image store for the same image.
# `docker load` tags only after the whole stream arrived, so a cut link leaves nothing tagged.
# Layers the worker already holds (an update of an image it has) are not sent: the saved stream
# carries them as empty files, which `docker load` never reads (image_layers.py says why). The
# containerd image store takes such a stream too: its loader skips a blob it holds, and its
# unpacker a layer whose chain it has unpacked (checked in the lab with Docker 26.1); a worker
# whose load of the thinned stream fails anyway gets the image whole.
# A copy cut midway does not start again from nothing: the worker stages what arrives
# (image_stage.py receive, beside its scripts in image-stage/), and the next copy sends only
# what the stage lacks, completing a member staged in part from where it stopped.
# With --relay (two or more workers, the head's fabric key managed), the workers that lack the
# image get one stream that passes from worker to worker (relay.sh), so the head's link carries
# one copy, not one per worker; each worker's own step then finds the image there, or copies it
# itself when its part of the chain failed.
# Prints `spark-vllm-image-sent {"bytes": N, "layersKept": K, "layers": L, "relayed": R}` last.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host worker target image-id ref pinned worker-bin timeout-minutes
if [ "${ARG_REMOVE:-no}" = yes ]; then
  # Destroy with image.keepOnDestroy false: untag and remove it on the worker (gone is fine),
  # and what a cut copy left staged, in the worker's state leaf while it is this deployment's.
  fabric_ssh "$ARG_TARGET" "$(words docker image rm "$ARG_PINNED" "$ARG_REF" "$ARG_IMAGE_ID") >/dev/null 2>&1 || true"
  if [ -n "${ARG_OWNER:-}" ]; then
    leaf="$(dirname "$ARG_WORKER_BIN")"
    fabric_ssh "$ARG_TARGET" "if [ \"\$(cat $(words "$leaf/.spark-vllm-owner") 2>/dev/null)\" = $(words "$ARG_OWNER") ]; then rm -rf $(words "$leaf/image-stage"); fi" || true
  fi
  exit 0
fi
# Every probe of a worker's Docker is bounded: a wedged daemon answers nothing, and the copy
# that follows then fails on its watchdog, naming the worker, instead of hanging here.
PROBE_SECONDS=60
# remote_has DEST: DEST has the image under its pinned name, with the head's image's content.
remote_has() {
  local found
  found="$(fabric_ssh "$1" "$(words timeout "$PROBE_SECONDS" docker image inspect "$ARG_PINNED") 2>/dev/null" \
    | python3 "$SPARK_BIN/image_layers.py" identity 2>/dev/null || true)"
  [ -n "$identity" ] && [ "$found" = "$identity" ]
}
# layers_held DEST: how many of the image's leading layers DEST holds (from every image's layers
# there, one JSON list a line).
layers_held() {
  fabric_ssh "$1" "timeout $PROBE_SECONDS docker image ls -q --no-trunc | sort -u | xargs -r timeout $PROBE_SECONDS docker image inspect --format '{{json .RootFS.Layers}}'" 2>/dev/null \
    | python3 "$SPARK_BIN/image_layers.py" held "$layers" 2>/dev/null || echo 0
}
# has_zstd DEST: DEST can unpack a zstd stream.
has_zstd() { fabric_ssh "$1" "command -v zstd" >/dev/null 2>&1; }

meters="$(mktemp -d)"
reporter=""
trap '[ -z "$reporter" ] || kill "$reporter" 2>/dev/null || true; rm -rf "$meters" "$meters.staged" "$meters.list" "$meters.pid" "$meters.stalled"; fabric_multiplex_end' EXIT
fabric_multiplex
check_fabric_ssh "$ARG_TARGET"
# The image's content identity, what a worker's copy is compared with (image_layers.py).
identity="$(docker image inspect "$ARG_IMAGE_ID" 2>/dev/null | python3 "$SPARK_BIN/image_layers.py" identity || true)"
[ -n "$identity" ] \
  || fail "image $ARG_IMAGE_ID is not on the head" "it was removed after the pull; run 'pulumi up --refresh'"
# Save by reference when it names this exact image (keeps the tag), else by ID.
source_ref="$ARG_IMAGE_ID"
[ "$(docker image inspect --format '{{.Id}}' "$ARG_REF" 2>/dev/null)" = "$ARG_IMAGE_ID" ] && source_ref="$ARG_REF"
layers="$(docker image inspect --format '{{json .RootFS.Layers}}' "$ARG_IMAGE_ID" 2>/dev/null || echo '[]')"
layer_count="$(grep -o 'sha256:' <<<"$layers" | wc -l)"
compress="cat" decompress="cat"
export_fabric_ssh

# use_index N: sets `index`, the saved stream's index (which member holds which layer, every
# member's size), made once per image on this head; empty (send it whole) when N, the members
# the worker has (held layers, staged members), is 0, or when indexing fails.
index_dir="$(dirname "$SPARK_BIN")/image-index" index=""
use_index() {
  index=""
  [ "$1" -gt 0 ] || return 0
  local file="$index_dir/${ARG_IMAGE_ID#sha256:}.json"
  if [ ! -s "$file" ]; then
    # Copies to several workers run at once: each writes its own part, renamed into place.
    mkdir -p "$index_dir" && find "$index_dir" -name '*.json' ! -name "$(basename "$file")" -delete
    if docker save "$source_ref" | python3 "$SPARK_BIN/image_layers.py" index > "$file.$$"; then
      mv "$file.$$" "$file"
    else
      rm -f "$file.$$"
      note "$ARG_WORKER: reading the saved image's layers failed: sending it whole"
      return 0
    fi
  fi
  index="$file"
}
staged_names="$meters.staged"  # the members the worker has staged whole, one a line
: >"$staged_names"
# stream_size HELD: the bytes of the saved stream less its first HELD layers and the staged
# members (`whole`: all).
stream_size() {
  if [ "$1" = whole ] || [ -z "$index" ]; then
    docker image inspect --format '{{.Size}}' "$ARG_IMAGE_ID"
  else
    python3 "$SPARK_BIN/image_layers.py" to-send "$index" "$1" "$staged_names"
  fi
}
# load_command BIN: what a worker runs to load the stream, BIN its scripts (a shell word): its
# image-load.sh stages what arrives, loads it, names it, and records its process group beside
# the stage first, so a stalled copy can stop it there too (stop_remote_load).
load_command() {
  local format=plain
  [ "$decompress" = cat ] || format=zstd
  printf 'bash %s/image-load.sh %s %s %s' "$1" "$(words "${ARG_IMAGE_ID#sha256:}")" "$(words "$ARG_PINNED")" "$format"
}
# stop_remote_load BIN: after a stall, stop what the worker ran for the stream (a wedged
# `docker load` would otherwise hold the stage until it is killed by hand); bounded, best effort.
stop_remote_load() {
  local pidfile
  pidfile="$(dirname "$1")/image-stage/${ARG_IMAGE_ID#sha256:}.pid"
  timeout 30 bash -c 'fabric_ssh "$1" "$2"' stop "$ARG_TARGET" \
    "pidfile=$(words "$pidfile"); "'group="$(cat "$pidfile" 2>/dev/null)"; case "$group" in ""|*[!0-9]*) ;; *) grep -qs image-load "/proc/$group/cmdline" && kill -KILL -- "-$group";; esac; rm -f "$pidfile"' \
    >/dev/null 2>&1 || true
}
# stalled_fail: the message for a stream the watchdog stopped (report_progress).
stalled_fail() {
  stop_remote_load "$ARG_WORKER_BIN"
  fail "copying $ARG_REF to $ARG_WORKER stalled: nothing moved for ${ARG_STALL_SECONDS}s (timeouts.copyStallSeconds) after $(( $(cat "$meters.stalled") / 1000000 )) MB; the transfer was stopped and nothing was tagged there" \
    "$ARG_WORKER stopped taking the stream: its Docker daemon or disk is wedged (docker info there), or the fabric link stalled; the next run resumes from what it staged"
}
# send HELD METER DEST REMOTE [CHAIN]: the saved stream, its first HELD layers emptied (`whole`:
# all of it), counted into METER, to DEST's REMOTE command. With CHAIN, under an agent holding
# the fabric key for CHAIN's hops alone (lib.sh with_relay_agent), forwarded to DEST.
send() {
  local run=(bash -c)
  [ -z "${5:-}" ] || run=(bash -c 'with_relay_agent "$@"' send "$5" bash -c)
  timeout "${ARG_TIMEOUT_MINUTES}m" "${run[@]}" \
    'echo $$ >"${11}"; set -o pipefail; held=$6 layers_py=$7 index=$8 forward=$9 staged=${10}
     thin() { if [ "$held" = whole ] || [ -z "$index" ]; then cat; else python3 "$layers_py" filter "$index" "$held" "$staged"; fi; }
     docker save "$1" | thin | dd bs=1M status=progress 2>"$5" | $2 | fabric_ssh $forward "$3" "$4"' \
    image-sync "$source_ref" "$compress" "$3" "$4" "$2" "$1" \
    "$SPARK_BIN/image_layers.py" "$index" "$([ -z "${5:-}" ] || echo -A)" "$staged_names" \
    "$meters.pid"
}

relayed=0
# image_fact DEST BIN: what the chain needs to know of a worker: `unreachable`, `has` (the
# image), `staged` (a copy cut earlier: its own step resumes it), or
# `HELD zstd|plain` (the leading layers it holds, and whether it can unpack zstd).
image_fact() {
  fabric_ssh "$1" true >/dev/null 2>&1 || { echo unreachable; return 0; }
  ! remote_has "$1" || { echo has; return 0; }
  local stage
  stage="$(dirname "$2")/image-stage/${ARG_IMAGE_ID#sha256:}"
  if [ -n "$(fabric_ssh "$1" "$(words find "$stage" -type f -size +0) 2>/dev/null | head -n 1")" ]; then
    echo staged  # a copy cut earlier: its own step resumes it
    return 0
  fi
  local held
  held="$(layers_held "$1")"
  if has_zstd "$1"; then echo "$held zstd"; else echo "$held plain"; fi
}
# relay_to_chain: one stream through every worker of --relay that lacks the image, when two or
# more do; the others (and any a hop failed to reach) are left to their own steps.
relay_to_chain() {
  local line name chain="" least="" members=0 zstd="" position kind value
  local -a lines fact_files=()
  local facts
  facts="$(mktemp -d)"
  probe_members "$ARG_RELAY" "$facts" image_fact
  mapfile -t lines <<<"$ARG_RELAY"
  for position in $(seq "${#lines[@]}"); do fact_files+=("$facts/$position"); done
  # Which workers the chain takes, and what they all hold: copy_plan.py (table-tested).
  while read -r kind position value; do
    case "$kind" in
      member) chain+="${lines[position - 1]}"$'\n' members=$(( members + 1 )) ;;
      skip)
        [ "$value" = unreachable ] || continue
        IFS="|" read -r name _ <<<"${lines[position - 1]}"
        note "$name cannot be reached over the fabric: its own step copies the image" ;;
      least) least="$position" ;;
      zstd) zstd="$position" ;;
    esac
  done < <(python3 "$SPARK_BIN/copy_plan.py" image-chain "${fact_files[@]}")
  rm -rf "$facts"
  [ -n "$zstd" ] || { note "planning the relay chain failed (copy_plan.py): each worker's own step copies"; return 0; }
  chain="${chain%$'\n'}"
  [ "$members" -ge 2 ] || return 0
  [ "${ARG_COMPRESS:-none}" = zstd ] && command -v zstd >/dev/null && [ "$zstd" = yes ] \
    && compress="zstd -1 -T0 -q" decompress="zstd -d -q"
  use_index "$least"
  [ -n "$index" ] || least=0
  local size names sink started=$SECONDS
  # Each member stages what arrives beside its own scripts (relay.sh exports SPARK_BIN).
  size="$(stream_size "$least")" names="$(chain_names "$chain")"
  sink="$(load_command '"$SPARK_BIN"')"
  note "relaying $ARG_REF to $names in one chain (they all hold $least of $layer_count layers; $(( size / 1000000 )) MB)"
  run_chain "$names" image "$size" "$meters" "${ARG_PROGRESS_SECONDS:-10}" \
    send "$least" "$meters/relay" "$(chain_destination "$chain")" "$(chain_call "$sink" "$chain")" "$chain"
  mapfile -t lines <<<"$chain"
  for line in "${lines[@]}"; do
    IFS="|" read -r name dest _ <<<"$line"
    if remote_has "$dest"; then
      relayed=$(( relayed + 1 ))
    else
      note "$name did not get the image from the chain (relay status $(relayed_status "$chain_output" "$name"), stream exit $chain_exit): its own step copies it"
    fi
  done
  note "relayed $ARG_REF to $relayed of $members workers in $(( SECONDS - started ))s"
}
if [ -n "${ARG_RELAY:-}" ] && [ -n "${ARG_FABRIC_KEY:-}" ]; then
  relay_to_chain
fi

if remote_has "$ARG_TARGET"; then
  echo "$ARG_WORKER has $ARG_REF ($ARG_IMAGE_ID) as $ARG_PINNED; nothing more to copy"
  printf 'spark-vllm-image-sent {"bytes": %s, "layersKept": 0, "layers": 0, "staged": 0, "relayed": %s}\n' \
    "$(metered_bytes "$meters")" "$relayed"
  exit 0
fi
docker image inspect "$ARG_IMAGE_ID" >/dev/null 2>&1 \
  || fail "image $ARG_IMAGE_ID is not on the head" "it was removed after the pull; run 'pulumi up --refresh'"
if [ "${ARG_COMPRESS:-none}" = zstd ] && command -v zstd >/dev/null && has_zstd "$ARG_TARGET"; then
  compress="zstd -1 -T0 -q" decompress="zstd -d -q"
else
  compress="cat" decompress="cat"
fi
# complete_staged NAME HAVE WANT: append to the worker's staged member NAME the tail it lacks
# (a copy cut while NAME arrived left HAVE of its WANT bytes); fails when it is not whole after.
parts=0
complete_staged() {
  parts=$(( parts + 1 ))
  # docker save ends on a broken pipe once the member is out: the size below is the check.
  timeout "${ARG_TIMEOUT_MINUTES}m" bash -c \
    'docker save "$1" | python3 "$2" tail "$3" "$4" | dd bs=1M status=progress 2>"$5" | fabric_ssh "$6" "$7"' \
    resume "$source_ref" "$SPARK_BIN/image_stage.py" "$1" "$2" "$meters/part$parts" \
    "$ARG_TARGET" "cat >> $(words "$stage/$1")" >&2 || true
  [ "$(fabric_ssh "$ARG_TARGET" "$(words stat -c %s "$stage/$1")" 2>/dev/null)" = "$3" ] \
    || { note "$ARG_WORKER: completing its staged $1 failed: sending it again"; return 1; }
}

started=$SECONDS
# What an earlier run left loading on the worker (a head that died mid-copy, a load stopped by
# hand) would race this copy's writes to the stage: stopped first (only a stream of ours).
stop_remote_load "$ARG_WORKER_BIN"
held="$(layers_held "$ARG_TARGET")"
stage="$(dirname "$ARG_WORKER_BIN")/image-stage/${ARG_IMAGE_ID#sha256:}"
staged="$(fabric_ssh "$ARG_TARGET" "$(words find "$stage" -type f -size +0 -printf '%P %s\n') 2>/dev/null" || true)"
use_index $(( held + ${#staged} ))
# What the stream leaves out, and why: copy_plan.py (table-tested).
printf '%s\n' "$staged" >"$meters.list"
planned="$(python3 "$SPARK_BIN/copy_plan.py" image-copy "$layer_count" "$held" "${index:--}" "$meters.list")" \
  || planned="keep 0"$'\n'"why planning the copy failed (copy_plan.py): the whole image"
held=0
while IFS= read -r line; do
  read -r kind name have want <<<"$line"
  case "$kind" in
    keep) held=$name ;;
    whole) echo "$name" >>"$staged_names" ;;
    part) ! complete_staged "$name" "$have" "$want" || echo "$name" >>"$staged_names" ;;
    why) note "$ARG_WORKER: ${line#why }" ;;
  esac
done <<<"$planned"
size="$(stream_size "$held")"
note "$ARG_WORKER: sending $(( size / 1000000 )) MB of the image"
report_progress "$ARG_WORKER" image "$size" "$meters" "${ARG_PROGRESS_SECONDS:-10}" "${ARG_STALL_SECONDS:-0}" &
reporter=$!
load="$(load_command "$(words "$ARG_WORKER_BIN")")"
set +e
if [ -n "$index" ]; then
  send "$held" "$meters/save" "$ARG_TARGET" "$load" >&2
  status=$?
  # Not when the link is what failed, nor a stall: the whole image would fail the same way, slower.
  if [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ ! -e "$meters.stalled" ] \
    && fabric_ssh "$ARG_TARGET" true 2>/dev/null; then
    note "$ARG_WORKER: loading the image without the layers it holds failed (exit $status): sending it whole"
    held=0
    : >"$staged_names"
    send whole "$meters/whole" "$ARG_TARGET" "$load" >&2
    status=$?
  fi
else
  send whole "$meters/save" "$ARG_TARGET" "$load" >&2
  status=$?
fi
set -e
kill "$reporter" 2>/dev/null || true
reporter=""
elapsed=$(( SECONDS - started ))
[ "$status" -eq 0 ] || [ ! -e "$meters.stalled" ] || stalled_fail
if [ "$status" -ne 0 ]; then
  cause="the fabric link to $ARG_TARGET dropped, the worker's disk is full, or its Docker daemon failed"
  [ "$status" -eq 124 ] && cause="the transfer is slower than timeouts.imageTransferMinutes=$ARG_TIMEOUT_MINUTES allows"
  fail "copying $ARG_REF to $ARG_WORKER failed after ${elapsed}s (exit $status); nothing was tagged there" "$cause"
fi
remote_has "$ARG_TARGET" \
  || fail "after the copy $ARG_WORKER does not have image $ARG_IMAGE_ID as $ARG_PINNED" "the worker's Docker daemon rejected the image (architecture? disk?)"
echo "copied $ARG_REF ($ARG_IMAGE_ID) to $ARG_WORKER in ${elapsed}s"
printf 'spark-vllm-image-sent {"bytes": %s, "layersKept": %s, "layers": %s, "staged": %s, "relayed": %s}\n' \
  "$(metered_bytes "$meters")" "$held" "$layer_count" "$(grep -c . "$staged_names")" "$relayed"
