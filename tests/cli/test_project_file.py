"""Our own `Pulumi.yaml` and committed stacks, through the CLI's rules: what the CLI refused
before issue 7, and what it accepts now."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.config import (
    DockerConfig,
    FabricConfig,
    FrontConfig,
    MemoryGuardConfig,
    MonitoringConfig,
    PreflightConfig,
    RayConfig,
    StackConfig,
    TimeoutsConfig,
    parse_stack_config,
)
from stacks.schema import SECRETS
from tests.cli import CliError, PulumiCli
from tests.cli.project import load_project
from tests.cli.stack import StackFile, merge_config

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).with_name("fixtures")
COMMITTED_STACKS = sorted(p.name.split(".")[1] for p in REPO.glob("Pulumi.*.yaml"))


def test_every_committed_stack_is_found() -> None:
    assert COMMITTED_STACKS == ["dev", "lab"]


def test_before_the_fix_every_command_was_refused() -> None:
    path = FIXTURES / "Pulumi.before-items.yaml"
    with pytest.raises(CliError) as caught:
        load_project(path)
    assert str(caught.value) == (
        f"could not unmarshal '{path}': The configuration key 'hosts' declares an array but "
        "does not specify the underlying type via the 'items' attribute"
    )


@pytest.mark.parametrize(
    ("stack", "message"),
    [
        ("dev", "Stack 'dev' is missing configuration values "
                "'bastion', 'docker', 'fabric', 'hfToken' and 'timeouts'"),
        ("lab", "Stack 'lab' is missing configuration values 'hfToken' and 'ray'"),
    ],
)  # fmt: skip
def test_before_the_fix_no_committed_stack_could_run(stack: str, message: str) -> None:
    """With `items` added, the old declarations still made every key required."""
    project = load_project(FIXTURES / "Pulumi.before-defaults.yaml")
    stack_file = StackFile.load(project, stack, REPO / f"Pulumi.{stack}.yaml")
    stack_file.set(project, "apiKey", "k-test-0123456789abcdef01", secret=True)
    with pytest.raises(CliError) as caught:
        merge_config(project, stack_file)
    assert str(caught.value) == f"validating stack config: {message}"


@pytest.mark.parametrize("stack", COMMITTED_STACKS)
def test_every_committed_stack_runs_once_the_api_key_is_set(stack: str) -> None:
    cli = PulumiCli(REPO)
    cli.stack_init(stack)
    with pytest.raises(CliError, match="missing configuration value 'apiKey'"):
        cli.program_config(stack)
    cli.config_set(stack, "apiKey", "k-test-0123456789abcdef01", secret=True)
    config = cli.program_config(stack)
    assert config.secret_keys == ["spark-vllm:apiKey"]
    assert parse_stack_config(program_keys(config.values)) is not None


def program_keys(values: dict[str, str]) -> dict[str, Any]:
    """The structured keys as the program parses them (settings.py reads them with get_object)."""
    return {
        key.split(":", 1)[1]: yaml.safe_load(text)
        for key, text in values.items()
        if key.split(":", 1)[1] in StackConfig.model_fields and text not in ("", "{}", "[]")
    }


def test_a_stack_can_leave_every_optional_key_out() -> None:
    cli = PulumiCli(REPO)
    cli.stack_from(
        "minimal",
        {
            "hosts": [{"name": "a", "address": "h", "user": "u", "fabricInterface": "eth1",
                       "fabricIp": "10.0.0.1"}],
            "ssh": {"useAgent": True},
            "image": {"ref": "vllm/vllm-openai:latest"},
            "model": {"id": "org/model", "cacheDir": "/srv/hf"},
            "vllm": {"tensorParallelSize": 1},
        },
    )  # fmt: skip
    cli.config_set("minimal", "apiKey", "k-test-0123456789abcdef01", secret=True)
    config = parse_stack_config(program_keys(cli.program_config("minimal").values))
    assert config.bastion is None and config.ray == RayConfig()


@pytest.mark.parametrize(
    ("key", "model"),
    [("ray", RayConfig), ("docker", DockerConfig), ("fabric", FabricConfig),
     ("preflight", PreflightConfig), ("timeouts", TimeoutsConfig),
     ("monitoring", MonitoringConfig), ("memoryGuard", MemoryGuardConfig),
     ("front", FrontConfig)],
)  # fmt: skip
def test_project_defaults_are_the_programs_defaults(key: str, model: type) -> None:
    declared = load_project(REPO / "Pulumi.yaml").config[key]
    assert declared.type == "object"
    expected = model().model_dump(by_alias=True, exclude_none=True, mode="json")
    assert declared.default == expected


def test_every_key_the_program_reads_is_declared_with_a_description() -> None:
    project = load_project(REPO / "Pulumi.yaml")
    keys = {field.alias or name for name, field in StackConfig.model_fields.items()}
    assert set(project.config) == {*keys, "apiKey", "hfToken"}
    assert all(declared.description for declared in project.config.values())


def test_each_description_is_the_programs() -> None:
    """`pulumi config` users read Pulumi.yaml's descriptions, docs/configuration.md readers the
    model's: one text (stacks/schema.py), whitespace aside (Pulumi.yaml folds its lines)."""
    project = load_project(REPO / "Pulumi.yaml")
    expected = {
        field.alias or key: field.description for key, field in StackConfig.model_fields.items()
    }
    expected |= SECRETS
    declared = {key: " ".join(d.description.split()) for key, d in project.config.items()}
    assert declared == {key: " ".join(str(text).split()) for key, text in expected.items()}


def test_required_keys_are_what_the_program_requires() -> None:
    project = load_project(REPO / "Pulumi.yaml")
    required = {k for k, d in project.config.items() if d.default is None and d.value is None}
    fields = StackConfig.model_fields
    assert required == {k for k, f in fields.items() if f.is_required()} | {"apiKey"}
