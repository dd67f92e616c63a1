"""Runs inside the serving image (its own python3): what the image carries, before any container
of the deployment starts from it.

    python3 image_facts.py EXTRA_ARGS_JSON CHECK_FLAGS(yes|no) [EXECUTORS [KV_CACHE [REMOVED_JSON
        [NCCL_KNOWN_BAD_JSON NCCL_ENV_JSON HOST_NCCL MOUNTED_NCCL]]]]]

Prints one line `spark-vllm-image-facts {json}` (vllm and ray versions, the Ray vLLM requires,
Python, machine). Each problem is a line `problem: <key>: <what>` on stderr, and the exit is 3:
no `vllm` command, no Ray, a Ray older than vLLM's own requirement, or (CHECK_FLAGS yes) an
entry of vllm.extraArgs that is not a flag of this image's `vllm serve`, or a setting that names
what this image's vLLM removed (REMOVED_JSON: the rows of stacks/vllm_versions.py the stack's
settings match, `[{"key", "version", "what", "fix"}]`: refused from `version` on), or an NCCL
release on the known-bad list (NCCL_KNOWN_BAD_JSON, stacks/nccl_versions.py) that the models'
env (NCCL_ENV_JSON) does not neutralise. The facts name the NCCL vLLM will load (its path,
release, and why that one) and HOST_NCCL, the host's own (empty: none); MOUNTED_NCCL is the host
library mounted in this run (vllm.hostNccl, which sets VLLM_NCCL_SO_PATH), empty otherwise.
Reads nothing but the image's package metadata, `vllm serve --help` and the NCCL library's
bytes; imports neither vLLM nor Ray.
Mounted alone into the container (image-facts.sh): it imports nothing of ours (no hostlib.py).
"""

from __future__ import annotations

import ctypes
import difflib
import fnmatch
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata

HELP_SECONDS = 240
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def provider_of(command: str) -> metadata.Distribution | None:
    """The installed distribution whose console script is `command` (`vllm` for vLLM)."""
    for dist in metadata.distributions():
        for entry in dist.entry_points:
            if entry.group == "console_scripts" and entry.name == command:
                return dist
    return None


def ray_requirement(dist: metadata.Distribution) -> str:
    """The version specifier `dist` puts on `ray` (not counting optional extras), or ''."""
    for line in dist.requires or []:
        requirement, _, marker = line.partition(";")
        name = re.split(r"[\s\[<>=!~(]", requirement.strip(), maxsplit=1)[0]
        if name.lower() != "ray" or re.search(r"\bextra\s*==", marker):
            continue
        return requirement.strip()[len(name) :].split("]", 1)[-1].strip(" ()")
    return ""


def satisfies(version: str, specifier: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet

        return SpecifierSet(specifier).contains(version, prereleases=True)
    except ImportError:  # no packaging in the image: a `>=` floor is the common case
        floor = re.search(r">=\s*([\d.]+)", specifier)
        if floor is None:
            return True
        numbers = [int(n) for n in re.findall(r"\d+", version)[:3]]
        return numbers >= [int(n) for n in floor.group(1).split(".")[:3]]


def normalized(flag: str) -> str:
    """vLLM's parser takes `--max_model_len` for `--max-model-len`."""
    dashes = len(flag) - len(flag.lstrip("-"))
    return flag[:dashes] + flag[dashes:].replace("_", "-")


def serve_flags() -> set[str] | None:
    """Every flag `vllm serve` lists: `--help=all` (vLLM 0.10 on groups its help), else `--help`."""
    for argv in (["vllm", "serve", "--help=all"], ["vllm", "serve", "--help"]):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=HELP_SECONDS)
        except (OSError, subprocess.TimeoutExpired):
            continue
        flags = set(FLAG.findall(done.stdout))
        if done.returncode == 0 and len(flags) > 5:
            return {normalized(f) for f in flags}
    return None


def flag_problems(extra_args: list[str], known: set[str], vllm: str) -> list[str]:
    problems = []
    for index, arg in enumerate(extra_args):
        if not arg.startswith("-") or re.match(r"-\d", arg):
            continue  # a value, not a flag
        flag = normalized(arg.split("=", 1)[0])
        if flag in known:
            continue
        close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        problems.append(
            f"vllm.extraArgs[{index}]: {flag} is not a flag of this image's `vllm serve` "
            f"(vllm {vllm}){hint}"
        )
    return problems


def release(version: str) -> tuple[int, ...] | None:
    """As stacks/vllm_versions.py reads a version: `0.34.0rc1` is (0, 34, 0), a pre-release of
    0.34 already without what 0.34 removed (PEP 440 would put it before 0.34)."""
    found = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    return tuple(int(part) for part in found.groups(default="0")) if found else None


def removal_problems(removed: list[dict[str, str]], vllm: str) -> list[str]:
    """Each setting whose variable or flag this vLLM no longer has, keyed, with the fix."""
    have = release(vllm)
    problems = []
    for row in removed:
        floor = release(row["version"])
        if have is None or floor is None or have < floor:
            continue
        problems.append(
            f"{row['key']}: vLLM {row['version']} removed it ({row['what']}; this image has "
            f"vllm {vllm}): {row['fix']}"
        )
    return problems


# --- NCCL --------------------------------------------------------------------------------------

# torch's NCCL wheel (nvidia-nccl-cu12/cu13) in a site directory: torch links it through its
# RPATH, so after `import torch` this is the `libnccl.so.2` vLLM's pynccl opens by name.
WHEEL_NCCL = os.path.join("nvidia", "nccl", "lib", "libnccl.so.2")
# NCCL builds its banner into the library "so that running `strings` on the lib can quickly
# reveal the version" (src/init.cc VERSION_STRING): "NCCL version 2.28.9+cuda13.0".
NCCL_BANNER = re.compile(rb"NCCL version (\d+\.\d+\.\d+)")
CHUNK = 16 * 1024 * 1024


def nccl_library() -> tuple[str, str]:
    """The NCCL vLLM will load and why, as vllm/utils/nccl.py find_nccl_library and the loader
    choose it: VLLM_NCCL_SO_PATH; else `libnccl.so.2` by name, which is an LD_PRELOADed one, else
    the copy torch linked (its wheel), else the loader's. ('', 'none') when there is none."""
    named = os.environ.get("VLLM_NCCL_SO_PATH", "")
    if named:
        return named, "VLLM_NCCL_SO_PATH"
    for preloaded in re.split(r"[\s:]+", os.environ.get("LD_PRELOAD", "")):
        if os.path.basename(preloaded).startswith("libnccl.so"):
            return preloaded, "LD_PRELOAD"
    for directory in sys.path:
        wheel = os.path.join(directory or ".", WHEEL_NCCL)
        if os.path.isfile(wheel):
            return wheel, "torch's nvidia-nccl wheel"
    found = loader_nccl()
    return (found, "the loader's path") if found else ("", "none")


def loader_nccl() -> str:
    """libnccl.so.2 as the image's loader finds it: its cache (`ldconfig -p`), else
    LD_LIBRARY_PATH."""
    for ldconfig in ("ldconfig", "/sbin/ldconfig"):
        try:
            listed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in listed.stdout.splitlines():
            words = line.split()
            if words and words[0] == "libnccl.so.2" and words[-1].startswith("/"):
                return words[-1]
        break
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        candidate = os.path.join(directory, "libnccl.so.2")
        if directory and os.path.isfile(candidate):
            return candidate
    return ""


def version_from_code(code: int) -> str:
    """ncclGetVersion's code: MAJOR*10000 + MINOR*100 + PATCH since 2.9, MAJOR*1000 + MINOR*100
    + PATCH before (nccl.h NCCL_VERSION)."""
    major, rest = (code // 10000, code % 10000) if code >= 10000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def banner_version(path: str) -> str:
    """The release in the library's own banner, read as bytes: nothing of the library runs,
    so no GPU, driver or dependency is needed. '' when there is none."""
    tail = b""
    try:
        with open(path, "rb") as library:
            while chunk := library.read(CHUNK):
                found = NCCL_BANNER.search(tail + chunk)
                if found:
                    return found.group(1).decode()
                tail = chunk[-64:]
    except OSError:
        return ""
    return ""


def loaded_version(path: str) -> tuple[str, str]:
    """(release, '') from ncclGetVersion, which returns the code it was built with (no device is
    touched), or ('', why) when the library does not load in this image."""
    try:
        library = ctypes.CDLL(path)
        code = ctypes.c_int(0)
        if library.ncclGetVersion(ctypes.byref(code)) != 0 or code.value <= 0:
            return "", "ncclGetVersion failed"
        return version_from_code(code.value), ""
    except (OSError, AttributeError) as error:
        return "", str(error)


def nccl_facts(mounted: str) -> tuple[dict[str, str], list[str]]:
    """What vLLM will load: its path, release and why that one, and the problem of a host's
    library (vllm.hostNccl, `mounted`) that does not load in this image."""
    path, why = nccl_library()
    facts = {"path": path, "from": why, "version": ""}
    if not path:
        return facts, []
    facts["version"] = banner_version(path)
    # A host library must load here (its glibc against the image's): load it, as vLLM will.
    if mounted or not facts["version"]:
        version, error = loaded_version(path)
        facts["version"] = facts["version"] or version
        if mounted and error:
            return facts, [
                f"vllm.hostNccl: the host's NCCL ({mounted}) does not load in this image: {error}"
            ]
    return facts, []


def nccl_problems(
    nccl: dict[str, str], known_bad: list[dict[str, str]], env: dict[str, str], mounted: str
) -> list[str]:
    """A release on the known-bad list that the models' env does not neutralise: keyed where it
    came from (the host's with vllm.hostNccl, else the image's), with the fixes."""
    problems = []
    for row in known_bad:
        # A release, or a shell pattern for several (the stack's own rows: `2.30.*`).
        version = nccl.get("version") or ""
        if not version or not fnmatch.fnmatchcase(version, row["version"]):
            continue
        key, _, value = row.get("neutraliser", "").partition("=")
        if key and env.get(key) == value:
            continue
        if mounted:
            where = f"vllm.hostNccl: the host's NCCL {nccl['version']} ({mounted})"
            other = "install another libnccl2 release on the host, or set vllm.hostNccl: false"
        else:
            where = f"image.ref: the image's NCCL {nccl['version']} ({nccl['path']})"
            other = "use an image with another NCCL, or set vllm.hostNccl: true"
        fixes = f'set {key}: "{value}" in vllm.env (or each models[].env), or ' if key else ""
        problems.append(
            f"{where} is known to break this workload: {row['what']} ({row['source']}): "
            f"{fixes}{other}"
        )
    return problems


def main() -> int:
    extra_args, check_flags = json.loads(sys.argv[1]), sys.argv[2] == "yes"
    # The executors the models use: `ray`, `mp`, or both (`ray,mp`: a Ray model beside others).
    executors = set((sys.argv[3] if len(sys.argv) > 3 else "ray").split(","))
    kv_cache = len(sys.argv) > 4 and sys.argv[4] == "yes"
    removed = json.loads(sys.argv[5]) if len(sys.argv) > 5 else []
    nccl_known_bad = json.loads(sys.argv[6]) if len(sys.argv) > 6 else []
    nccl_env = json.loads(sys.argv[7]) if len(sys.argv) > 7 else {}
    host_nccl = sys.argv[8] if len(sys.argv) > 8 else ""
    mounted = sys.argv[9] if len(sys.argv) > 9 else ""
    nccl_known_bad += json.loads(sys.argv[10]) if len(sys.argv) > 10 else []  # the stack's own
    nccl, nccl_load_problems = nccl_facts(mounted)
    dist = provider_of("vllm")
    vllm = dist.version if dist is not None else None
    try:
        ray: str | None = metadata.version("ray")
    except metadata.PackageNotFoundError:
        ray = None
    required = ray_requirement(dist) if dist is not None else ""
    facts = {
        "vllm": vllm,
        "ray": ray,
        "rayRequired": required,
        "python": platform.python_version(),
        "machine": platform.machine(),
        # The image's user, whose uid owns what the servers put in the host's /dev/shm
        # (--ipc=host): the RemoveIPC check (host_rules.py ipc) compares it with the SSH user's.
        "uid": os.getuid(),
        # The NCCL vLLM and torch will load (path, release, why that one), and the host's own.
        "ncclPath": nccl["path"],
        "ncclVersion": nccl["version"],
        "ncclFrom": nccl["from"],
        "hostNccl": host_nccl,
    }
    print("spark-vllm-image-facts " + json.dumps(facts, sort_keys=True))
    problems = []
    if vllm is None:
        problems.append("image.ref: has no `vllm` command (no installed package provides it)")
    if "ray" not in executors:
        pass  # vLLM's mp executor needs no Ray
    elif ray is None:
        problems.append(
            "image.ref: has no `ray` package, which vllm.executor ray needs (vLLM's images "
            "ship without Ray since about 0.18): set vllm.executor: mp (vLLM's own multi-node "
            "mode, the default), or use an image with Ray"
        )
    elif required and not satisfies(ray, required):
        problems.append(f"image.ref: ray {ray} does not satisfy vllm {vllm}'s ray{required}")
    if vllm is not None:
        problems += removal_problems(removed, vllm)
    problems += nccl_load_problems + nccl_problems(nccl, nccl_known_bad, nccl_env, mounted)
    if check_flags and vllm is not None:
        known = serve_flags()
        if known is None:
            problems.append("image.ref: `vllm serve --help` did not list its flags")
        else:
            problems += flag_problems(extra_args, known, vllm)
            if kv_cache and "--kv-cache-memory-bytes" not in known:
                problems.append(
                    f"image.ref: vllm {vllm} has no --kv-cache-memory-bytes: vllm.kvCache "
                    "needs vLLM 0.10.2 or newer (or leave vllm.kvCache unset)"
                )
            if "mp" in executors and not {"--nnodes", "--headless"} <= known:
                problems.append(
                    f"image.ref: vllm {vllm} has no --nnodes/--headless: vllm.executor mp "
                    "needs vLLM 0.11.1 or newer (or use executor ray)"
                )
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
