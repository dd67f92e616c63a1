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
    hf_token: pulumi.Output[str] | None
    api_key: pulumi.Output[str] | None
    local_dir: Path  # this machine's derived files: known_hosts for Docker, SSH control sockets


def load_settings() -> Settings:
    config = pulumi.Config()
    raw, problems = _structured_values(config)
    problems += _unknown_keys(pulumi.get_project())
    try:
        if problems:
            raise ConfigError("\n".join(problems))
        stack_config = parse_stack_config(raw)
    except ConfigError as error:
        raise pulumi.RunError(f"invalid spark-vllm configuration:\n{error}") from None
    project, stack = pulumi.get_project(), pulumi.get_stack()
    base = Path(os.environ.get("SPARK_VLLM_LOCAL_DIR", "~/.spark-vllm")).expanduser()
    return Settings(
        config=stack_config,
        deployment_id=f"{project}/{stack}",
        hf_token=config.get_secret("hfToken"),
        api_key=config.get_secret("apiKey"),
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
        if value is not None:
            values[key] = value
    return values, problems


def _unknown_keys(project: str) -> list[str]:
    """A typo in a top-level key (`spark-vllm:vlm`) must not be silently ignored."""
    from pulumi.runtime.config import CONFIG, get_config_env

    known = {f"{project}:{key}" for key in (*CONFIG_KEYS, *SECRET_KEYS)}
    names = set(CONFIG.get()) | set(get_config_env())
    return [
        f"{name.split(':', 1)[1]}: is not a known setting (check the spelling)"
        for name in sorted(names)
        if name.startswith(f"{project}:") and name not in known
    ]
