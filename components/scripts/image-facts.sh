#!/usr/bin/env bash
# On any node: what the serving image carries, read before any container starts from it: its
# architecture against this host's, then (run once, no network) vllm and ray present, their
# versions, and with --check-flags yes, vllm.extraArgs against the image's own `vllm serve`.
#   image-facts.sh --host H --image NAME --ref REF --extra-args JSON --check-flags yes|no
#                  --executor ray|mp --timeout-seconds S --enable-linger yes|no [--kv-cache yes]
#                  [--removed JSON]
# (--kv-cache yes: vllm.kvCache is set, so `vllm serve` must take --kv-cache-memory-bytes;
# --removed: the settings that name what a vLLM release removed, refused if this one did.)
# Prints `spark-vllm-image-facts {json}` as its last line.
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host image ref extra-args check-flags executor timeout-seconds enable-linger

image_arch="$(docker image inspect --format '{{.Architecture}}' "$ARG_IMAGE" 2>/dev/null)" \
  || fail "image $ARG_REF ($ARG_IMAGE) is not on this host" "it was removed after the pull or the copy; run 'pulumi up --refresh'"
case "$(uname -m)" in
  x86_64) host_arch=amd64 ;;
  aarch64 | arm64) host_arch=arm64 ;;
  *) host_arch="$(uname -m)" ;;
esac
[ "$image_arch" = "$host_arch" ] \
  || fail "image.ref $ARG_REF is built for $image_arch, but this host is $host_arch" \
    "a tag pulled for another platform: set image.platform to linux/$host_arch, or use an image built for it"

set +e
output="$(timeout "$ARG_TIMEOUT_SECONDS" docker run --rm --network none \
  -v "$SPARK_BIN/image_facts.py:/spark-vllm/image_facts.py:ro" \
  --entrypoint python3 "$ARG_IMAGE" /spark-vllm/image_facts.py \
  "$ARG_EXTRA_ARGS" "$ARG_CHECK_FLAGS" "$ARG_EXECUTOR" "${ARG_KV_CACHE:-no}" \
  "${ARG_REMOVED:-[]}" 2>&1)"
status=$?
set -e
facts="$(grep '^spark-vllm-image-facts ' <<<"$output" | tail -n 1 || true)"
if [ "$status" -eq 3 ]; then
  problems="$(sed -n 's/^problem: //p' <<<"$output")"
  problems="${problems//image.ref: /"image.ref $ARG_REF: "}"
  fail "the image cannot serve this stack: ${problems//$'\n'/; }" \
    "the image is not a vLLM image (with Ray, for executor ray), or a setting names a flag or variable this vLLM does not have (${facts#spark-vllm-image-facts })"
fi
if [ "$status" -ne 0 ] || [ -z "$facts" ]; then
  cause="the image has no python3, or it does not run on this host"
  [ "$status" -eq 124 ] && cause="the image took longer than ${ARG_TIMEOUT_SECONDS}s to list its flags"
  fail "running image $ARG_REF once failed (exit $status): $(tail -n 3 <<<"$output" | paste -sd ' ' -)" "$cause"
fi
# logind's RemoveIPC and the servers' shared memory: gathered here, where the image's user (the
# owner of what the servers put in the host's /dev/shm) is known; host_rules.py decides.
image_uid="$(sed -n 's/.*"uid": \([0-9][0-9]*\).*/\1/p' <<<"$facts")"
rootless=no
grep -q rootless <<<"$(timeout 20 docker info --format '{{.SecurityOptions}}' 2>/dev/null || true)" \
  && rootless=yes
python3 "$SPARK_BIN/host_rules.py" ipc --host "$ARG_HOST" --root "${SPARK_VLLM_ROOT:-/}" \
  --user "$(id -un)" --uid "$(id -u)" --image-uid "${image_uid:-0}" --rootless "$rootless" \
  --enable-linger "$ARG_ENABLE_LINGER" || exit 1
printf '%s\n' "$facts"
