"""A stack's configuration as the Pulumi CLI keeps it, merges it with `Pulumi.yaml`, and hands it
to a Python program. Sources (pulumi/pulumi v3.259, commit 1b5949891b):

- `sdk/go/common/workspace/loaders.go` `LoadProjectStackBytes`: a stack key without a namespace
  is the project's; a null value is treated as `""` (with a warning).
- `sdk/go/common/resource/config/value.go`: YAML scalars are stored as text, maps and lists as
  object values (JSON), `secure:` values as ciphertext.
- `pkg/workspace/config.go` `ValidateStackConfigAndApplyProjectConfig` / `mergeConfig` (run by
  preview, up, refresh and destroy, errors wrapped as "validating stack config: ..."):
  project defaults fill keys the stack lacks; a project key with neither `default` nor `value`
  must be set; then, for explicitly typed keys in sorted order, a `secret: true` key must be
  secure and the value must pass `ValidateConfigValue`.
- `sdk/go/common/resource/config/map.go` `Map.Decrypt` + `Plaintext.marshalText`: the program
  receives every value as text (objects as compact JSON), secrets decrypted.
- `sdk/python/cmd/pulumi-language-python/main.go`: `PULUMI_CONFIG` (JSON map) and
  `PULUMI_CONFIG_SECRET_KEYS` (JSON list) in the program's environment;
  `sdk/python/cmd/pulumi-language-python-exec` then calls `set_all_config(get_config_env(),
  get_config_secret_keys_env())` before the program runs.

Encryption is the one thing not emulated: `secure:` values here are a reversible stand-in
(`v1:test:<base64>`), produced and read only by this module, never written to committed files.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

from tests.cli.project import CliError, Project, config_value_fits

CIPHER_PREFIX = "v1:test:"


@dataclass(frozen=True)
class Secure:
    """A `secure:` value: ciphertext in the stack file."""

    ciphertext: str

    @classmethod
    def encrypt(cls, plaintext: str) -> Secure:
        return cls(CIPHER_PREFIX + base64.b64encode(plaintext.encode()).decode())

    def decrypt(self) -> str:
        if not self.ciphertext.startswith(CIPHER_PREFIX):
            raise CliError("failed to decrypt config: this test CLI holds no key for it")
        return base64.b64decode(self.ciphertext[len(CIPHER_PREFIX) :]).decode()


@dataclass(frozen=True)
class StoredValue:
    """`config.Value`: text, an object (JSON text), or a secure value."""

    text: str = ""
    is_object: bool = False
    secure: Secure | None = None

    @classmethod
    def from_yaml(cls, raw: Any) -> StoredValue:
        if isinstance(raw, dict) and set(raw) == {"secure"}:
            return cls(secure=Secure(str(raw["secure"])))
        if isinstance(raw, dict | list):
            return cls(text=_compact_json(raw), is_object=True)
        return cls(text=_go_text(raw))

    def to_yaml(self) -> Any:
        if self.secure is not None:
            return {"secure": self.secure.ciphertext}
        return json.loads(self.text) if self.is_object else self.text

    def plaintext(self) -> str:
        """`Plaintext.marshalText`: what the program receives for this key."""
        return self.secure.decrypt() if self.secure is not None else self.text

    def content(self) -> Any:
        """What `ValidateConfigValue` sees: objects decoded from JSON, everything else text."""
        text = self.plaintext()
        return json.loads(text) if self.is_object else text


def _go_text(raw: Any) -> str:
    """A YAML scalar as the stack file stores it: `8000`, `true`, `1.5`; null is `""`."""
    if raw is None:
        return ""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    return str(raw)


def _compact_json(value: Any) -> str:
    """Go's json.Marshal of a decoded value: compact, map keys sorted."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass
class StackFile:
    """`Pulumi.<stack>.yaml`: its config keys fully namespaced, as the CLI loads them."""

    name: str
    config: dict[str, StoredValue] = field(default_factory=dict)

    @classmethod
    def load(cls, project: Project, name: str, path: Path | None = None) -> StackFile:
        path = path or project.path.with_name(f"Pulumi.{name}.yaml")
        document = yaml.safe_load(path.read_text()) if path.exists() else None
        return cls.from_config(project, name, (document or {}).get("config") or {})

    @classmethod
    def from_config(cls, project: Project, name: str, raw: Mapping[str, Any]) -> StackFile:
        return cls(
            name=name,
            config={full_key(project, k): StoredValue.from_yaml(v) for k, v in raw.items()},
        )

    def set(self, project: Project, key: str, value: str, secret: bool = False) -> None:
        """`pulumi config set [--secret] KEY VALUE`: a value given on the command line is text."""
        stored = StoredValue(secure=Secure.encrypt(value)) if secret else StoredValue(text=value)
        self.config[full_key(project, key)] = stored

    def set_object(self, project: Project, key: str, value: Any) -> None:
        """`pulumi config set --path` / editing the file: a structured value."""
        self.config[full_key(project, key)] = StoredValue.from_yaml(value)

    def document(self) -> dict[str, Any]:
        return {"config": {key: value.to_yaml() for key, value in self.config.items()}}

    def save(self, project: Project) -> Path:
        path = project.path.with_name(f"Pulumi.{self.name}.yaml")
        path.write_text(yaml.safe_dump(self.document(), sort_keys=False))
        return path


def full_key(project: Project, key: str) -> str:
    return key if ":" in key else f"{project.name}:{key}"


@dataclass(frozen=True)
class ProgramConfig:
    """What the language host hands the program: every value as text, and the secret keys."""

    values: dict[str, str]
    secret_keys: list[str]

    def environment(self) -> dict[str, str]:
        """`pulumi-language-python`: PULUMI_CONFIG is set only when there is config."""
        env = {"PULUMI_CONFIG_SECRET_KEYS": _compact_json(self.secret_keys)}
        if self.values:
            env["PULUMI_CONFIG"] = _compact_json(self.values)
        return env


def merge_config(project: Project, stack: StackFile) -> ProgramConfig:
    """`ValidateStackConfigAndApplyProjectConfig` with validation on, then `Map.Decrypt`."""
    merged = dict(stack.config)
    missing: list[str] = []
    for key in sorted(project.config):
        declared = project.config[key]
        name = full_key(project, key)
        fallback = declared.value if declared.value is not None else declared.default
        if name not in merged and fallback is None:
            if name.split(":", 1)[0] == project.name:
                missing.append(key)
            continue
        if name not in merged:
            merged[name] = StoredValue.from_yaml(fallback)  # defaults are always plaintext
    if missing:
        raise CliError("validating stack config: " + missing_keys_error(stack.name, missing))
    for key in sorted(project.config):
        declared = project.config[key]
        stored = merged.get(full_key(project, key))
        if stored is None or not declared.explicitly_typed:
            continue
        if declared.secret and stored.secure is None:
            raise CliError(
                f"validating stack config: Stack '{stack.name}' with configuration key '{key}' "
                "must be encrypted as it's secret"
            )
        if not config_value_fits(declared.type or "", declared.items, stored.content()):
            raise CliError(
                f"validating stack config: Stack '{stack.name}' with configuration key '{key}' "
                f"must be of type '{declared.full_type_name}'"
            )
    return ProgramConfig(
        values={key: value.plaintext() for key, value in merged.items()},
        secret_keys=sorted(key for key, value in merged.items() if value.secure is not None),
    )


def missing_keys_error(stack_name: str, keys: list[str]) -> str:
    """`missingStackConfigurationKeysError` with `formatMissingKeys`."""
    if len(keys) == 1:
        return f"Stack '{stack_name}' is missing configuration value '{keys[0]}'"
    keys = sorted(keys)
    listed = ", ".join(f"'{k}'" for k in keys[:-1]) + f" and '{keys[-1]}'"
    return f"Stack '{stack_name}' is missing configuration values {listed}"


@contextlib.contextmanager
def handed_to_program(config: ProgramConfig) -> Iterator[None]:
    """Start the program's config the way `pulumi-language-python-exec` does: from the
    environment the language host set, through the SDK's own readers."""
    environment = config.environment()
    saved = {key: os.environ.get(key) for key in ("PULUMI_CONFIG", "PULUMI_CONFIG_SECRET_KEYS")}
    for key in saved:
        os.environ.pop(key, None)
    os.environ.update(environment)
    try:
        pulumi.runtime.set_all_config(
            pulumi.runtime.get_config_env(), pulumi.runtime.get_config_secret_keys_env()
        )
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
