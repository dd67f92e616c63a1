"""docs/configuration.md is generated from the configuration model (stacks/reference.py): the
committed page is what the model generates now, every key has a description to show, and the
generator reads types, defaults and bounds where the model declares them."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from stacks.config import StackConfig
from stacks.config_rules import RULES
from stacks.reference import COMMAND, reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_reference_is_what_the_model_generates() -> None:
    assert PAGE.read_text() == reference(), f"docs/configuration.md is stale: run `{COMMAND}`"


def models_in(annotation: typing.Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from models_in(argument)


def every_field(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str | None]]:
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        yield key, field.description
        for inner in models_in(field.annotation):
            yield from every_field(inner, f"{key}.")


def test_every_key_has_a_description() -> None:
    fields = list(every_field(StackConfig))
    assert len(fields) > 100  # the walk reaches the nested models
    assert [key for key, description in fields if not description] == []


def rows() -> dict[str, list[str]]:
    """The page's table rows by key: type, default, bounds, description."""
    found = {}
    for line in PAGE.read_text().splitlines():
        if line.startswith("| `") and line.count(" | ") >= 4:
            key, *cells = (cell.strip() for cell in line.strip("| ").split(" | "))
            found[key.strip("`")] = cells
    return found


def test_each_key_is_one_row_with_its_path_as_the_user_writes_it() -> None:
    keys = list(rows())
    assert len(keys) == len(set(keys))
    for key in ("hosts[].fabricIp", "vllm.benchmark.concurrencies", "models[].image.ref",
                "preflight.knownBad[].version", "monitoring.nodeExporter.port"):  # fmt: skip
        assert key in keys


def test_types_defaults_and_bounds_are_the_models() -> None:
    page = rows()
    assert page["vllm.gpuMemoryUtilization"][:3] == [
        "number or `auto`",
        "`0.8`",
        "above 0, at most 0.98",
    ]
    assert page["hosts[].port"][:3] == ["integer", "`22`", "1 to 65535"]
    assert page["vllm.benchmark.concurrencies"][:3] == [
        "list of integers",
        "`[1, 4]`",
        "1 to 8 items, each 1 to 512",
    ]
    assert page["hosts[].fabricIp"][:2] == ["IPv4 address", "required"]
    assert page["bastion"][:2] == ["mapping or unset", "unset"]
    # A nested key's default is the one its parent's default gives it, not its model's own.
    assert page["monitoring.grafana.image.ref"][1] == "`grafana/grafana:12.2.0`"
    # A pattern of a type with its own validator, which pydantic's JSON schema leaves out.
    assert page["model.id"][2] == "matches `^[\\w.-]+/[\\w.-]+$`"
    # A `|` of a pattern would end the table cell.
    assert page["preflight.knownBad[].reason"][2] == "not empty, matches `^[^\\|;\\n]+$`"


def test_the_rules_are_listed_in_the_order_they_run() -> None:
    text = PAGE.read_text()
    listed = text[text.index("## Checks across keys") :]
    for number, rule in enumerate(RULES, 1):
        assert f"\n{number}. {rule.summary}\n" in listed
