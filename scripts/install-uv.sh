#!/usr/bin/env bash
# Installs uv, if no uv is on PATH, so that the next command finds it. As root (or with sudo).
# - pip into the interpreter when it allows it (pyenv, a venv): uv lands in its scripts dir;
# - otherwise (PEP 668: the system Python of Debian 12 and Ubuntu 24.04 refuses `pip install`),
#   in a venv of its own under /opt/spark-vllm/uv, linked into /usr/local/bin.
set -euo pipefail
scripts_dir="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
PATH="$scripts_dir:$PATH"
if command -v uv >/dev/null; then
  exit 0
fi
if python3 -m pip install --quiet uv 2>/dev/null && command -v uv >/dev/null; then
  echo "uv installed with pip into $scripts_dir (put it on PATH if 'uv' is not found)"
  exit 0
fi
if ! python3 -c 'import ensurepip' 2>/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv; }
fi
python3 -m venv /opt/spark-vllm/uv
/opt/spark-vllm/uv/bin/pip install --quiet uv
ln -sf /opt/spark-vllm/uv/bin/uv /usr/local/bin/uv
echo "uv installed in /opt/spark-vllm/uv, linked as /usr/local/bin/uv"
