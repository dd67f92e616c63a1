"""The stack configuration: the user's whole interface, validated before any resource is declared.

The public face of the configuration: StackConfig is the schema's top-level model
(stacks/schema.py) with the checks across keys (stacks/config_rules.py) run on it, and
parse_stack_config turns every problem into keyed lines. The names other modules import from
here are re-exported from where they live.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError, model_validator

from stacks.config_rules import BASTION, ConfigError, check_ports, first_problem, ssh_ports
from stacks.config_types import (
    BYTE_UNITS,
    IFNAME_PATTERN,
    MAX_PORT,
    MIN_KV_CACHE_BYTES,
    NAME_PATTERN,
    SHARED_DIRS,
    STATE_DIR_NAME,
    SYSTEM_TREES,
    CacheDirectory,
    HostKey,
    HubId,
    HubRevision,
    Port,
    PrometheusDuration,
    PrometheusSize,
    ServedName,
    SshAddress,
    StateDirectory,
    default_state_dir,
)
from stacks.fleet import MP_PORT_SPAN, ServedModel, budget_problem, fleet_of
from stacks.schema import (
    MAX_VLLM_READY_SECONDS,
    RAY_CLIENT_SERVER_PORT,
    BastionConfig,
    BenchmarkConfig,
    CompileCacheConfig,
    ConfigModel,
    DockerConfig,
    FabricConfig,
    FrontConfig,
    FrontImageConfig,
    GrafanaConfig,
    HostConfig,
    ImageConfig,
    KnownBadVersion,
    MemoryGuardConfig,
    ModelConfig,
    MonitoringConfig,
    MonitoringImageConfig,
    NodeExporterConfig,
    PreflightConfig,
    PrometheusConfig,
    RayConfig,
    ServedModelConfig,
    ServerSettings,
    SshConfig,
    StackSchema,
    TimeoutsConfig,
    VllmConfig,
)
from stacks.vllm_flags import (
    COMPILE_CACHE_ENV_KEYS,
    CONFIG_FILE_FLAG,
    DERIVED_ENV_KEYS,
    GUARDED_FLAGS,
    KV_CACHE_FLAGS,
    LISTENER_FLAG_NAMES,
    MP_ONLY_FLAGS,
    OWNED_VLLM_FLAGS,
)
from stacks.vllm_listeners import LISTENER_ENV, LISTENER_FLAGS

# What other modules import from here, wherever it now lives.
__all__ = [
    "BASTION",
    "BYTE_UNITS",
    "COMPILE_CACHE_ENV_KEYS",
    "CONFIG_FILE_FLAG",
    "DERIVED_ENV_KEYS",
    "GUARDED_FLAGS",
    "IFNAME_PATTERN",
    "KV_CACHE_FLAGS",
    "LISTENER_ENV",
    "LISTENER_FLAGS",
    "LISTENER_FLAG_NAMES",
    "MAX_PORT",
    "MAX_VLLM_READY_SECONDS",
    "MIN_KV_CACHE_BYTES",
    "MP_ONLY_FLAGS",
    "MP_PORT_SPAN",
    "NAME_PATTERN",
    "OWNED_VLLM_FLAGS",
    "RAY_CLIENT_SERVER_PORT",
    "SHARED_DIRS",
    "STATE_DIR_NAME",
    "SYSTEM_TREES",
    "BastionConfig",
    "BenchmarkConfig",
    "CacheDirectory",
    "CompileCacheConfig",
    "ConfigError",
    "ConfigModel",
    "DockerConfig",
    "FabricConfig",
    "FrontConfig",
    "FrontImageConfig",
    "GrafanaConfig",
    "HostConfig",
    "HostKey",
    "HubId",
    "HubRevision",
    "ImageConfig",
    "KnownBadVersion",
    "MemoryGuardConfig",
    "ModelConfig",
    "MonitoringConfig",
    "MonitoringImageConfig",
    "NodeExporterConfig",
    "Port",
    "PreflightConfig",
    "PrometheusConfig",
    "PrometheusDuration",
    "PrometheusSize",
    "RayConfig",
    "ServedModel",
    "ServedModelConfig",
    "ServedName",
    "ServerSettings",
    "SshAddress",
    "SshConfig",
    "StackConfig",
    "StateDirectory",
    "TimeoutsConfig",
    "VllmConfig",
    "budget_problem",
    "check_ports",
    "default_state_dir",
    "describe_validation_error",
    "fleet_of",
    "parse_stack_config",
    "ssh_ports",
]


class StackConfig(StackSchema):
    """A stack's whole configuration, every rule across its keys checked."""

    @model_validator(mode="after")
    def _consistent(self) -> StackConfig:
        problem = first_problem(self)
        if problem:
            raise ConfigError(problem)
        return self

    @property
    def fleet(self) -> tuple[ServedModel, ...]:
        """Every model served, in one shape however the stack names them (stacks/fleet.py)."""
        return fleet_of(self)


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem, each starting with the config key as the user spells it."""
    lines = []
    for problem in error.errors():
        key = _key_path(problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "is not a known setting (check the spelling)"
        elif problem["type"] == "missing":
            message = "is required"
        lines.append(f"{key}: {message}" if key else message)
    return "\n".join(lines)


def _key_path(location: tuple[Any, ...]) -> str:
    key = ""
    for part in location:
        if isinstance(part, int):
            key += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][\w-]*", str(part)):
            key += ("." if key else "") + str(part)
        else:  # a mistyped key with odd characters: show it quoted and escaped
            key += f"[{str(part)!r}]"
    return key


def parse_stack_config(raw: dict[str, Any]) -> StackConfig:
    """Validate raw config values; raise ConfigError with every problem, keys first."""
    # A key set to nothing (`ray:` in YAML) means "the defaults", as if it were not set.
    raw = {key: value for key, value in raw.items() if value is not None}
    try:
        return StackConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error)) from None
