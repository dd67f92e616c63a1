"""`Pulumi.yaml` as the Pulumi CLI loads it, before any command (stack init, config, preview, up).

Each rule is the CLI's own, read from pulumi/pulumi v3.259 (commit 1b5949891b, 2026-08-21):

- `sdk/go/common/workspace/loaders.go` `LoadProjectBytes`: unmarshal the YAML, `ValidateProject`
  (the JSON schema `project.json`, vendored here as `project.schema.json`), then
  `RewriteShorthandConfigValues`, then `Project.Validate()`. Schema failures are wrapped as
  "could not validate '<path>': ...", `Project.Validate` failures as "could not unmarshal ...".
- `sdk/go/common/workspace/project.go` `ValidateProject` (the name checks, then the schema, every
  nested error as `#<instance location>: <message>` in a go-multierror list) and
  `Project.Validate` (the per-key config rules, quoted below where they are applied).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.cli import gotext

SCHEMA_FILE = Path(__file__).with_name("project.schema.json")
TYPE_NAMES = ("string", "integer", "boolean", "array", "object")


class CliError(Exception):
    """A refusal, worded as the CLI words it (what follows `error: ` in its output)."""


@dataclass(frozen=True)
class ConfigItemsType:
    type: str
    items: ConfigItemsType | None = None


@dataclass(frozen=True)
class ConfigDeclaration:
    """`ProjectConfigType`: one key of the `config:` block, after the shorthand rewrite."""

    type: str | None = None
    items: ConfigItemsType | None = None
    description: str = ""
    secret: bool = False
    default: Any = None
    value: Any = None

    @property
    def explicitly_typed(self) -> bool:
        return self.type is not None

    @property
    def full_type_name(self) -> str:
        """`InferFullTypeName`: `array<string>`, `array<object>`, or the plain name."""
        return infer_full_type_name(self.type or "string", self.items)


@dataclass(frozen=True)
class Project:
    name: str
    path: Path
    config: dict[str, ConfigDeclaration] = field(default_factory=dict)

    def is_namespaced_by_project(self, key: str) -> bool:
        """`configKeyIsNamespacedByProject`: no namespace, or this project's."""
        return ":" not in key or key.startswith(f"{self.name}:")


def load_project(path: Path) -> Project:
    """`LoadProject(path)`: the project, or the CLI's refusal."""
    try:
        # Read as Go's yaml.v3 reads it (tests/cli/gotext.py).
        raw = gotext.load(path.read_text(encoding="utf-8-sig"))
    except (yaml.YAMLError, gotext.GoTextError) as error:
        raise CliError(f"could not unmarshal '{path}': {error}") from None
    validate_project(raw, path)
    project = _project_from(raw, path)
    problem = project_problem(project)
    if problem is not None:
        raise CliError(f"could not unmarshal '{path}': {problem}")
    return project


def validate_project(raw: Any, path: Path) -> None:
    """`ValidateProject`: the `name` checks, then every schema error of `project.json`."""
    if not isinstance(raw, dict):
        raise CliError(f"could not validate '{path}': expected project to be an object")
    if "name" not in raw:
        raise CliError(f"could not validate '{path}': project is missing a 'name' attribute")
    if not isinstance(raw["name"], str) or raw["name"] == "":
        raise CliError(
            f"could not validate '{path}': project is missing a non-empty string 'name' attribute"
        )
    errors = sorted(schema_errors(raw))
    if errors:
        raise CliError(f"could not validate '{path}': {multierror(errors)}")


def schema_errors(raw: Any) -> Iterator[str]:
    """Every error and nested cause, as santhosh-tekuri/jsonschema v5 phrases the common ones."""
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    for error in validator.iter_errors(raw):
        yield from _flatten(error)


def _flatten(error: jsonschema.ValidationError) -> Iterator[str]:
    location = "#" + "".join(f"/{part}" for part in error.absolute_path)
    yield f"{location}: {_message(error)}"
    for cause in error.context or ():
        yield from _flatten(cause)


def _message(error: jsonschema.ValidationError) -> str:
    kind, expected, instance = error.validator, error.validator_value, error.instance
    if kind == "type":
        wanted = expected if isinstance(expected, list) else [expected]
        return f"expected {' or '.join(wanted)}, but got {_json_type(instance)}"
    if kind == "oneOf":
        return "oneOf failed"
    if kind == "enum":
        return "value must be one of " + ", ".join(json.dumps(v) for v in expected)
    if kind == "additionalProperties":
        extra = sorted(set(instance) - set(error.schema.get("properties", {})))
        return f"additionalProperties {', '.join(repr(k) for k in extra)} not allowed"
    if kind == "required":
        return error.message.replace(" is a required property", "").join(
            ("missing properties: ", "")
        )
    return error.message


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def multierror(errors: list[str]) -> str:
    """hashicorp/go-multierror's ListFormatFunc."""
    if len(errors) == 1:
        return f"1 error occurred:\n\t* {errors[0]}\n\n"
    points = "\n\t".join(f"* {e}" for e in errors)
    return f"{len(errors)} errors occurred:\n\t{points}\n\n"


def _project_from(raw: dict[str, Any], path: Path) -> Project:
    name = raw["name"]
    config = raw.get("config")
    declarations: dict[str, ConfigDeclaration] = {}
    if isinstance(config, dict):
        for key, entry in config.items():
            declarations[key] = _declaration(name, key, entry)
    return Project(name=name, path=path, config=declarations)


def _declaration(project_name: str, key: str, entry: Any) -> ConfigDeclaration:
    """`RewriteShorthandConfigValues`: a bare scalar or list is a `default` for the project's own
    keys and a `value` for other namespaces."""
    if not isinstance(entry, dict):
        namespaced = ":" not in key or key.startswith(f"{project_name}:")
        return ConfigDeclaration(**({"default": entry} if namespaced else {"value": entry}))
    return ConfigDeclaration(
        type=entry.get("type"),
        items=_items(entry.get("items")),
        description=entry.get("description", ""),
        secret=bool(entry.get("secret", False)),
        default=entry.get("default"),
        value=entry.get("value"),
    )


def _items(raw: Any) -> ConfigItemsType | None:
    if not isinstance(raw, dict):
        return None
    return ConfigItemsType(type=raw["type"], items=_items(raw.get("items")))


def infer_full_type_name(type_name: str, items: ConfigItemsType | None) -> str:
    if items is not None:
        return f"array<{infer_full_type_name(items.type, items.items)}>"
    return type_name


def project_problem(project: Project) -> str | None:
    """`Project.Validate()`: the first problem (the CLI walks a Go map; this walks keys sorted)."""
    for key in sorted(project.config):
        declared = project.config[key]
        if declared.default is not None and declared.value is not None:
            return f"project config '{key}' cannot have both a 'default' and 'value' attribute"
        if project.is_namespaced_by_project(key):
            if declared.type == "array" and declared.items is None:
                return (
                    f"The configuration key '{key}' declares an array but does not specify "
                    "the underlying type via the 'items' attribute"
                )
            if (
                declared.explicitly_typed
                and declared.default is not None
                and not config_value_fits(declared.type or "", declared.items, declared.default)
            ):
                return (
                    f"The default value specified for configuration key '{key}' is not of the "
                    f"expected type '{declared.full_type_name}'"
                )
        else:
            if declared.explicitly_typed:
                return (
                    f"Configuration key '{key}' is not namespaced by the project and should not "
                    "define a type"
                )
            if declared.default is not None:
                return (
                    f"Configuration key '{key}' is not namespaced by the project and should not "
                    "define a default value. Did you mean to use the 'value' attribute instead of "
                    "'default'?"
                )
            if declared.value is None:
                return (
                    f"Configuration key '{key}' is namespaced and must provide an attribute 'value'"
                )
    return None


def config_value_fits(type_name: str, items: ConfigItemsType | None, value: Any) -> bool:
    """`ValidateConfigValue` (project.go), value as decoded YAML or JSON."""
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "integer":
        if isinstance(value, bool):
            return False  # a Go bool is neither an int nor a float64
        if isinstance(value, int):
            return True
        # "Config values come from YAML which by default will return floats not int. If it's a
        # whole number we'll allow it here though"; "Allow strings here if they parse as integers"
        if isinstance(value, float):
            return value == int(value)
        if isinstance(value, str):
            return _atoi(value)
        return False
    if type_name == "boolean":
        return value in ("true", "false") or isinstance(value, bool)
    if type_name == "object":
        return isinstance(value, dict)
    if not isinstance(value, list) or items is None:
        return False
    return all(config_value_fits(items.type, items.items, item) for item in value)


def _atoi(text: str) -> bool:
    """Go's strconv.Atoi: optional sign, decimal digits only, no spaces or underscores."""
    digits = text[1:] if text[:1] in "+-" else text
    return digits.isascii() and digits.isdigit()
