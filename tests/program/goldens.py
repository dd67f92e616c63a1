"""The committed stacks registered as the golden files hold them (tests/program/golden)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import composition.deployment as deployment_module
from components.bundle import ScriptsBundle
from components.facts import HostFacts
from tests.program.harness import evaluate, load_stack_config, unwrap

GOLDEN = Path(__file__).parent / "golden"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGoldenGoldenGoldenGoldenGoldenGolden0"


def steady_token(facts: HostFacts, step: str) -> str:
    """Receipt tokens are fresh per run on hosts that hold none (components/facts.py); here one
    per step, so the graph (and every ID derived from inputs) is the same on every run."""
    return hashlib.sha256(f"{facts.host}/{step}".encode()).hexdigest()[:12]


def graph(
    stack: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    rewrite: Callable[[dict[str, Any]], dict[str, Any]] = lambda config: config,
) -> str:
    """The stack's registered graph as the golden file holds it; `rewrite` changes its config
    first (the same stack written another way must register the same graph)."""
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n")
    known_hosts = tmp_path / "known_hosts"
    config = rewrite(load_stack_config(stack))
    addresses = [h["address"] for h in config["hosts"]] + [config.get("bastion", {}).get("address")]
    known_hosts.write_text("".join(f"{a} {HOST_KEY}\n" for a in addresses if a))
    config["ssh"] = {"privateKeyPath": str(key), "knownHostsFile": str(known_hosts)}
    monkeypatch.setenv("SPARK_VLLM_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setattr(HostFacts, "token", steady_token)
    # The scripts' content is pinned by the upgrade scenario of the lab, not here: an edit to a
    # host script is meant to be an update of `<host>-scripts`.
    monkeypatch.setattr(
        deployment_module, "scripts_bundle", lambda: ScriptsBundle("<archive>", "d" * 64)
    )
    secrets = {"apiKey": "golden-key-5d3a9c7e1f2b4086", "hfToken": "hf_golden"}
    evaluation = evaluate(config, secrets, stack=stack)
    resources = [
        {
            "urn": r.urn,
            "parent": r.parent,
            "dependencies": sorted(r.dependencies),
            "provider": r.provider.split("::")[-2] if r.provider else "",
            "deleteBeforeReplace": r.delete_before_replace,
            "replaceOnChanges": r.replace_on_changes,
            "customTimeouts": r.custom_timeouts,
            "inputs": unwrap(r.registered),
        }
        for r in sorted(evaluation.registrations, key=lambda r: r.urn)  # order is async
    ]
    return json.dumps(resources, indent=1, sort_keys=True).replace(str(tmp_path), "<tmp>") + "\n"
