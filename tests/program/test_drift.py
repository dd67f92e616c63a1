"""Drift of what commands made (components/facts.py): the program reads each host's receipts
before it plans, and a step whose receipt no longer holds is planned again, alone, as the
engine plans a changed `create` (an update: pulumi-command replaces only on `triggers`).
The hosts here are FakeHosts, which keep the receipts the steps recorded; a test removes one,
as a user's `docker image prune` or `rm -rf` would, and previews the next run."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from tests.mockvalues import ProviderInvokeError
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import FakeHosts, evaluate, recorded_receipts, unwrap


class DriftedHosts(FakeHosts):
    """The hosts an earlier up left, less the receipts of `lost` steps (their checks fail)."""

    def __init__(self, *lost: str) -> None:
        super().__init__()
        self.lost = set(lost)

    def remember(self, state: dict[str, Any]) -> None:
        super().remember(state)
        for step in self.lost:
            assert self.receipts.pop(step, None) is not None, f"{step} recorded no receipt"


def deployed_config(make_config: ConfigFactory) -> dict[str, Any]:
    return make_config(hosts=2)


def drift(make_config: ConfigFactory, *lost: str) -> dict[str, str]:
    config = deployed_config(make_config)
    up = evaluate(config, SECRETS)
    preview = evaluate(config, SECRETS, mocks=DriftedHosts(*lost), preview=True, prior=up)
    return {name: step for name, step in preview.steps.items() if step != "same"}


def test_every_step_that_leaves_something_on_a_host_records_a_receipt(
    make_config: ConfigFactory,
) -> None:
    up = evaluate(deployed_config(make_config), SECRETS)
    recorded: dict[str, str] = {}
    for registration in up.by_type("command:remote:Command"):
        recorded |= recorded_receipts(unwrap(registration.inputs.get("create")))
    assert sorted(recorded) == [
        "fabric-head-key",
        "fabric-spark2-authorize",
        "fabric-spark2-pin",
        "front-api-key",
        "front-config",
        "image-head-record",
        "image-spark2-sync",
        "spark1-mounts",
        "spark1-scripts",
        "spark2-mounts",
        "spark2-scripts",
        "weights-fetch",
        "weights-spark2-copy",
    ]


def test_healthy_hosts_plan_nothing(make_config: ConfigFactory) -> None:
    assert drift(make_config) == {}


@pytest.mark.parametrize(
    ("lost", "expected"),
    [
        # A worker's image pruned: copied again from the head; nothing else runs.
        ("image-spark2-sync", {"image-spark2-sync": "update"}),
        # The snapshot deleted on the head: fetched again. Preview cannot know the manifest
        # the fetch will print, so the worker's copy shows as an update too; in the up it is
        # the same manifest, and the copy stays as it is.
        ("weights-fetch", {"weights-fetch": "update", "weights-spark2-copy": "update"}),
        ("weights-spark2-copy", {"weights-spark2-copy": "update"}),
        ("spark2-scripts", {"spark2-scripts": "update"}),
        ("fabric-spark2-authorize", {"fabric-spark2-authorize": "update"}),
        ("fabric-spark2-pin", {"fabric-spark2-pin": "update"}),
        ("front-api-key", {"front-api-key": "update"}),
        ("front-config", {"front-config": "update"}),
    ],
)
def test_a_lost_receipt_reruns_exactly_its_step(
    make_config: ConfigFactory, lost: str, expected: dict[str, str]
) -> None:
    assert drift(make_config, lost) == expected


def test_a_new_fabric_key_is_authorized_again(make_config: ConfigFactory) -> None:
    """The key is regenerated, so its public half (stdout) is unknown in preview: the step
    that authorizes it on the worker takes it on stdin and runs again."""
    assert drift(make_config, "fabric-head-key") == {
        "fabric-head-key": "update",
        "fabric-spark2-authorize": "update",
        # The worker's host key is configured: its pin on the head does not depend on it.
    }


def test_a_recreated_state_dir_restarts_the_containers_bound_to_it(
    make_config: ConfigFactory,
) -> None:
    """`rm -rf <stateDir>` on the head: every step that kept something there runs again, and
    the containers bound to its directories are replaced (they would keep the old ones)."""
    changes = drift(
        make_config,
        "spark1-scripts",
        "spark1-mounts",
        "fabric-head-key",
        "fabric-spark2-pin",
        "image-head-record",
        "weights-fetch",
        "front-api-key",
        "front-config",
    )
    assert changes == {
        "spark1-scripts": "update",
        "fabric-head-key": "update",
        "fabric-spark2-authorize": "update",
        "fabric-spark2-pin": "update",
        "image-head-record": "update",
        "weights-fetch": "update",  # the snapshot is used as is; preview cannot know that,
        "weights-spark2-copy": "update",  # so the copy's manifest is unknown until the up
        "front-api-key": "update",
        "front-config": "update",
        "front-container": "replace",
        "firewall-spark1-guard": "replace",
        "ray-head": "replace",
        "ray-spark2": "replace",  # joined the old head
        "ray-joined": "replace",
        "vllm-container": "replace",
        "vllm-ready": "replace",
    }


class UnreachableHosts(FakeHosts):
    """The invoke fails as pulumi-command's local.run fails (commandOutputs.go: `exit status N:
    running "<command>":\n<output>`), handed to the program as the engine hands it."""

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        error = (
            "exit status 255: running \"ssh -o BatchMode=yes ... -- aurora@10.240.1.11 'bash -s"
            " -- /home/aurora/.spark-vllm'\":\nssh: connect to host 10.240.1.11 port 22: "
            "No route to host\n"
        )
        raise ProviderInvokeError(args.token, error)


def test_an_unreachable_host_stops_the_run_with_one_clear_message(
    make_config: ConfigFactory,
) -> None:
    with pytest.raises(Exception) as raised:
        evaluate(make_config(hosts=2), SECRETS, mocks=UnreachableHosts())
    message = str(raised.value)
    assert "spark-vllm: spark1: facts: cannot read the host's state over SSH" in message
    assert "No route to host" in message and "likely cause" in message
    assert "(aurora@10.240.1.11:22): exit status 255: ssh: connect to host" in message
    assert 'running "ssh' not in message, "the long command line is left out"
