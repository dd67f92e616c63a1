"""NCCL releases users reported broken for multi-node vLLM on GB10, each with its source and, when
one exists, the setting that steers NCCL around the broken path.

Which NCCL a server loads is known only on the hosts: the image's (its torch's `nvidia-nccl`
wheel, or what VLLM_NCCL_SO_PATH names), or with vllm.hostNccl the host's. The image-facts step
reads it on every node (components/scripts/image_facts.py) and refuses a release on this list,
unless every model the image serves sets the neutraliser in its env; the rows reach it inside the
scripts bundle (components/bundle.py), so a stack's steps do not change when the list does.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownBadNccl:
    version: str  # the release, as ncclGetVersion gives it: MAJOR.MINOR.PATCH
    what: str  # what breaks
    source: str
    neutraliser: tuple[str, str] | None = None  # (variable, value) that avoids the broken path


KNOWN_BAD_NCCL = (
    # NVLS (NVLink SHARP) has nothing to do between Sparks (no NVLink, no NVSwitch); 2.30.4 takes
    # its path anyway and hangs silently while a MoE model loads at TP=8 over 8 Sparks. 2.30.3
    # works, and 2.30.4 with NCCL_NVLS_ENABLE=0 served 30/30 at the same speed (nccl#2167 and
    # vllm#40969's report).
    KnownBadNccl(
        "2.30.4",
        "its NVLS path hangs collectives silently on Sparks (no NVLink), with no error logged",
        "NVIDIA/nccl#2167",
        ("NCCL_NVLS_ENABLE", "0"),
    ),
)


def known_bad_rows(rows: Iterable[KnownBadNccl] = KNOWN_BAD_NCCL) -> list[dict[str, str]]:
    """The list as image_facts.py reads it (components/bundle.py ships it as JSON; a stack's
    own rows go in the image check's command)."""
    return [
        {
            "version": row.version,
            "what": row.what,
            "source": row.source,
            "neutraliser": f"{row.neutraliser[0]}={row.neutraliser[1]}" if row.neutraliser else "",
        }
        for row in rows
    ]


def neutralised(envs: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The neutralisers every one of `envs` (the env of each model one image serves) sets to
    their value: what the image-facts step may count as set. Empty when a model lacks one, so a
    stack that sets none keeps its step's command as it was."""
    envs = list(envs)
    found: dict[str, str] = {}
    for row in KNOWN_BAD_NCCL:
        if row.neutraliser is None or not envs:
            continue
        key, value = row.neutraliser
        if all(env.get(key) == value for env in envs):
            found[key] = value
    return found


def known_bad(
    version: str, env: Mapping[str, str], own: Iterable[KnownBadNccl] = ()
) -> KnownBadNccl | None:
    """The row that lists `version` (shipped, then the stack's `own`, whose version may be a
    shell pattern), unless `env` sets its neutraliser."""
    for row in (*KNOWN_BAD_NCCL, *own):
        if not version or not fnmatch.fnmatchcase(version, row.version):
            continue
        if row.neutraliser is not None and env.get(row.neutraliser[0]) == row.neutraliser[1]:
            return None
        return row
    return None


def refusal(row: KnownBadNccl, where: str, other: str) -> str:
    """The message for a listed release found at `where`, with the fixes (as image_facts.py
    words it for the image's)."""
    fixes = ""
    if row.neutraliser is not None:
        key, value = row.neutraliser
        fixes = f'set {key}: "{value}" in vllm.env (or each models[].env), or '
    return f"{where} is known to break this workload: {row.what} ({row.source}): {fixes}{other}"
