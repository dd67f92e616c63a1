"""Read the stack's Pulumi config and secrets into typed settings, or stop with one clean error."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from stacks.config import ConfigError, StackConfig, parse_stack_config

SECRET_KEYS = ("hfToken", "apiKey")
CONFIG_KEYS = (
    "hosts",
    "bastion",
    "ssh",
    "image",
    "model",
    "vllm",
    "ray",
    "docker",
    "fabric",
    "preflight",
    "timeouts",
)


@dataclass(frozen=True)
class Settings:
    config: StackConfig
    deployment_id: str
    hf_token: pulumi.Output[str] | None  # None: not set (models that are not gated)
    api_key: pulumi.Output[str]
    local_dir: Path  # this machine's derived files: known_hosts for Docker, SSH control sockets


def load_settings() -> Settings:
    config = pulumi.Config()
    raw, problems = _structured_values(config)
    problems += _unknown_keys(pulumi.get_project())
    problems += _secret_problems(config, pulumi.get_project())
    try:
        if problems:
            raise ConfigError("\n".join(problems))
        stack_config = parse_stack_config(raw)
    except ConfigError as error:
        raise pulumi.RunError(f"invalid spark-vllm configuration:\n{error}") from None
    project, stack = pulumi.get_project(), pulumi.get_stack()
    hf_token = config.get("hfToken")
    base = Path(os.environ.get("SPARK_VLLM_LOCAL_DIR", "~/.spark-vllm")).expanduser()
    return Settings(
        config=stack_config,
        deployment_id=f"{project}/{stack}",
        hf_token=pulumi.Output.secret(hf_token) if hf_token else None,
        api_key=pulumi.Output.secret(config.get("apiKey") or ""),
        local_dir=base / f"{project}-{stack}",
    )


def _structured_values(config: pulumi.Config) -> tuple[dict[str, Any], list[str]]:
    """Each set key parsed as YAML/JSON structure; a plain text where a structure belongs is a
    problem to report, not a crash."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key in CONFIG_KEYS:
        try:
            value = config.get_object(key)
        except pulumi.ConfigTypeError:
            shape = "a list of hosts" if key == "hosts" else "a mapping of settings"
            problems.append(f"{key}: must be {shape}, not the text {config.get(key)!r}")
            continue
        # An optional key set to nothing (`bastion: {}`, Pulumi.yaml's default) is not set.
        if value is not None and (value != {} or StackConfig.model_fields[key].is_required()):
            values[key] = value
    return values, problems


def _secret_problems(config: pulumi.Config, project: str) -> list[str]:
    """apiKey is required and must not be empty (an empty key turns vLLM's authentication off);
    a token given without --secret would sit in plain text in the stack file and the state."""
    problems = []
    if not config.get("apiKey"):
        problems.append(
            "apiKey: is required and must not be empty: "
            'pulumi config set --secret apiKey "$(openssl rand -hex 24)"'
        )
    for key in SECRET_KEYS:
        if config.get(key) and not pulumi.runtime.is_config_secret(f"{project}:{key}"):
            problems.append(
                f"{key}: is stored in plain text; set it with pulumi config set --secret {key} ..."
            )
    return problems


def _unknown_keys(project: str) -> list[str]:
    """A typo in a top-level key (`spark-vllm:vlm`) must not be silently ignored.

    The one read outside `pulumi.Config`, which cannot list the keys that are set: the SDK's own
    store of them. tests/program/test_validation.py (the `vlm` case, through the CLI's hand-over)
    fails if the SDK changes underneath it.
    """
    from pulumi.runtime.config import CONFIG, get_config_env

    known = {f"{project}:{key}" for key in (*CONFIG_KEYS, *SECRET_KEYS)}
    names = set(CONFIG.get()) | set(get_config_env())
    return [
        f"{name.split(':', 1)[1]}: is not a known setting (check the spelling)"
        for name in sorted(names)
        if name.startswith(f"{project}:") and name not in known
    ]
