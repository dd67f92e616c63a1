#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian 12 machine, as root: the lab's Debian
# packages, shellcheck, uv, the locked Python dependencies, and the real Pulumi CLI built from
# the Go module proxy (scripts/build-pulumi.sh; needs Go, cached after the first build).
# Idempotent. SKIP_PULUMI_BUILD=1 leaves the CLI out (.ci/run builds it as a phase of its own).
set -euo pipefail
cd "$(dirname "$0")/.."

bash lab/install-deps.sh
if ! command -v shellcheck >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends shellcheck \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends shellcheck; }
fi
bash scripts/install-uv.sh
# pip puts uv in the interpreter's scripts dir, which a fresh shell may not have on PATH.
PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):/usr/local/bin:$PATH"
uv sync --frozen --quiet
[[ ${SKIP_PULUMI_BUILD:-} == 1 ]] || bash scripts/build-pulumi.sh
