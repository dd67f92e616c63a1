"""Secrets stay Pulumi secrets, off every command line and out of non-secret outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.cli import CliError
from tests.program.conftest import PRIVATE_KEY, SECRETS, ConfigFactory
from tests.program.harness import Evaluation, evaluate, is_secret
from tests.program.scripting import SCRIPTS, run

SECRET_VALUES = [*SECRETS.values(), "test-private-key-material"]


def plain_parts(value: Any) -> Any:
    """The value with every secret-wrapped part removed: what would be shown in plain text."""
    if is_secret(value):
        return None
    if isinstance(value, dict):
        return {k: plain_parts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_parts(v) for v in value]
    return value


@pytest.fixture
def evaluation(make_config: ConfigFactory) -> Evaluation:
    return evaluate(make_config(hosts=2), SECRETS)


def test_no_secret_appears_in_any_plain_input(evaluation: Evaluation) -> None:
    for resource in evaluation.registrations:
        text = json.dumps(plain_parts(resource.inputs))
        for secret in SECRET_VALUES:
            assert secret not in text, f"{resource.name} exposes a secret"


def test_no_secret_is_on_a_command_line(evaluation: Evaluation) -> None:
    for resource in evaluation.by_type("command:remote:Command"):
        for key in ("create", "update", "delete"):
            line = json.dumps(resource.inputs.get(key, ""))
            assert not any(secret in line for secret in SECRET_VALUES), (resource.name, key)


def test_tokens_travel_as_secret_stdin(evaluation: Evaluation) -> None:
    fetch = evaluation.named("weights-fetch").inputs
    assert is_secret(fetch["stdin"]) and fetch["stdin"]["value"] == SECRETS["hfToken"]
    for name in ("front-api-key", "vllm-ready"):
        stdin = evaluation.named(name).inputs["stdin"]
        assert is_secret(stdin) and stdin["value"] == SECRETS["apiKey"]
    assert evaluation.named("front-api-key").inputs["logging"] == "none"


def test_the_ssh_key_is_a_secret_in_every_connection(evaluation: Evaluation) -> None:
    for resource in evaluation.by_type("command:remote:Command"):
        connection = resource.inputs["connection"]
        assert is_secret(connection), resource.name
        assert connection["value"]["privateKey"] == PRIVATE_KEY
        proxy = connection["value"].get("proxy")
        if proxy is not None:
            assert proxy["privateKey"] == PRIVATE_KEY


def test_the_docker_provider_names_the_key_file_never_its_content(
    evaluation: Evaluation,
) -> None:
    for resource in evaluation.by_type("pulumi:providers:docker"):
        assert "test-private-key-material" not in json.dumps(resource.inputs)
        assert "-i" in json.loads(resource.inputs["sshOpts"])


def test_containers_carry_no_secret_in_env_or_command(evaluation: Evaluation) -> None:
    for resource in evaluation.by_type("docker:index/container:Container"):
        visible = json.dumps([resource.inputs.get(k) for k in ("envs", "command", "entrypoints")])
        assert not any(secret in visible for secret in SECRET_VALUES), resource.name


def test_outputs_keep_the_api_key_secret(evaluation: Evaluation) -> None:
    assert evaluation.secret_outputs == {"apiKey"}
    for name, value in evaluation.outputs.items():
        if name != "apiKey":
            assert not any(secret in json.dumps(value) for secret in SECRET_VALUES), name


def test_the_hf_token_may_be_left_out(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(hosts=2), {"apiKey": SECRETS["apiKey"]})
    assert ev.named("weights-fetch").inputs["stdin"] == ""
    assert is_secret(ev.named("front-api-key").inputs["stdin"])


def test_the_api_key_is_required_by_the_cli(make_config: ConfigFactory) -> None:
    with pytest.raises(CliError) as caught:
        evaluate(make_config(hosts=2))
    assert str(caught.value) == (
        "validating stack config: Stack 'dev' is missing configuration value 'apiKey'"
    )


def test_an_api_key_in_plain_text_is_refused_by_the_cli(make_config: ConfigFactory) -> None:
    config = {**make_config(hosts=2), "apiKey": "plain"}
    with pytest.raises(CliError) as caught:
        evaluate(config)
    assert str(caught.value).endswith("key 'apiKey' must be encrypted as it's secret")


def test_an_empty_api_key_is_refused(make_config: ConfigFactory) -> None:
    with pytest.raises(Exception, match="apiKey: is required and must not be empty") as caught:
        evaluate(make_config(hosts=2), {"apiKey": ""})
    assert type(caught.value).__name__ == "RunError"


def test_an_hf_token_in_plain_text_is_refused(make_config: ConfigFactory) -> None:
    """Untyped in Pulumi.yaml (so that it can stay optional), so the program checks it."""
    config = {**make_config(hosts=2), "hfToken": "hf_plain"}
    with pytest.raises(Exception, match="hfToken: is stored in plain text") as caught:
        evaluate(config, {"apiKey": SECRETS["apiKey"]})
    assert type(caught.value).__name__ == "RunError"


# --- what a failed step prints -----------------------------------------------------------------
# pulumi-command's error for a failed command carries the whole command and all of its output,
# whatever `logging` says (remote `run`: "%w: running %q:\n%s"). The secrets travel on stdin;
# the scripts that read them must never print them, on success or failure.

KEY = "sk-never-printed-7f3a91"
NAMED = "user-key-never-printed-52c0"


def _script_runs(tmp_path: Path) -> list[tuple[str, tuple[str, ...], str]]:
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a directory under a regular file cannot be made: the write fails
    runs: list[tuple[str, tuple[str, ...], str]] = []
    for where in (tmp_path / "ok", blocked / "no"):
        runs += [
            ("api-key-file.sh", ("write", "--host", "spark1", "--file", f"{where}/api-key"),
             f"{KEY}\n"),
            ("front-keys-file.sh", ("write", "--host", "spark1", "--file", f"{where}/keys.map"),
             f"{KEY}\n{NAMED} alice\n"),
        ]  # fmt: skip
    return runs


def test_no_script_given_a_secret_prints_it_whether_it_succeeds_or_fails(tmp_path: Path) -> None:
    outcomes = set()
    for script, args, stdin in _script_runs(tmp_path):
        done = run(script, *args, stdin=stdin)
        outcomes.add((script, done.returncode == 0))
        for secret in (KEY, NAMED):
            assert secret not in done.stdout + done.stderr, (script, args, done)
    # Both scripts both ways: the failures are real failures.
    assert outcomes == {(s, ok) for s in ("api-key-file.sh", "front-keys-file.sh")
                        for ok in (True, False)}  # fmt: skip


def test_no_host_script_traces_its_commands() -> None:
    """`set -x` would print every expanded word, a secret read from stdin included."""
    for script in sorted(SCRIPTS.glob("*.sh")):
        text = script.read_text()
        assert not re.search(r"^\s*set\s+(-\w*x|-o\s+xtrace)", text, re.M), script.name
