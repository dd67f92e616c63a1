#!/usr/bin/env bash
# On any node: what the serving image carries, read before any container starts from it: its
# architecture against this host's, then (run once, no network) vllm and ray present, their
# versions, and with --check-flags yes, vllm.extraArgs against the image's own `vllm serve`.
#   image-facts.sh --host H --image NAME --ref REF --extra-args JSON --check-flags yes|no
#                  --executor ray|mp --timeout-seconds S --enable-linger yes|no [--kv-cache yes]
#                  [--removed JSON] [--nccl-env JSON] [--known-bad-nccl JSON]
#                  [--host-nccl PATH --nccl-target PATH]
# (--kv-cache yes: vllm.kvCache is set, so `vllm serve` must take --kv-cache-memory-bytes;
# --removed: the settings that name what a vLLM release removed, refused if this one did;
# --nccl-env: the neutralisers of known-bad NCCL releases every model sets (stacks/
# nccl_versions.py; the list itself is the bundle's nccl-known-bad.json); --known-bad-nccl: the
# stack's own rows (preflight.knownBad, kind nccl), in the same form; --host-nccl:
# vllm.hostNccl, the host's library, mounted at --nccl-target and loaded as the servers will.)
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

# The host's own NCCL (reported either way), and with vllm.hostNccl, that one in the run, as the
# servers get it (stacks/plan/nccl.py: VLLM_NCCL_SO_PATH and LD_PRELOAD).
host_nccl="$(PATH="$PATH:/sbin:/usr/sbin" timeout 10 ldconfig -p 2>/dev/null \
  | awk '$1 == "libnccl.so.2" { print $NF; exit }')"
nccl_run=()
if [ -n "${ARG_HOST_NCCL:-}" ]; then
  [ -e "$ARG_HOST_NCCL" ] \
    || fail "vllm.hostNccl: the host's NCCL $ARG_HOST_NCCL is gone" \
      "libnccl2 was removed since this run began: install it again (sudo apt install libnccl2), or set vllm.hostNccl: false"
  nccl_run=(-v "$ARG_HOST_NCCL:$ARG_NCCL_TARGET:ro" -e "VLLM_NCCL_SO_PATH=$ARG_NCCL_TARGET"
    -e "LD_PRELOAD=$ARG_NCCL_TARGET")
fi
# The bundle's list (components/bundle.py); the scripts' source directory, as tests run it, has none.
known_bad_nccl="$(cat "$SPARK_BIN/nccl-known-bad.json" 2>/dev/null || echo '[]')"
set +e
output="$(timeout "$ARG_TIMEOUT_SECONDS" docker run --rm --network none \
  -v "$SPARK_BIN/image_facts.py:/spark-vllm/image_facts.py:ro" "${nccl_run[@]}" \
  --entrypoint python3 "$ARG_IMAGE" /spark-vllm/image_facts.py \
  "$ARG_EXTRA_ARGS" "$ARG_CHECK_FLAGS" "$ARG_EXECUTOR" "${ARG_KV_CACHE:-no}" \
  "${ARG_REMOVED:-[]}" "$known_bad_nccl" "${ARG_NCCL_ENV:-"{}"}" "$host_nccl" \
  "${ARG_HOST_NCCL:-}" "${ARG_KNOWN_BAD_NCCL:-[]}" 2>&1)"
status=$?
set -e
facts="$(grep '^spark-vllm-image-facts ' <<<"$output" | tail -n 1 || true)"
if [ "$status" -eq 3 ]; then
  problems="$(sed -n 's/^problem: //p' <<<"$output")"
  problems="${problems//image.ref: /"image.ref $ARG_REF: "}"
  fail "the image cannot serve this stack: ${problems//$'\n'/; }" \
    "the image is not a vLLM image (with Ray, for executor ray), a setting names a flag or variable this vLLM does not have, or the NCCL it would load is known to break (${facts#spark-vllm-image-facts })"
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
