#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian 12 machine, as root: the lab's Debian
# packages, shellcheck, uv, and the locked Python dependencies. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

bash lab/install-deps.sh
if ! command -v shellcheck >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends shellcheck \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends shellcheck; }
fi
# pip puts uv in the interpreter's scripts dir, which a fresh shell may not have on PATH.
PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
if ! command -v uv >/dev/null; then
  python3 -m pip install --quiet uv
fi
uv sync --frozen --quiet
