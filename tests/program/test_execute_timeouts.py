"""vLLM's execute timeout (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS): derived from the timeouts keys in
one place (stacks/plan/arguments.py), both values on the launcher's command line, and the
launcher's choice at each start by whether the node's compile cache holds a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stacks.config import TimeoutsConfig
from stacks.plan.arguments import ExecuteTimeouts, execute_timeouts
from stacks.plan.container_paths import CONTAINER_COMPILE_CACHE
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate
from tests.program.planning import error_of
from tests.program.scripting import fake_bin, run

DERIVED = [
    # vLLM's 300 s ends a first start with EngineDeadError: 1800 by default, 600 warm.
    ("defaults", {}, ExecuteTimeouts(cold=1800, warm=600)),
    ("a slower first start", {"vllmExecuteColdSeconds": 3600}, ExecuteTimeouts(3600, 600)),
    ("warm as vLLM's own", {"vllmExecuteWarmSeconds": 300}, ExecuteTimeouts(1800, 300)),
    ("both the same", {"vllmExecuteColdSeconds": 900, "vllmExecuteWarmSeconds": 900},
     ExecuteTimeouts(900, 900)),
    # A model built without the schema's check (model_construct) is still held to cold >= warm.
    ("warm above cold, unchecked", None, ExecuteTimeouts(900, 900)),
]  # fmt: skip


@pytest.mark.parametrize(("keys", "wanted"), [c[1:] for c in DERIVED], ids=[c[0] for c in DERIVED])
def test_the_execute_timeouts_come_from_the_timeouts_keys(
    keys: dict[str, int] | None, wanted: ExecuteTimeouts
) -> None:
    if keys is None:
        timeouts = TimeoutsConfig.model_construct(
            vllm_execute_cold_seconds=900, vllm_execute_warm_seconds=1200
        )
    else:
        timeouts = TimeoutsConfig.model_validate(keys)
    assert execute_timeouts(timeouts) == wanted


def test_a_warm_timeout_above_the_cold_one_is_refused(make_config: ConfigFactory) -> None:
    config = make_config()
    config["timeouts"] = {"vllmExecuteColdSeconds": 600, "vllmExecuteWarmSeconds": 900}
    assert "vllmExecuteWarmSeconds must not exceed vllmExecuteColdSeconds" in error_of(config)


def test_the_variable_in_env_is_refused_naming_the_keys(make_config: ConfigFactory) -> None:
    config = make_config()
    config["vllm"]["env"] = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}
    text = error_of(config)
    assert "vllm.env.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: spark-vllm sets it at each start" in text
    assert "timeouts.vllmExecuteColdSeconds" in text


def launcher_flags(command: list[str]) -> dict[str, str]:
    flags = command[: command.index("--")]
    return dict(zip(flags[::2], flags[1::2], strict=False))


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_every_launcher_gets_both_values_and_the_cache_and_no_env_differs(
    make_config: ConfigFactory, executor: str
) -> None:
    config: dict[str, Any] = make_config(executor=executor)
    config["timeouts"] = {"vllmExecuteColdSeconds": 2400}
    ev = evaluate(config, SECRETS)
    servers = [r for r in ev.registrations if r.name.startswith("vllm-container")]
    assert servers, [r.name for r in ev.registrations]
    for server in servers:
        flags = launcher_flags(server.inputs["command"])
        assert flags["--compile-cache"] == CONTAINER_COMPILE_CACHE
        assert (flags["--execute-seconds-cold"], flags["--execute-seconds-warm"]) == ("2400", "600")
        env = "\n".join(server.inputs.get("envs") or [])
        assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS" not in env  # the launcher sets it


# -- the launcher, run for real with a stand-in `vllm` that prints what it was started with ------

FAKE_VLLM = """#!/usr/bin/env bash
echo "execute timeout: ${VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS:-unset}"
"""


def launch(tmp_path: Path, cache: Path, *flags: str) -> Any:
    key = tmp_path / "api-key"
    key.write_text("k" * 32)
    env = {
        **fake_bin(tmp_path, vllm=FAKE_VLLM),
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "SPARK_VLLM_LAUNCHER_RECORD": str(tmp_path / "record"),
    }
    env.pop("VLLM_CONFIG_ROOT", None)
    return run(
        "vllm-launcher.sh",
        "--executor", "ray", "--scripts", str(tmp_path), "--key-file", str(key),
        "--compile-cache", str(cache), *flags, "--", "model",
        env=env,
    )  # fmt: skip


TIMEOUTS = ("--execute-seconds-cold", "1800", "--execute-seconds-warm", "600")


def test_the_launcher_exports_the_cold_value_on_an_empty_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "vllm").mkdir(parents=True)  # directories alone are no kernels
    done = launch(tmp_path, cache, *TIMEOUTS)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "execute timeout: 1800\n"
    assert f"compile cache {cache} is empty" in done.stderr


def test_the_launcher_exports_the_warm_value_on_a_filled_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    kernel = cache / "flashinfer" / "90a" / "cached_ops" / "norm.so"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(b"\x7fELF")
    done = launch(tmp_path, cache, *TIMEOUTS)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "execute timeout: 600\n"
    assert "holds a previous start's kernels" in done.stderr


def test_a_missing_cache_directory_is_a_cold_start(tmp_path: Path) -> None:
    done = launch(tmp_path, tmp_path / "nowhere", *TIMEOUTS)
    assert done.stdout == "execute timeout: 1800\n", done.stderr
