#!/usr/bin/env bash
# After a step succeeded: record its receipt, the token the program gave it and the checks that
# must keep holding for the step's work to count as done. facts.sh re-checks them on every run;
# a receipt whose checks fail makes the program re-run that step (and only that step).
#   receipt.sh --host H --state-dir D --step S --token T --checks 'kind|arg;kind|arg...'
#              [--worker W --target ssh://user@ip:port --worker-bin B --fabric-key K --fabric-known-hosts F]
# With --target the receipt is written on that worker (the step ran on the head for it).
# Checks (resolved here, at write time, into what facts.sh compares):
#   files|PATH...            each PATH exists and is not empty
#   sha256sums|DIR           DIR's files as now (writes DIR/.sha256sums)
#   mark|DIR                 DIR is still this directory, not a new one at the same path
#                            (containers bind it): a mark file named after the step is left in it
#   image|ID                 Docker has image ID
#   snapshot|CACHE|MODEL|REV[|INCLUDE|EXCLUDE]  the model snapshot as now ("commit files bytes"),
#                            only the files kept by the include/exclude patterns (JSON lists)
#   known-host|FILE|NAME     FILE pins a key for NAME
#   authorized|MARKER        ~/.ssh/authorized_keys holds a line with MARKER
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/snapshot.sh"
parse_flags "$@"
require host state-dir step token checks
if [ -n "${ARG_TARGET:-}" ]; then
  require worker worker-bin
  remote=(bash "$ARG_WORKER_BIN/receipt.sh" --host "$ARG_WORKER" --state-dir "$ARG_STATE_DIR"
          --step "$ARG_STEP" --token "$ARG_TOKEN" --checks "$ARG_CHECKS")
  fabric_ssh "$ARG_TARGET" "$(words "${remote[@]}")" \
    || fail "cannot record step $ARG_STEP on $ARG_TARGET" "the fabric SSH session dropped"
  exit 0
fi
resolve() {
  local fields
  IFS='|' read -r -a fields <<<"$1"
  case "${fields[0]}" in
    sha256sums)
      (cd "${fields[1]}" && find . -maxdepth 1 -type f ! -name '.*' -printf '%P\0' | sort -z \
        | xargs -0 sha256sum > .sha256sums) || fail "cannot checksum ${fields[1]}"
      echo "$1" ;;
    mark)
      # Inode numbers are reused at once, so the directory's identity is a random mark in it.
      local mark
      mark="$(cat /proc/sys/kernel/random/uuid)"
      printf '%s\n' "$mark" > "${fields[1]}/.spark-vllm-mark.$ARG_STEP" \
        || fail "cannot mark ${fields[1]}" "the directory is missing or not writable"
      echo "$1|$mark" ;;
    snapshot)
      local manifest manifest_words filter=()
      [ "${#fields[@]}" -le 4 ] || filter=("$SPARK_BIN/weights_filter.py" "${fields[@]:4:2}")
      manifest="$(snapshot_manifest "${fields[1]}" "${fields[2]}" "${fields[3]}" "${filter[@]}")" \
        || fail "$manifest"
      read -r -a manifest_words <<<"$manifest"
      # The patterns last: a receipt without them (no filter) reads as before.
      printf 'snapshot|%s|%s|%s|%s|%s' "${fields[1]}" "${fields[2]}" "${manifest_words[@]}"
      [ "${#fields[@]}" -le 4 ] || printf '|%s|%s' "${fields[@]:4:2}"
      echo ;;
    files|image|known-host|authorized) echo "$1" ;;
    *) fail "unknown check '${fields[0]}'" "a bug in spark-vllm: please report it" ;;
  esac
}
umask 077
dir="$ARG_STATE_DIR/receipts"
mkdir -p "$dir"
{
  echo "$ARG_TOKEN"
  IFS=';' read -r -a checks <<<"$ARG_CHECKS"
  for check in "${checks[@]}"; do resolve "$check"; done
} > "$dir/.$ARG_STEP.tmp"
mv "$dir/.$ARG_STEP.tmp" "$dir/$ARG_STEP"
