"""Runs inside the serving image (its own python3): what the image carries, before any container
of the deployment starts from it.

    python3 image_facts.py EXTRA_ARGS_JSON CHECK_FLAGS(yes|no) [EXECUTORS [KV_CACHE [REMOVED_JSON]]]

Prints one line `spark-vllm-image-facts {json}` (vllm and ray versions, the Ray vLLM requires,
Python, machine). Each problem is a line `problem: <key>: <what>` on stderr, and the exit is 3:
no `vllm` command, no Ray, a Ray older than vLLM's own requirement, or (CHECK_FLAGS yes) an
entry of vllm.extraArgs that is not a flag of this image's `vllm serve`, or a setting that names
what this image's vLLM removed (REMOVED_JSON: the rows of stacks/vllm_versions.py the stack's
settings match, `[{"key", "version", "what", "fix"}]`: refused from `version` on). Reads
nothing but the image's package metadata and `vllm serve --help`; imports neither vLLM nor Ray.
Mounted alone into the container (image-facts.sh): it imports nothing of ours (no hostlib.py).
"""

from __future__ import annotations

import difflib
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


def main() -> int:
    extra_args, check_flags = json.loads(sys.argv[1]), sys.argv[2] == "yes"
    # The executors the models use: `ray`, `mp`, or both (`ray,mp`: a Ray model beside others).
    executors = set((sys.argv[3] if len(sys.argv) > 3 else "ray").split(","))
    kv_cache = len(sys.argv) > 4 and sys.argv[4] == "yes"
    removed = json.loads(sys.argv[5]) if len(sys.argv) > 5 else []
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
