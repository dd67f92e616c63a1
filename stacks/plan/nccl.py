"""vllm.hostNccl: every Ray and vLLM container loads the host's own NCCL instead of the image's.

A TP=2 server on two Sparks wedged after 20-26 minutes under load with the image's pip-bundled
NCCL and ran clean with DGX OS's libnccl2 of the same version, a different build (vllm#42354).
The host's library is read from its facts (components/facts.py: `ldconfig -p`), so a stack that
does not set it plans exactly as before.

Which library a server loads (vLLM's vllm/utils/nccl.py find_nccl_library, and torch): vLLM's
own NCCL wrapper (pynccl) opens VLLM_NCCL_SO_PATH when set, else `libnccl.so.2`, which after
`import torch` is the copy torch was linked with (its `nvidia-nccl-cu*` wheel, found through
torch's RPATH). torch's own process groups (ProcessGroupNCCL: the collective the watchdog of
vllm#42354 caught was one of theirs, `_ALLGATHER_BASE`) always use that linked copy, whatever
VLLM_NCCL_SO_PATH says. So VLLM_NCCL_SO_PATH alone would leave two NCCLs in one process, the
image's still under torch. LD_PRELOAD loads the host's first: the loader then satisfies torch's
DT_NEEDED `libnccl.so.2` with the already loaded object of that soname, and pynccl's open of
VLLM_NCCL_SO_PATH returns the same one. One NCCL per process, as the user of vllm#42354 got by
replacing the wheel's file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from stacks.nccl_versions import KnownBadNccl, known_bad, neutralised, refusal
from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.container_paths import CONTAINER_HOST_NCCL

# Where the host's library is mounted in each container (read-only): a path of our own, so it
# never hides a file of the image.
HOST_NCCL_TARGET = CONTAINER_HOST_NCCL
INSTALL_HINT = "sudo apt install libnccl2"


@dataclass(frozen=True)
class HostNccl:
    """A host's NCCL: the path its loader cache lists, and the release of the file it is."""

    path: str  # e.g. /usr/lib/aarch64-linux-gnu/libnccl.so.2 (libnccl2's soname link)
    version: str  # from the file the link resolves to (libnccl.so.2.28.9: 2.28.9); "" unknown


def parse_host_nccl(line: str) -> HostNccl | None:
    """facts.sh's `nccl PATH RESOLVED` (after the word): None when the host lists none."""
    words = line.split()
    if not words or not words[0].startswith("/"):
        return None
    resolved = words[1] if len(words) > 1 else words[0]
    return HostNccl(words[0], nccl_file_version(resolved))


def nccl_file_version(path: str) -> str:
    """The release a library file's name carries: `libnccl.so.2.28.9` -> `2.28.9`; a name
    without one (a wheel's plain `libnccl.so.2`) -> ''."""
    found = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)$", path)
    return found.group(1) if found else ""


def host_nccl_problems(plan: ClusterPlan, found: Mapping[str, HostNccl | None]) -> list[str]:
    """With vllm.hostNccl, each host that has no NCCL of its own, or one of a known-bad release
    the models do not neutralise (read on every run: an `apt upgrade` is seen by the next `up`),
    keyed, with the fix."""
    if not plan.config.vllm.host_nccl:
        return []
    # Every model loads the host's: a neutraliser counts when all of them set it.
    env = neutralised(slot.model.settings.env for slot in plan.servers)
    problems = []
    for node in plan.nodes:
        library = found.get(node.name)
        if library is None:
            problems.append(
                f"vllm.hostNccl: {node.name} has no NCCL of its own (no libnccl.so.2 in its "
                f"loader cache, `ldconfig -p`): install it there (`{INSTALL_HINT}`, NVIDIA's "
                "CUDA repository on DGX OS), or set vllm.hostNccl: false to use the image's"
            )
            continue
        row = known_bad(library.version, env, own_known_bad(plan))
        if row is not None:
            where = f"vllm.hostNccl: {node.name}'s NCCL {library.version} ({library.path})"
            other = "install another libnccl2 release there, or set vllm.hostNccl: false"
            problems.append(refusal(row, where, other))
    return problems


def own_known_bad(plan: ClusterPlan) -> tuple[KnownBadNccl, ...]:
    """The stack's own known-bad NCCL releases (preflight.knownBad, kind nccl)."""
    return tuple(
        KnownBadNccl(e.version, e.reason, e.source or "preflight.knownBad")
        for e in plan.config.preflight.known_bad
        if e.kind == "nccl"
    )


def with_host_nccl(plan: ClusterPlan, found: Mapping[str, HostNccl | None]) -> ClusterPlan:
    """`plan` with each node's host library, when vllm.hostNccl (host_nccl_problems first)."""
    if not plan.config.vllm.host_nccl:
        return plan
    nodes = []
    for node in plan.nodes:
        library = found.get(node.name)
        assert library is not None, f"{node.name}: refused by host_nccl_problems"
        nodes.append(replace(node, host_nccl=library.path))
    return replace(plan, nodes=tuple(nodes))


def host_nccl_env(node: NodePlan) -> dict[str, str]:
    """What points vLLM and torch at the mounted host library (see the module's docstring)."""
    if not node.host_nccl:
        return {}
    return {"VLLM_NCCL_SO_PATH": HOST_NCCL_TARGET, "LD_PRELOAD": HOST_NCCL_TARGET}


def nccl_output(facts: Mapping[str, str]) -> dict[str, str]:
    """The `nccl` output, from the head's image facts (components/scripts/image_facts.py): the
    release vLLM loads, its path, why that one (VLLM_NCCL_SO_PATH with vllm.hostNccl, torch's
    wheel, ...), and the host's own library (empty: none)."""
    return {
        "version": facts.get("ncclVersion", ""),
        "path": facts.get("ncclPath", ""),
        "from": facts.get("ncclFrom", ""),
        "host": facts.get("hostNccl", ""),
    }
