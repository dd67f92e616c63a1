"""The config text the CLI hands the program, as Go reads YAML (yaml.v3) and writes JSON. Each
case is one that a Python reading (PyYAML's YAML 1.1, Python's json) gets wrong; sources are
cited in tests/cli/gotext.py and stack.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli import CliError, PulumiCli, gotext
from tests.cli.project import load_project
from tests.cli.stack import Secure, StackFile, merge_config

PROJECT = "name: demo\nruntime: python\n"


def program_config(tmp_path: Path, stack_yaml: str) -> tuple[dict[str, str], list[str]]:
    """What the program receives for a stack file holding `stack_yaml` under `config:`."""
    (tmp_path / "Pulumi.yaml").write_text(PROJECT)
    project = load_project(tmp_path / "Pulumi.yaml")
    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n" + stack_yaml)
    config = merge_config(project, StackFile.load(project, "dev"))
    return config.values, config.secret_keys


@pytest.mark.parametrize(
    ("written", "received"),
    [
        # Numbers are stored as Go's JSON text of the float or int yaml.v3 decoded.
        ("1.0", "1"),
        ("20.0", "20"),
        ("0.8", "0.8"),
        ("1e16", "10000000000000000"),  # a float in YAML 1.2 (PyYAML: the string "1e16")
        ("1e21", "1e+21"),
        ("1.5e-7", "1.5e-7"),
        ("1_000", "1000"),
        ("0x1F", "31"),
        ("017", "15"),  # Go's ParseInt with base 0: octal
        ("09", "9"),  # not octal: a float, 9
        # YAML 1.1's booleans are strings in yaml.v3; YAML 1.2's are bools.
        ("yes", "yes"),
        ("on", "on"),
        ("True", "true"),
        ("12:30", "12:30"),  # YAML 1.1 sexagesimal (PyYAML: 750)
        ('"1.0"', "1.0"),  # quoted: a string, as written
    ],
)
def test_a_scalar_reaches_the_program_as_go_writes_it(
    tmp_path: Path, written: str, received: str
) -> None:
    values, _ = program_config(tmp_path, f"  demo:value: {written}\n")
    assert values["demo:value"] == received


def test_an_object_is_go_json_floats_and_html_characters_included(tmp_path: Path) -> None:
    stack = "  demo:obj:\n    b: [1.0, 1e16, yes]\n    a: '<x&y>'\n    1: one\n    true: t\n"
    values, _ = program_config(tmp_path, stack)
    assert values["demo:obj"] == (
        '{"1":"one","a":"\\u003cx\\u0026y\\u003e","b":[1,10000000000000000,"yes"],"true":"t"}'
    )
    assert json.loads(values["demo:obj"])["a"] == "<x&y>"


def test_a_secret_inside_an_object_is_decrypted_and_makes_the_key_secret(tmp_path: Path) -> None:
    cipher = Secure.encrypt("hf_abc").ciphertext
    stack = f"  demo:model:\n    id: org/m\n    token:\n      secure: {cipher}\n  demo:plain: x\n"
    values, secret_keys = program_config(tmp_path, stack)
    assert json.loads(values["demo:model"]) == {"id": "org/m", "token": "hf_abc"}
    assert secret_keys == ["demo:model"]
    # In the stack file it stays ciphertext, inside the object.
    stored = StackFile.load(load_project(tmp_path / "Pulumi.yaml"), "dev")
    assert stored.document()["config"]["demo:model"]["token"] == {"secure": cipher}


def test_go_float_text_follows_encoding_json() -> None:
    cases = [
        (0.0, "0"),
        (-0.0, "-0"),
        (1e20, "100000000000000000000"),
        (1e-6, "0.000001"),
        (9.99e-7, "9.99e-7"),
        (1e-10, "1e-10"),
        (123456789.0, "123456789"),
        (0.1, "0.1"),
    ]
    assert [(value, gotext.float_text(value)) for value, _ in cases] == cases


def test_a_timestamp_is_refused_rather_than_guessed(tmp_path: Path) -> None:
    with pytest.raises(gotext.GoTextError, match="timestamp"):
        program_config(tmp_path, "  demo:when: 2026-12-03\n")


@pytest.mark.parametrize(
    ("written", "shown"), [(".inf", "+Inf"), ("-.Inf", "-Inf"), (".nan", "NaN")]
)
def test_a_float_json_cannot_write_stops_preview_and_up(
    tmp_path: Path, written: str, shown: str
) -> None:
    """config.Value keeps a number as its JSON text; json.Marshal refuses these, so loading the
    stack file fails and up says so (pkg/cmd/pulumi/operations/up.go)."""
    cli = cli_with(tmp_path, f"  demo:size: {written}\n")
    with pytest.raises(CliError) as caught:
        cli.program_config("dev")
    assert str(caught.value) == f"getting stack configuration: json: unsupported value: {shown}"


def cli_with(tmp_path: Path, stack_yaml: str) -> PulumiCli:
    (tmp_path / "Pulumi.yaml").write_text(PROJECT)
    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n" + stack_yaml)
    cli = PulumiCli(tmp_path)
    cli.stack_init("dev")
    return cli


def test_config_set_path_merges_one_nested_key_and_types_it(tmp_path: Path) -> None:
    cli = cli_with(tmp_path, "  demo:vllm:\n    extraArgs: [--a]\n    port: 8000\n")
    cli.config_set("dev", "vllm.kvCache", "auto", path=True)
    cli.config_set("dev", "vllm.enforceEager", "true", path=True)  # coerce: a bool
    cli.config_set("dev", "vllm.maxModelLen", "32768", path=True)  # an integer
    cli.config_set("dev", "vllm.revision", "0123", path=True)  # a leading zero: text
    cli.config_set("dev", "hosts[0].name", "spark1", path=True)  # a new list of maps
    cli.config_set("dev", 'hosts[0]["odd.key"]', "x", path=True)
    cli.config_set("dev", "hosts[1].name", "spark2", path=True)  # one past the end: appended
    cli.config_set("dev", "model.token", "hf_abc", secret=True, path=True)
    config = cli.program_config("dev")
    assert json.loads(config.values["demo:vllm"]) == {
        "extraArgs": ["--a"], "port": 8000, "kvCache": "auto", "enforceEager": True,
        "maxModelLen": 32768, "revision": "0123",
    }  # fmt: skip
    assert json.loads(config.values["demo:hosts"]) == [
        {"name": "spark1", "odd.key": "x"},
        {"name": "spark2"},
    ]
    assert json.loads(config.values["demo:model"]) == {"token": "hf_abc"}
    assert config.secret_keys == ["demo:model"]
    # A single segment is set as `config set` sets it: text, untyped.
    cli.config_set("dev", "port", "8000", path=True)
    assert cli.program_config("dev").values["demo:port"] == "8000"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("hosts[5].name", "array index out of range"),
        ("vllm.extraArgs.x", "[vllm extraArgs x]: key for an array must be an int"),
        ("vllm.extraArgs[0].x", "[vllm extraArgs 0]: expected a map"),
        ("vllm[0]", "key for a map must be a string"),
        ("[0].x", "first path segement of config key must be a string"),
        ("vllm.", "expected property path to end with a name or index"),
        ("vllm[x]", "invalid array index"),
        ("fresh.secure", 'maps with the single key "secure" are reserved'),
    ],
)
def test_config_set_path_refuses_what_the_cli_refuses(
    tmp_path: Path, key: str, message: str
) -> None:
    cli = cli_with(tmp_path, "  demo:vllm:\n    extraArgs: [--a]\n  demo:hosts: []\n")
    with pytest.raises(CliError, match=re.escape(message)):
        cli.config_set("dev", key, "v", path=True)
