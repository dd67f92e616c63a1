"""The API key's container label (stacks/plan/containers.py secret_label): an HMAC of the
deployment's name keyed with the key, never the key's bare hash; a container an earlier release
labelled with that bare hash keeps it while the key is the same, so the upgrade replaces no
container (a label is a ForceNew input: a new value would)."""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
from pathlib import Path

import pulumi
import pytest

from components.bundle import facts_script
from components.facts import parse_facts
from stacks.plan.containers import API_KEY_HASH_LABEL, secret_label, unsalted_label
from tests.engine.diff import TYPE_CONTAINER
from tests.mockvalues import unwrap_secrets
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import Evaluation, FakeHosts, evaluate
from tests.program.scripting import fake_bin

KEY = "sk-test-api-key-0b7c1e9f3a"
OTHER = "sk-test-api-key-other-5e8d2c"


def keyed(value: str, deployment: str) -> str:
    message = f"spark-vllm label {deployment}".encode()
    return hmac.new(value.encode(), message, hashlib.sha256).hexdigest()[:16]


@pytest.mark.parametrize(
    ("value", "running", "label"),
    [
        # A new container: keyed, never the key's bare hash.
        (KEY, None, keyed(KEY, "p/dev")),
        # An earlier release's label for this same key: kept (no replacement for it).
        (KEY, hashlib.sha256(KEY.encode()).hexdigest()[:16], unsalted_label(KEY)),
        # The label this release gave it: the same again.
        (KEY, keyed(KEY, "p/dev"), keyed(KEY, "p/dev")),
        # The key changed (the container is replaced for it anyway): keyed.
        (KEY, unsalted_label(OTHER), keyed(KEY, "p/dev")),
        (KEY, keyed(OTHER, "p/dev"), keyed(KEY, "p/dev")),
        # No key: as before.
        ("", None, "none"),
    ],
)
def test_the_key_label(value: str, running: str | None, label: str) -> None:
    assert secret_label(value, "p/dev", running) == label


def test_two_deployments_with_one_key_have_labels_unlike() -> None:
    assert secret_label(KEY, "p/dev", None) != secret_label(KEY, "p/lab", None)
    assert unsalted_label(KEY) not in (secret_label(KEY, "p/dev", None),)


class EarlierRelease(FakeHosts):
    """Hosts where every container of `names` runs with the label `value` (facts.sh's
    `key-label` lines), or, with `lines`, that answer those."""

    def __init__(self, names: list[str], value: str, lines: str = "") -> None:
        super().__init__()
        self.lines = lines or "".join(f"key-label {name} {value}\n" for name in names)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        answer, more = super().call(args)
        return {**answer, "stdout": answer["stdout"] + self.lines}, more


def key_labels(ev: Evaluation) -> dict[str, str]:
    """Each container carrying the key label: its name on the host -> the label's value."""
    found = {}
    for reg in ev.by_type(TYPE_CONTAINER):
        labels = {lab["label"]: lab["value"] for lab in reg.inputs.get("labels", [])}
        if API_KEY_HASH_LABEL in labels:
            found[reg.inputs["name"]] = unwrap_secrets(labels[API_KEY_HASH_LABEL])
    return found


def test_an_upgrade_keeps_the_labels_an_earlier_release_gave(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    fresh = key_labels(evaluate(config, SECRETS))
    assert fresh and set(fresh.values()) == {keyed(SECRETS["apiKey"], "spark-vllm/dev")}
    bare = unsalted_label(SECRETS["apiKey"])
    upgraded = key_labels(evaluate(config, SECRETS, mocks=EarlierRelease(list(fresh), bare)))
    assert upgraded == dict.fromkeys(fresh, bare)
    # A key changed at the same time: every container is labelled (and replaced) anew.
    changed = EarlierRelease(list(fresh), unsalted_label(OTHER))
    assert key_labels(evaluate(config, SECRETS, mocks=changed)) == fresh


FAKE_DOCKER_PS = """#!/usr/bin/env bash
[ "$1" = ps ] || exit 0
echo "spark-vllm-front 0123456789abcdef"
echo "spark-vllm-vllm fedcba9876543210"
echo "unlabelled "
"""


def test_facts_read_each_containers_key_label(host_tmp: Path) -> None:
    """facts.sh as the program runs it, with a Docker that lists two labelled containers (and
    one whose label is empty: no line), read into the host's facts."""
    done = run_facts(host_tmp, FAKE_DOCKER_PS)
    assert done.returncode == 0, done.stderr
    assert parse_facts("spark1", done.stdout).key_labels == {
        "spark-vllm-front": "0123456789abcdef",
        "spark-vllm-vllm": "fedcba9876543210",
    }


def test_labels_docker_could_not_list_stop_the_run(make_config: ConfigFactory) -> None:
    """Not knowing the running label, the program would give a new one, and replace every
    server of an earlier release: it stops, naming the host and why."""
    unread = EarlierRelease([], "", lines="key-label-error docker ps: permission denied\n")
    with pytest.raises(Exception, match="cannot list the containers' key labels") as caught:
        evaluate(make_config(hosts=2), SECRETS, mocks=unread)
    assert "(docker ps: permission denied)" in str(caught.value)
    assert "likely cause: Docker on spark1 did not answer" in str(caught.value)


def run_facts(host_tmp: Path, docker: str) -> subprocess.CompletedProcess[str]:
    """facts.sh as the facts step runs it, with `docker` as the host's docker CLI."""
    env = fake_bin(host_tmp, docker=docker)
    return subprocess.run(
        ["bash", "-s", "--", str(host_tmp / "state"), str(host_tmp / "hf")],
        input=facts_script(),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


FAILING_DOCKER_PS = """#!/usr/bin/env bash
echo "permission denied while trying to connect to the Docker daemon socket" >&2
exit 1
"""


def test_facts_say_why_docker_did_not_list_them(host_tmp: Path) -> None:
    done = run_facts(host_tmp, FAILING_DOCKER_PS)
    assert done.returncode == 0, done.stderr
    found = parse_facts("spark1", done.stdout)
    assert found.key_labels == {}
    assert found.key_labels_unread == (
        "docker ps: permission denied while trying to connect to the Docker daemon socket"
    )
