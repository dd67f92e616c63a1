"""Secrets stay Pulumi secrets, off every command line and out of non-secret outputs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli import CliError
from tests.program.conftest import PRIVATE_KEY, SECRETS, ConfigFactory
from tests.program.harness import Evaluation, evaluate, is_secret

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
