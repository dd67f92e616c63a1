"""A stack's configuration as the Pulumi CLI keeps it, merges it with `Pulumi.yaml`, and hands it
to a Python program. Sources (pulumi/pulumi v3.259, commit 1b5949891b):

- `sdk/go/common/workspace/loaders.go` `LoadProjectStackBytes`: a stack key without a namespace
  is the project's; a null value is treated as `""` (with a warning).
- `sdk/go/common/resource/config/value.go`, `object.go`: YAML (read by Go's yaml.v3) scalars
  are stored as text (numbers and bools as Go's JSON text), maps and lists as object values
  (Go's JSON), `secure:` values as ciphertext, also inside objects (`tests/cli/gotext.py`).
- `pkg/workspace/config.go` `ValidateStackConfigAndApplyProjectConfig` / `mergeConfig` (run by
  preview, up, refresh and destroy, errors wrapped as "validating stack config: ..."):
  project defaults fill keys the stack lacks; a project key with neither `default` nor `value`
  must be set; then, for explicitly typed keys in sorted order, a `secret: true` key must be
  secure and the value must pass `ValidateConfigValue`.
- `sdk/go/common/resource/config/map.go` `Map.Decrypt` + `Plaintext.marshalText`: the program
  receives every value as text (objects as compact JSON), secrets decrypted, those inside objects
  too; `Map.SecureKeys` lists a key whose value holds a secret anywhere.
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
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

from tests.cli import gotext
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
    """`config.Value`: text, an object (its decoded tree, secure leaves as Secure), or a secure
    value."""

    text: str = ""
    is_object: bool = False
    secure: Secure | None = None
    tree: Any = None

    @classmethod
    def from_yaml(cls, raw: Any) -> StoredValue:
        """A value as decoded from the stack file (or given as one): `unmarshalObject`."""
        decoded = _object(raw)
        if isinstance(decoded, Secure):
            return cls(secure=decoded)
        if isinstance(decoded, dict | list):
            return cls(text=gotext.json_text(_stored(decoded)), is_object=True, tree=decoded)
        return cls(text=gotext.scalar_text(decoded))

    @property
    def is_secret(self) -> bool:
        """`object.Secure`: secure itself, or holding a secure value anywhere inside."""
        return self.secure is not None or _holds_secure(self.tree)

    def to_yaml(self) -> Any:
        if self.secure is not None:
            return {"secure": self.secure.ciphertext}
        return json.loads(self.text) if self.is_object else self.text

    def plaintext(self) -> str:
        """`Plaintext.marshalText`: what the program receives for this key."""
        if self.secure is not None:
            return self.secure.decrypt()
        return gotext.json_text(_decrypted(self.tree)) if self.is_object else self.text

    def content(self) -> Any:
        """What `ValidateConfigValue` sees: objects decoded from JSON, everything else text."""
        text = self.plaintext()
        return json.loads(text) if self.is_object else text


def _object(raw: Any) -> Any:
    """`unmarshalObject`: `{secure: TEXT}` anywhere is a secret; map keys as Go prints them."""
    if isinstance(raw, dict):
        if len(raw) == 1 and isinstance(raw.get("secure"), str):
            return Secure(raw["secure"])
        return {gotext.key_text(key): _object(value) for key, value in raw.items()}
    if isinstance(raw, list):
        return [_object(item) for item in raw]
    return raw


def _map_secure(tree: Any, leaf: Callable[[Secure], Any]) -> Any:
    """The tree with each secure value replaced by `leaf(value)`."""
    if isinstance(tree, Secure):
        return leaf(tree)
    if isinstance(tree, dict):
        return {key: _map_secure(value, leaf) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_map_secure(item, leaf) for item in tree]
    return tree


def _stored(tree: Any) -> Any:
    """`marshalObjectValue`: a secret inside an object stays `{"secure": CIPHERTEXT}`."""
    return _map_secure(tree, lambda secure: {"secure": secure.ciphertext})


def _decrypted(tree: Any) -> Any:
    return _map_secure(tree, Secure.decrypt)


def _holds_secure(tree: Any) -> bool:
    if isinstance(tree, Secure):
        return True
    if isinstance(tree, dict):
        return any(_holds_secure(value) for value in tree.values())
    if isinstance(tree, list):
        return any(_holds_secure(item) for item in tree)
    return False


def _compact_json(value: Any) -> str:
    """Go's json.Marshal of a decoded value (tests/cli/gotext.py)."""
    return gotext.json_text(value)


@dataclass
class StackFile:
    """`Pulumi.<stack>.yaml`: its config keys fully namespaced, as the CLI loads them."""

    name: str
    config: dict[str, StoredValue] = field(default_factory=dict)

    @classmethod
    def load(cls, project: Project, name: str, path: Path | None = None) -> StackFile:
        path = path or project.path.with_name(f"Pulumi.{name}.yaml")
        document = gotext.load(path.read_text()) if path.exists() else None
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

    def set_path(self, project: Project, key: str, value: str, secret: bool = False) -> None:
        """`pulumi config set --path [--secret] KEY VALUE` (config.go `Map.Set` with a path): one
        nested key merged into the object at the path's first segment; a plain value typed as
        `coerce` types it (`true`/`false`, a decimal integer without a leading zero)."""
        # io.go parseConfigKey: the namespace is the top segment's (before the first `[` or `.`).
        split = min((i for i in (key.find("["), key.find(".")) if i > 0), default=len(key))
        namespace, _, top = key[:split].rpartition(":")
        path = parse_property_path(top + key[split:])
        if not isinstance(path[0], str):
            raise CliError("first path segement of config key must be a string")
        if path[0] == "":
            raise CliError("config key is empty")
        root_key = full_key(project, f"{namespace}:{path[0]}" if namespace else str(path[0]))
        new: Any = Secure.encrypt(value) if secret else _coerce(value)
        if len(path) == 1:  # Map.Set: the value as given, untyped
            self.set(project, root_key, value, secret=secret)
            return
        existing = self.config.get(root_key)
        root: Any = None
        if existing is not None:
            root = existing.tree if existing.is_object else existing.secure or existing.text
        root = _set_at(root, path[:1], path[1:], new)
        self.config[root_key] = StoredValue.from_yaml(_stored(root))

    def set_object(self, project: Project, key: str, value: Any) -> None:
        """`pulumi config set --path` / editing the file: a structured value."""
        self.config[full_key(project, key)] = StoredValue.from_yaml(value)

    def document(self) -> dict[str, Any]:
        return {"config": {key: value.to_yaml() for key, value in self.config.items()}}

    def save(self, project: Project) -> Path:
        path = project.path.with_name(f"Pulumi.{self.name}.yaml")
        path.write_text(yaml.safe_dump(self.document(), sort_keys=False))
        return path


def parse_property_path(path: str) -> list[str | int]:
    """`resource.ParsePropertyPathStrict` (sdk/go/common/resource/properties_path.go): names up
    to the next `.` or `[`, `["quoted"]` keys, `[N]` indexes."""
    elements: list[str | int] = []
    if path.startswith("."):
        raise _bad_path("expected property path to start with a name or index")
    while path:
        if path[0] == ".":
            path = path[1:]
            if not path:
                raise _bad_path("expected property path to end with a name or index")
            if path[0] == "[":
                raise _bad_path("expected property name after '.'")
        elif path[0] == "[":
            if len(path) > 1 and path[1] == '"':
                key, i = "", 2
                while True:
                    if i >= len(path):
                        raise _bad_path("missing closing quote in property name")
                    if path[i] == '"':
                        i += 1
                        break
                    if path[i] == "\\" and i + 1 < len(path) and path[i + 1] == '"':
                        key, i = key + '"', i + 2
                    else:
                        key, i = key + path[i], i + 1
                if i >= len(path) or path[i] != "]":
                    raise _bad_path("missing closing bracket in property access")
                elements.append(key)
                path = path[i + 1 :]
            else:
                end = path.find("]")
                if end == -1:
                    raise _bad_path("missing closing bracket in array index")
                segment = path[1:end]
                if segment == "*":
                    elements.append("*")
                elif re.fullmatch(r"[+-]?[0-9]+", segment):
                    elements.append(int(segment))
                else:
                    raise _bad_path(f"invalid array index: {segment!r}")
                path = path[end + 1 :]
        else:
            end = min((i for i in (path.find("."), path.find("[")) if i != -1), default=len(path))
            elements.append(path[:end])
            path = path[end:]
    if not elements:
        raise CliError("empty config key path")
    return elements


def _bad_path(why: str) -> CliError:
    return CliError(f"invalid config key path: {why}")


def _coerce(value: str) -> Any:
    """object.go `coerce`: `true`/`false`, or a decimal integer (not one with a leading zero,
    which stays text, nor one beyond uint64)."""
    if value in ("true", "false"):
        return value == "true"
    if len(value) > 1 and value[0] == "0":
        return value
    # strconv.ParseInt(v, 10, 64), else ParseUint(v, 10, 64): a sign is allowed by the first.
    if re.fullmatch(r"[+-]?[0-9]+", value) and -(1 << 63) <= int(value) < (1 << 63):
        return int(value)
    if re.fullmatch(r"[0-9]+", value) and int(value) < (1 << 64):
        return int(value)
    return value


def _go_path(path: list[str | int]) -> str:
    """A PropertyPath as Go's %v prints a slice."""
    return "[" + " ".join(str(part) for part in path) + "]"


def _set_at(node: Any, prefix: list[str | int], path: list[str | int], new: Any) -> Any:
    """object.go `object.Set`: `new` at `path` under `node` (reached by `prefix`), containers
    made as the path's accessors ask; returns the new node."""
    if not path:
        return new
    accessor = path[0]
    if not isinstance(node, dict | list):
        if node is not None and len(prefix) != 1:
            kind = "an array" if isinstance(accessor, int) else "a map"
            raise CliError(f"could not set config: {_go_path(prefix)}: expected {kind}")
        # A nil value, or (COMPAT) any value at the first level: a new container.
        node = [None] * (accessor + 1) if isinstance(accessor, int) else {}
    here = [*prefix, accessor]
    if isinstance(node, list):
        if not isinstance(accessor, int):
            raise CliError(
                f"could not set config: {_go_path(here)}: key for an array must be an int"
            )
        if accessor < 0 or accessor > len(node):
            raise CliError(f"could not set config: {_go_path(here)}: array index out of range")
        if accessor == len(node):
            node.append(None)
        node[accessor] = _set_at(node[accessor], here, path[1:], new)
        return node
    if not isinstance(accessor, str):
        raise CliError(f"could not set config: {_go_path(here)}: key for a map must be a string")
    if len(path) == 1 and not node and accessor == "secure" and isinstance(new, str):
        raise CliError('could not set config: maps with the single key "secure" are reserved')
    node[accessor] = _set_at(node.get(accessor), here, path[1:], new)
    return node


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
        # mergeConfig sets `value = projectConfigType.Value` if it has one, then
        # `value = projectConfigType.Default` if it has one: with both, the default wins.
        fallback = declared.default if declared.default is not None else declared.value
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
        if declared.secret and not stored.is_secret:
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
        secret_keys=sorted(key for key, value in merged.items() if value.is_secret),
    )


# The names whose plain values `config set` weighs as possible secrets (pulumi/pulumi v3.259
# pkg/cmd/pulumi/config/config.go keyPattern, matched by looksLikeSecret against `k.Name()`).
SECRET_NAME_PATTERN = re.compile("(?i)passwd|pass|password|pwd|secret|token")


def config_key_name(key: str, path: bool) -> str:
    """The name of the `config.Key` that `config set` parses from `key` (pkg/cmd/pulumi/config
    io.go `parseConfigKey`): with --path and a `.` or `[` after the first character, the top
    segment's name followed by the rest of the path (`topKey.Name()+key[bracketOrDotIndex:]`);
    otherwise what follows the namespace (resource/config key.go `ParseKey`)."""
    if path:
        cut = min((i for i in (key.find("."), key.find("[")) if i != -1), default=-1)
        if cut > 0:  # strings.IndexAny(key, "[."), `if bracketOrDotIndex > 0`
            return config_key_name(key[:cut], path=False) + key[cut:]
    return key.split(":", 1)[-1] if ":" in key else key


def may_look_like_secret(key: str, path: bool) -> bool:
    """Whether `config set` runs looksLikeSecret's entropy check on this key's plain value: the
    key's whole name, with --path the whole path (`auth.token`), matches keyPattern."""
    return SECRET_NAME_PATTERN.search(config_key_name(key, path)) is not None


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
