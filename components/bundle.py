"""The step scripts (components/scripts/) as one reproducible archive, installed on each host by
its `<host>-scripts` step, and the one script that runs elsewhere: the server's launcher."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from stacks.nccl_versions import known_bad_rows
from stacks.plan.containers import EntryScripts

SCRIPTS_DIR = Path(__file__).parent / "scripts"


@dataclass(frozen=True)
class ScriptsBundle:
    archive_b64: str  # deterministic tar.gz of SCRIPTS_DIR, base64
    digest: str


# The known-bad NCCL releases (stacks/nccl_versions.py) as image-facts.sh reads them: in the
# bundle, so a change of the list is an update of each host's scripts, not of its steps.
NCCL_KNOWN_BAD_FILE = "nccl-known-bad.json"


def bundle_files() -> dict[str, bytes]:
    """Each file of the bundle by name: the step scripts, and the data they read."""
    files = {
        path.name: path.read_bytes()
        for path in sorted(SCRIPTS_DIR.iterdir())
        if path.is_file() and not path.name.startswith(".")
    }
    files[NCCL_KNOWN_BAD_FILE] = (json.dumps(known_bad_rows(), indent=1) + "\n").encode()
    return files


@cache
def scripts_bundle() -> ScriptsBundle:
    """The step scripts as one reproducible archive: same files, same bytes, no spurious diff."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(bundle_files().items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name.endswith(".sh") else 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    packed = gzip.compress(raw.getvalue(), mtime=0)
    return ScriptsBundle(
        archive_b64=base64.b64encode(packed).decode(),
        digest=hashlib.sha256(packed).hexdigest(),
    )


@cache
def entry_scripts() -> EntryScripts:
    """The scripts containers run as their entrypoint (`bash -c`): the server's launcher, the
    firewall gate before every Ray and vLLM process, and the firewall guard; (`sh -c`) the gate
    before node_exporter; and (`python3 -c`) the memory guard and its Docker filter."""
    return EntryScripts(
        launcher=(SCRIPTS_DIR / "vllm-launcher.sh").read_text(),
        gate=(SCRIPTS_DIR / "firewall-gate.sh").read_text(),
        guard=(SCRIPTS_DIR / "firewall.sh").read_text(),
        exporter_gate=(SCRIPTS_DIR / "exporter-gate.sh").read_text(),
        memory_guard=(SCRIPTS_DIR / "memory_guard.py").read_text(),
        docker_filter=(SCRIPTS_DIR / "docker_filter.py").read_text(),
    )


DIR_SAFETY_END = "SPARK_VLLM_DIR_SAFETY_PY"


def facts_script() -> str:
    """facts.sh after what it uses (snapshot.sh, and dir_safety.py as the shell function
    `dir_safety`): it runs from stdin, needs nothing installed."""
    checker = (SCRIPTS_DIR / "dir_safety.py").read_text()
    assert DIR_SAFETY_END not in checker  # it ends the here-document
    dir_safety = (
        f"dir_safety() {{\n  python3 - \"$@\" <<'{DIR_SAFETY_END}'\n{checker}{DIR_SAFETY_END}\n}}\n"
    )
    return (
        (SCRIPTS_DIR / "snapshot.sh").read_text()
        + dir_safety
        + (SCRIPTS_DIR / "facts.sh").read_text()
    )
