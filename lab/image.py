"""The lab image `spark-vllm-lab:latest`, built offline from this machine's Debian files.

No registry and no debootstrap: the rootfs is the files of a few installed Debian packages, the
shared libraries their programs and Python extensions need (found with ldd), and a relocatable
venv (Debian's /usr/bin/python3) holding Ray, huggingface_hub and the vLLM stand-in. The tarball
is cached under the cache dir, keyed by a hash of every input, and `docker import`ed on the head.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lab.proc import LabError, run

LAB_DIR = Path(__file__).resolve().parent
STANDIN_DIR = LAB_DIR / "image" / "vllm_standin"
VENV_IN_IMAGE = "opt/venv"
REQUIREMENTS = ("ray==2.60.0", "huggingface_hub")
IMAGE_LABEL = "spark-vllm-lab.rootfs"
IMAGE_PATH = f"/{VENV_IN_IMAGE}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Whole Debian packages copied into the image (their libraries are added by the ldd pass).
PACKAGES = (
    "base-files",
    "netbase",
    "bash",
    "coreutils",
    "tar",
    "gzip",
    "findutils",
    "procps",
    "grep",
    "sed",
    "curl",
    "dash",
    "debianutils",
    "util-linux",
    "hostname",
    "less",
    "zstd",
    "iproute2",
    "libc6",
    "libc-bin",
    "libstdc++6",
    "libgcc-s1",
    "zlib1g",
    "python3-minimal",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "mime-support",
    "media-types",
    "ca-certificates",
    "tzdata",
    # The front's proxy: the lab's stand-in for the official haproxy image (stacks/plan/front.py).
    "haproxy",
)
SKIP_PREFIXES = (
    "/usr/share/doc/",
    "/usr/share/man/",
    "/usr/share/info/",
    "/usr/share/locale/",
    "/usr/share/lintian/",
    "/usr/share/bug/",
)
# Files of the machine every image needs, whichever packages own them.
EXTRA_FILES = (
    "/bin/sh",
    "/usr/bin/which",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ld.so.conf",
    "/etc/ld.so.cache",
    "/etc/ssl/certs/ca-certificates.crt",
)
MERGED_USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}


def installed_packages() -> dict[str, str]:
    """name -> version of those PACKAGES that are installed (some are optional)."""
    fmt = "${Package} ${Version} ${db:Status-Status}\n"
    result = run(["dpkg-query", "-W", f"-f={fmt}", *PACKAGES], timeout=30, check=False)
    found = {}
    for line in result.stdout.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "installed":
            found[parts[0]] = parts[1]
    for required in ("bash", "coreutils", "libc6", "python3.11-minimal", "libpython3.11-stdlib"):
        if required not in found:
            raise LabError(
                f"image build: Debian package {required} is not installed (run lab/install-deps.sh)"
            )
    return found


def standin_files() -> list[Path]:
    if not (STANDIN_DIR / "pyproject.toml").exists() and not (STANDIN_DIR / "setup.py").exists():
        return []
    skip = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", ".venv"}
    return sorted(
        p
        for p in STANDIN_DIR.rglob("*")
        if p.is_file()
        and not skip.intersection(p.relative_to(STANDIN_DIR).parts)
        and not p.name.endswith(".egg-info")
    )


def inputs_hash(packages: dict[str, str]) -> str:
    """Changes whenever anything that ends up in the image could change."""
    h = hashlib.sha256()
    for name, version in sorted(packages.items()):
        h.update(f"pkg {name} {version}\n".encode())
    h.update(("req " + " ".join(REQUIREMENTS) + "\n").encode())
    h.update(Path(__file__).read_bytes())
    for path in standin_files():
        h.update(f"file {path.relative_to(STANDIN_DIR)}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


# -- collecting the machine's files -------------------------------------------------------------


def normalized(path: str) -> str:
    """The path with its directory resolved (/bin/bash -> /usr/bin/bash on merged-/usr), so no
    entry of the tarball goes through one of the image's top-level symlinks."""
    parent, base = os.path.split(path)
    return os.path.join(os.path.realpath(parent), base)


def package_files(packages: dict[str, str]) -> set[str]:
    result = run(["dpkg", "-L", *packages], timeout=60, what="image build: dpkg -L")
    files = set()
    for line in result.stdout.decode().splitlines():
        if not line.startswith("/") or line.startswith(SKIP_PREFIXES):
            continue
        path = normalized(line)
        if os.path.islink(path) or os.path.isfile(path):
            files.update(symlink_chain(path))  # e.g. /usr/bin/which -> /etc/alternatives/which
    for extra in EXTRA_FILES:
        files.update(symlink_chain(extra))
    return files


def is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def shared_libraries(elf_files: list[str]) -> set[str]:
    """Libraries (and their symlink chains) the given programs and extensions load."""
    libs: set[str] = set()
    for start in range(0, len(elf_files), 200):
        chunk = elf_files[start : start + 200]
        out = subprocess.run(["ldd", *chunk], capture_output=True, timeout=120).stdout.decode()
        for line in out.splitlines():
            parts = line.split()
            candidates = [p for p in parts if p.startswith("/") and not p.endswith(":")]
            for lib in candidates:
                libs.update(symlink_chain(lib))
    return libs


def symlink_chain(path: str) -> set[str]:
    """path, and every link it goes through, down to the real file."""
    chain = set()
    current = normalized(path)
    for _ in range(20):
        if not os.path.lexists(current):
            break
        chain.add(current)
        if not os.path.islink(current):
            break
        current = normalized(os.path.join(os.path.dirname(current), os.readlink(current)))
    return chain


def with_parents(files: set[str]) -> list[str]:
    """Directory entries first so the tarball recreates modes of every parent."""
    entries = set(files)
    for path in files:
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            entries.add(parent)
            parent = os.path.dirname(parent)
    return sorted(entries)


# -- the venv -----------------------------------------------------------------------------------


def build_venv(venv: Path, log: Path) -> None:
    """A relocatable venv, so its scripts keep working at /opt/venv inside the image."""
    if venv.exists():
        shutil.rmtree(venv)
    uv = shutil.which("uv")
    reqs = list(REQUIREMENTS)
    if standin_files():
        reqs.append(str(STANDIN_DIR))
    with log.open("ab") as out:
        if uv:
            steps = [
                [uv, "venv", "--relocatable", "--python", "/usr/bin/python3", str(venv)],
                [uv, "pip", "install", "--python", str(venv / "bin/python"), *reqs],
            ]
        else:
            raise LabError("image build: `uv` not found on PATH (it builds the image's venv)")
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))
        }
        for argv in steps:
            try:
                done = subprocess.run(argv, stdout=out, stderr=out, timeout=900, env=env)
            except subprocess.TimeoutExpired as exc:
                raise LabError(f"image build: {argv[1:3]} timed out; see {log}") from exc
            if done.returncode != 0:
                raise LabError(f"image build: {' '.join(argv[:4])}... failed; see {log}")


# -- the tarball --------------------------------------------------------------------------------


def write_skeleton(skel: Path, already: set[str]) -> list[str]:
    """Top-level entries the packages do not provide (merged-/usr links, /tmp, /root...);
    returns the names to archive, leaving out those already listed (docker import rejects
    duplicate paths)."""
    if skel.exists():
        shutil.rmtree(skel)
    skel.mkdir(parents=True)
    names = []
    for name, target in MERGED_USR_LINKS.items():
        os.symlink(target, skel / name)
        names.append(name)
    for d, mode in (
        ("tmp", 0o1777),
        ("root", 0o700),
        ("run", 0o755),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("opt", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("etc", 0o755),
    ):
        (skel / d).mkdir(parents=True, exist_ok=True)
        os.chmod(skel / d, mode)
        if d not in already:
            names.append(d)
    return names


def build_tarball(out: Path, workdir: Path, packages: dict[str, str], log: Path) -> None:
    venv = workdir / "venv"
    build_venv(venv, log)
    files = package_files(packages)
    elves = [p for p in files if not os.path.islink(p) and is_elf(p)]
    elves += [str(p) for p in venv.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    files |= shared_libraries(elves)
    files.discard(normalized("/usr/lib/x86_64-linux-gnu/libfakeroot"))
    entries = [p.lstrip("/") for p in with_parents(files) if p.lstrip("/") not in MERGED_USR_LINKS]
    listing = workdir / "files.txt"
    listing.write_text("".join(e + "\n" for e in entries))
    skel = workdir / "skel"
    skel_entries = write_skeleton(skel, already=set(entries))
    partial = out.with_suffix(".partial")
    tar = ["tar", "--numeric-owner", "--no-recursion"]
    run(
        [*tar, "-C", "/", "-cf", str(partial), "-T", str(listing)],
        timeout=300,
        what="image build: tar of Debian files",
    )
    run(
        [
            "tar",
            "--numeric-owner",
            "--no-recursion",
            "-C",
            str(skel),
            "-rf",
            str(partial),
            *skel_entries,
        ],
        timeout=60,
        what="image build: tar of skeleton",
    )
    run(
        [
            "tar",
            "--numeric-owner",
            "-C",
            str(workdir),
            "-rf",
            str(partial),
            f"--transform=s,^venv,{VENV_IN_IMAGE},",
            "venv",
        ],
        timeout=300,
        what="image build: tar of venv",
    )
    partial.rename(out)


def rootfs_tarball(cache_dir: Path) -> tuple[Path, str]:
    """(path, hash) of the cached rootfs tarball, built if missing. Serialized by a lock so
    two labs starting at once build it once."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    packages = installed_packages()
    digest = inputs_hash(packages)
    out = cache_dir / f"rootfs-{digest}.tar"
    with (cache_dir / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in [*cache_dir.glob("build-*"), *cache_dir.glob("rootfs-*.partial")]:
            # left by a build that was killed (we hold the lock: nobody else is building)
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink()
        if out.exists():
            return out, digest
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix="build-") as tmp:
            build_tarball(out, Path(tmp), packages, cache_dir / "build.log")
        for stale in cache_dir.glob("rootfs-*.tar"):
            if stale != out:
                stale.unlink()
        (cache_dir / "build.log").open("a").write(
            f"built {out.name} in {time.monotonic() - started:.1f}s\n"
        )
    return out, digest


def import_argv(digest: str) -> list[str]:
    changes = [
        f"ENV PATH={IMAGE_PATH}",
        "ENV LANG=C.UTF-8",
        f"ENV VIRTUAL_ENV=/{VENV_IN_IMAGE}",
        "WORKDIR /root",
        'CMD ["bash"]',
        f"LABEL {IMAGE_LABEL}={digest}",
    ]
    argv = ["docker", "import"]
    for change in changes:
        argv += ["--change", change]
    return [*argv, "-", "spark-vllm-lab:latest"]
