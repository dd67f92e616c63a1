"""The lab's monitoring image `spark-vllm-lab-monitoring:latest`: Debian's Prometheus and
node_exporter (lab/install-deps.sh), standing in for the official `prom/prometheus` and
`prom/node-exporter` images users pull (no registry here). Like those, each program is on PATH
under the name the plan runs (`prometheus`, `node_exporter`), with nothing else but the C
library they load and, as the official images' busybox base has, a static busybox's sh.
Grafana has no Debian package: the lab runs none (its dashboards are checked through their
queries, tests/lab/test_several_models.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from lab.image import shared_libraries, with_parents
from lab.proc import LabError

MONITORING_IMAGE = "spark-vllm-lab-monitoring:latest"
PROGRAMS = {
    "prometheus": "/usr/bin/prometheus",
    "node_exporter": "/usr/bin/prometheus-node-exporter",
}
# The official images are built on busybox (quay.io/prometheus/busybox): node_exporter's gate
# (components/scripts/exporter-gate.sh) runs with its sh and these applets. Debian's static
# busybox (busybox-static, lab/install-deps.sh) stands in.
BUSYBOX = "/usr/bin/busybox"
APPLETS = ("sh", "cat", "date", "stat", "sleep")
IMAGE_FILES = ("/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
# Prometheus's web UI as Debian serves it (the classic one, from files, its scripts links into
# /usr/share/javascript): copied as files, and of moment-timezone's 200 MB only what it loads.
WEB_DIR = "/usr/share/prometheus"
TIMEZONE_DATA = "moment-timezone-with-data.min.js"


def web_files() -> list[str]:
    """Every file of WEB_DIR, links followed (tar --dereference stores them as files)."""
    found = []
    for root, dirs, names in os.walk(WEB_DIR, followlinks=True):
        if root.endswith("/moment-timezone"):
            dirs.clear()
            names = [TIMEZONE_DATA]
        found += [os.path.join(root, name) for name in names]
    return sorted(found)


def monitoring_rootfs(out: Path) -> str:
    """Write the image's rootfs tarball to `out`; returns its digest (the inputs' hash)."""
    missing = [path for path in (*PROGRAMS.values(), BUSYBOX) if not os.path.exists(path)]
    if missing:
        raise LabError(f"monitoring image: {missing} missing: run lab/install-deps.sh")
    files = set(PROGRAMS.values()) | shared_libraries(list(PROGRAMS.values())) | {BUSYBOX}
    files |= {path for path in IMAGE_FILES if os.path.exists(path)}
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(f"{path} {os.path.getsize(path)} {os.path.getmtime(path)}\n".encode())
    with tempfile.TemporaryDirectory() as tmp:
        skel = Path(tmp)
        for name in ("usr/local/bin", "tmp", "prometheus"):
            (skel / name).mkdir(parents=True)
        os.chmod(skel / "tmp", 0o1777)
        for name, path in PROGRAMS.items():
            os.symlink(path, skel / "usr/local/bin" / name)
        for applet in APPLETS:
            os.symlink(BUSYBOX, skel / "usr/local/bin" / applet)
        # The merged-/usr links the loader's path needs (/lib64/ld-linux...).
        for link, target in {"lib": "usr/lib", "lib64": "usr/lib64", "bin": "usr/bin"}.items():
            os.symlink(target, skel / link)
        listing = skel / "files.txt"
        entries = [p.lstrip("/") for p in with_parents(files)]
        listing.write_text("".join(f"{e}\n" for e in entries if e not in ("lib", "lib64", "bin")))
        tar = ["tar", "--numeric-owner", "--no-recursion"]
        for argv in (
            [*tar, "-C", "/", "-cf", str(out), "-T", str(listing)],
            [*tar, "-C", str(skel), "-rf", str(out), "lib", "lib64", "bin", "tmp", "prometheus",
             "usr/local", "usr/local/bin",
             *(f"usr/local/bin/{n}" for n in (*PROGRAMS, *APPLETS))],
            ["tar", "--numeric-owner", "--dereference", "-C", "/", "-rf", str(out),
             *(path.lstrip("/") for path in web_files())],
        ):  # fmt: skip
            done = subprocess.run(argv, capture_output=True, timeout=120)
            if done.returncode != 0:
                raise LabError(f"monitoring image: {argv[:4]}: {done.stderr.decode()[-1000:]}")
    return h.hexdigest()[:16]


def import_argv() -> list[str]:
    path = "/usr/local/bin:/usr/bin:/bin"
    return ["docker", "import", "--change", f"ENV PATH={path}", "-", MONITORING_IMAGE]
