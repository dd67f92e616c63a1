"""docs/configuration.md, generated from the configuration model: every key with its type,
default, bounds and description (stacks/schema.py), the secrets, and the checks across keys
(stacks/config_rules.py). A pure function of the model, so the page cannot drift from it
(tests/program/test_configuration_reference.py compares them).

    uv run python -m stacks.reference > docs/configuration.md
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from stacks.config import StackConfig
from stacks.config_rules import RULES
from stacks.schema import SECRETS

COMMAND = "uv run python -m stacks.reference > docs/configuration.md"

INTRODUCTION = f"""\
# Configuration reference

<!-- Generated from stacks/schema.py and stacks/config_rules.py by `{COMMAND}`:
     edit those, not this page. -->

A stack's settings are the keys of its `Pulumi.<stack>.yaml`, under the project's name
(`spark-vllm:hosts`, ...). Set a top-level key's whole value by editing that file, and one value
inside a mapping or a list with `pulumi config set --path`, e.g.
`pulumi config set --path 'hosts[1].gpus' 2` or `pulumi config set --path vllm.listen loopback`
(`true`, `false` and integers are stored as such, anything else as text, which the program
reads as the key's type). The two secrets are set with `--secret`, never in plain text:
`pulumi config set --secret apiKey "$(openssl rand -hex 24)"` and, for gated models,
`pulumi config set --secret hfToken hf_...`.

The Pulumi CLI checks what `Pulumi.yaml` declares before the program runs: `hosts`, `ssh`,
`image`, `model`, `vllm` and `apiKey` must be set, and a structured key must be a mapping or a
list. A top-level key left out takes the defaults below; a mapping that is set takes the
default of each key it leaves out. The program then checks every value and the
[rules across keys](#checks-across-keys), and reports each problem as one line that starts with
the key (`hosts[1].fabricIp: 10.241.0.11 is also spark1's`), before anything is deployed.

In the tables, `[]` after a key means a list of mappings, each with the keys that follow;
*unset* means the key is left out (or `null`).
"""


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    bounds: str
    description: str


def reference() -> str:
    """The whole page."""
    parts = [INTRODUCTION]
    for name, field in StackConfig.model_fields.items():
        key = field.alias or name
        parts.append(f"## `{key}`\n\n{field.description}\n\n{_table(_rows(StackConfig, name))}")
    parts.append(_secrets())
    parts.append(_rules())
    return "\n".join(parts)


def _rows(
    model: type[BaseModel], name: str, prefix: str = "", parent_default: Any = None
) -> Iterator[Row]:
    """The row of `model`'s field `name`, then those of the keys inside it."""
    field = model.model_fields[name]
    key = f"{prefix}{field.alias or name}"
    schema = model.model_json_schema(by_alias=True)["properties"][field.alias or name]
    if parent_default is not None:
        default: Any = getattr(parent_default, name)
        default_text = _value(default)
    elif field.is_required():
        default, default_text = None, "required"
    else:
        default = field.get_default(call_default_factory=True)
        default_text = _value(default)
    inner, listed = _inner_model(field)
    if inner is None:
        type_text, bounds = _type(schema)
        bounds += [f"matches `{p}`" for p in _patterns(field) if f"matches `{p}`" not in bounds]
    else:
        type_text = "list of mappings" if listed else "mapping"
        if "anyOf" in schema:
            type_text += " or unset"
        bounds = _bounds(_without_null(schema))
    # A top-level key's description is its section's paragraph.
    description = (field.description or "") if prefix else ""
    yield Row(key, type_text, default_text, ", ".join(bounds), description)
    if inner is not None:
        inner_prefix = f"{key}[]." if listed else f"{key}."
        inner_default = default if isinstance(default, BaseModel) else None
        for inner_name in inner.model_fields:
            yield from _rows(inner, inner_name, inner_prefix, inner_default)


def _inner_model(field: FieldInfo) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds (as a mapping, or a list of them), if any."""
    for candidate in _union_members(field.annotation):
        origin = typing.get_origin(candidate)
        if origin is list:
            (item,) = typing.get_args(candidate)
            if isinstance(item, type) and issubclass(item, BaseModel):
                return item, True
        elif isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate, False
    return None, False


def _patterns(field: FieldInfo) -> list[str]:
    """The patterns a field's value must match, wherever its type declares them: pydantic's JSON
    schema leaves out those of a type with its own validator (HubId)."""
    found: list[str] = []

    def visit(items: Any) -> None:
        for item in items:
            pattern = getattr(item, "pattern", None)
            if isinstance(pattern, str) and pattern not in found:
                found.append(pattern)
            if isinstance(item, FieldInfo):
                visit(item.metadata)
            if typing.get_origin(item) is typing.Annotated:
                visit(typing.get_args(item)[1:])
            for member in _union_members(item):
                if member is not item:
                    visit([member])

    visit(field.metadata)
    visit(_union_members(field.annotation))
    return found


def _union_members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    members = [m for m in schema.get("anyOf", [schema]) if m.get("type") != "null"]
    return members[0] if len(members) == 1 else schema


def _type(schema: dict[str, Any]) -> tuple[str, list[str]]:
    """A JSON schema fragment as a type in words, and its bounds."""
    if "anyOf" in schema:
        members = schema["anyOf"]
        typed = [_type(m) for m in members if m.get("type") != "null"]
        text = " or ".join(t for t, _ in typed)
        if len(typed) < len(members):
            text += " or unset"
        return text, [b for _, bounds in typed for b in bounds]
    if "const" in schema:
        return f"`{schema['const']}`", []
    if "enum" in schema:
        return " or ".join(f"`{v}`" for v in schema["enum"]), []
    kind = schema.get("type")
    if kind == "array":
        item, item_bounds = _type(schema.get("items", {}))
        return f"list of {item}s", _bounds(schema) + [f"each {b}" for b in item_bounds]
    if kind == "object":
        values, _ = _type(schema.get("additionalProperties", {}))
        return f"mapping of names to {values}s", []
    if schema.get("format") == "ipv4":
        return "IPv4 address", []
    names = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean"}
    return names.get(str(kind), "value"), _bounds(schema)


def _bounds(schema: dict[str, Any]) -> list[str]:
    found = []
    low = schema.get("minimum")
    high = schema.get("maximum")
    if low is not None and high is not None:
        found.append(f"{_number(low)} to {_number(high)}")
    elif low is not None:
        found.append(f"at least {_number(low)}")
    elif high is not None:
        found.append(f"at most {_number(high)}")
    if "exclusiveMinimum" in schema:
        found.insert(0, f"above {_number(schema['exclusiveMinimum'])}")
    if "minItems" in schema or "maxItems" in schema:
        items = schema.get("minItems"), schema.get("maxItems")
        if None not in items:
            found.append(f"{items[0]} to {items[1]} items")
        elif items[0] is not None:
            found.append(f"at least {items[0]} item{'s' if items[0] != 1 else ''}")
        else:
            found.append(f"at most {items[1]} items")
    if schema.get("minLength") == 1:
        found.append("not empty")
    if "pattern" in schema:
        found.append(f"matches `{schema['pattern']}`")
    return found


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "each key's default"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, dict)):
        return f"`{json.dumps(value)}`"
    if isinstance(value, float):
        return f"`{_number(value)}`"
    if value == "":
        return "empty"
    return f"`{value}`"


def _table(rows: Iterator[Row]) -> str:
    lines = ["| key | type | default | bounds | description |", "|---|---|---|---|---|"]
    for row in rows:
        cells = (f"`{row.key}`", row.type, row.default, row.bounds, row.description)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """A table cell: a `|` in it (a pattern's) would end the cell."""
    return text.replace("|", "\\|")


def _secrets() -> str:
    lines = [
        "## Secrets\n",
        "Set with `pulumi config set --secret`; the program refuses either in plain text.\n",
        "| key | description |",
        "|---|---|",
        *(f"| `{key}` | {_cell(text)} |" for key, text in SECRETS.items()),
    ]
    return "\n".join(lines) + "\n"


def _rules() -> str:
    items = "\n".join(f"{index}. {rule.summary}" for index, rule in enumerate(RULES, 1))
    return (
        "## Checks across keys\n\n"
        "Checked in this order once every value has its type; the first that fails is "
        "reported, keyed, and nothing is deployed.\n\n"
        f"{items}\n"
    )


if __name__ == "__main__":
    print(reference(), end="")
