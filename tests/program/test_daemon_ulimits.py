"""dockerd's default ulimits, read with the facts, and the ulimits each container is given so
that the provider's read after the create is no diff (issue: a host with `default-ulimits`
replaced every container on every `up`)."""

from __future__ import annotations

import json

import pytest

from components.facts import parse_facts
from stacks.plan.containers import Ulimit, daemon_default_ulimits, with_daemon_ulimits

NOFILE = {"Name": "nofile", "Soft": 65536, "Hard": 1048576}


@pytest.mark.parametrize(
    ("daemon_json", "args", "expected"),
    [
        ("", [], ()),
        ("{}", [], ()),
        (
            json.dumps({"default-ulimits": {"nofile": NOFILE}}),
            [],
            (Ulimit("nofile", 65536, 1048576),),
        ),
        # The map's key names the ulimit when the value leaves Name out.
        (
            json.dumps({"default-ulimits": {"core": {"Soft": 0, "Hard": 0}}}),
            [],
            (Ulimit("core", 0, 0),),
        ),
        ("", ["--default-ulimit=nofile=1024:2048"], (Ulimit("nofile", 1024, 2048),)),
        ("", ["--default-ulimit=memlock=-1"], (Ulimit("memlock", -1, -1),)),
        (
            json.dumps({"default-ulimits": {"nofile": NOFILE}}),
            ["--default-ulimit=core=0:0"],
            (Ulimit("core", 0, 0), Ulimit("nofile", 65536, 1048576)),
        ),
        # What dockerd could not have started with gives nothing, not a crash.
        ("{not json", [], ()),
        (json.dumps({"default-ulimits": ["nofile"]}), ["--default-ulimit=nofile"], ()),
    ],
)
def test_daemon_default_ulimits(daemon_json: str, args: list[str], expected: tuple) -> None:
    assert daemon_default_ulimits(daemon_json, args) == expected


STACK = Ulimit("stack", 67108864, 67108864)


@pytest.mark.parametrize(
    ("own", "defaults", "expected"),
    [
        ((STACK,), (), (STACK,)),
        ((), (Ulimit("nofile", 1, 2),), (Ulimit("nofile", 1, 2),)),
        ((STACK,), (Ulimit("nofile", 1, 2),), (STACK, Ulimit("nofile", 1, 2))),
        # The container's own value wins, as in dockerd's mergeUlimits.
        ((STACK,), (Ulimit("stack", 8388608, 8388608),), (STACK,)),
    ],
)
def test_with_daemon_ulimits(own: tuple, defaults: tuple, expected: tuple) -> None:
    assert with_daemon_ulimits(own, defaults) == expected


def test_the_facts_carry_the_running_daemons_default_ulimits() -> None:
    answer = "\n".join(
        [
            "spark-vllm-facts 1",
            "hf-weights abc123",
            "dockerd-arg --default-ulimit=core=0:0",
            "daemon-json " + json.dumps({"default-ulimits": {"nofile": NOFILE}}),
        ]
    )
    facts = parse_facts("spark1", answer)
    assert facts.holding == {"hf-weights": "abc123"}
    assert facts.daemon_ulimits == (Ulimit("core", 0, 0), Ulimit("nofile", 65536, 1048576))
    assert parse_facts("spark1", "spark-vllm-facts 1\n").daemon_ulimits == ()
