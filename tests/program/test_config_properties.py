"""Property-based: whatever a user writes in the stack config, the answer is either a deployment
or one clean error naming the key(s) — never a traceback, and never after a remote step ran."""

from __future__ import annotations

import copy
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stacks.config import ConfigError, parse_stack_config
from tests.cli import CliError
from tests.program.conftest import HOST_KEYS, SECRETS
from tests.program.harness import FakeHosts, evaluate

VALID: dict[str, Any] = {
    "hosts": [
        {"name": "spark1", "address": "10.0.0.1", "user": "aurora",
         "fabricInterface": "enp1s0f1np1", "fabricIp": "10.1.0.1", "hostKey": HOST_KEYS["spark1"]},
        {"name": "spark2", "address": "10.1.0.2", "user": "aurora", "via": "spark1",
         "fabricInterface": "enp1s0f1np1", "fabricIp": "10.1.0.2", "hostKey": HOST_KEYS["spark2"]},
    ],
    "ssh": {"privateKeyPath": "/dev/null"},
    "image": {"ref": "example/vllm:1"},
    "model": {"id": "org/model", "cacheDir": "/srv/hf"},
    "vllm": {"tensorParallelSize": 2},
}  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6,
)  # fmt: skip

# A key path is either "top" or "top.sub", "hosts[0].name", ...: what the user can look up.
KEY_LINE = re.compile(r"^(invalid spark-vllm configuration:|[A-Za-z][\w]*(\[\d+\])?([.\[]|:| ))")


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += paths(child, (*prefix, index))
    return found


def put(config: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    mutated = copy.deepcopy(config)
    target: Any = mutated
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return mutated


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    path = draw(st.sampled_from(paths(VALID)))
    value = draw(json_values)
    config = put(VALID, path, value)
    if draw(st.booleans()):
        config[draw(st.sampled_from(["vllm", "ray", "docker", "bogusKey"]))] = draw(json_values)
    return config


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_any_config_is_accepted_or_rejected_with_keyed_lines(config: dict[str, Any]) -> None:
    try:
        parse_stack_config(config)
    except ConfigError as error:
        lines = str(error).splitlines()
        assert lines, "an error says something"
        for line in lines:
            assert KEY_LINE.match(line) or line.startswith(("hosts", "vllm", "ssh")), line


class RecordingHosts(FakeHosts):
    def __init__(self) -> None:
        super().__init__()
        self.created: list[str] = []

    def new_resource(self, args):  # type: ignore[no-untyped-def]
        self.created.append(args.typ)
        return super().new_resource(args)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_invalid_config_stops_before_any_resource(config: dict[str, Any]) -> None:
    try:
        parse_stack_config(config)
        return  # a valid mutation: covered by the graph tests
    except ConfigError:
        pass
    mocks = RecordingHosts()
    try:
        evaluate(config, SECRETS, mocks=mocks)
    except CliError as error:  # the CLI refuses a declared key of the wrong type first
        assert str(error).startswith(
            (
                "validating stack config: Stack 'dev' with configuration key",
                "getting stack configuration: json: unsupported value: ",  # an infinite float
            )
        )
    except Exception as error:
        assert type(error).__name__ == "RunError", repr(error)
        assert str(error).startswith("invalid spark-vllm configuration:\n")
    else:
        raise AssertionError("an invalid config was evaluated")
    assert mocks.created == [], "no resource may be declared for an invalid config"
