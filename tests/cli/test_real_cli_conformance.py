"""The CLI port (tests/cli) held to the real Pulumi CLI (scripts/build-pulumi.sh): the same
project and stack files through both, and what each refuses (with its message) and what each
hands the program (every config value as text, and which keys are secret) compared.

The port stays because every run under Pulumi's mock runtime starts through it (the program
tests and the lab modules not on the real CLI); this keeps it honest where it is subtle: Go's
YAML and JSON text, objects with secrets inside, the project file's rules, the merge.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.cli import CliError, PulumiCli
from tests.lab.realcli import RealPulumi, pulumi_binary

REPO = Path(__file__).resolve().parents[2]
# A program that exports what it was handed: the config as the SDK holds it, and the secret keys.
PROGRAM = """\
import json
import pulumi
from pulumi.runtime import config

pulumi.export("config", json.dumps(config.CONFIG.get(), sort_keys=True))
pulumi.export("secretKeys", json.dumps(sorted(config._SECRET_KEYS.get())))
"""
DEMO = "name: demo\nruntime: python\n"


@pytest.fixture(scope="module", autouse=True)
def real_cli() -> None:
    if shutil.which("pulumi") is None:
        reason = "no real pulumi CLI on PATH (bash scripts/build-pulumi.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def real(tmp_path: Path, project_yaml: str, stack_yaml: str, secrets: dict[str, str]) -> Any:
    """The real CLI: `stack init dev`, each secret set with --secret, `up`; what the program
    received ({key: text}, [secret keys]), or the CLI's error text."""
    cli = RealPulumi.for_project(tmp_path / "real", files=())
    (cli.project_dir / "Pulumi.yaml").write_text(project_yaml)
    (cli.project_dir / "__main__.py").write_text(PROGRAM)
    (cli.project_dir / "Pulumi.dev.yaml").write_text(stack_yaml)
    init = cli.run("stack", "init", "dev", check=False)
    if init.returncode != 0:
        return init.output
    for key, value in secrets.items():
        cli.run("config", "set", "--secret", key, value)
    up = cli.run("up", "--yes", "--skip-preview", check=False)
    if up.returncode != 0:
        return up.output
    outputs = cli.outputs()
    return json.loads(outputs["config"]), json.loads(outputs["secretKeys"])


def ported(tmp_path: Path, project_yaml: str, stack_yaml: str, secrets: dict[str, str]) -> Any:
    directory = tmp_path / "port"
    directory.mkdir()
    (directory / "Pulumi.yaml").write_text(project_yaml)
    (directory / "Pulumi.dev.yaml").write_text(stack_yaml)
    try:
        cli = PulumiCli(directory)
        cli.stack_init("dev")
        for key, value in secrets.items():
            cli.config_set("dev", key, value, secret=True)
        config = cli.program_config("dev")
    except CliError as error:
        return str(error)
    return dict(config.values), sorted(config.secret_keys)


def both(
    tmp_path: Path, project_yaml: str, stack_yaml: str, secrets: dict[str, str] | None = None
) -> tuple[Any, Any]:
    return (
        real(tmp_path, project_yaml, stack_yaml, secrets or {}),
        ported(tmp_path, project_yaml, stack_yaml, secrets or {}),
    )


def test_the_committed_project_and_dev_stack_reach_the_program_alike(tmp_path: Path) -> None:
    """The project's own Pulumi.yaml and Pulumi.dev.yaml, the README's `config set --secret
    apiKey`: every default merged, every object's text, the secret keys."""
    project, stack = (REPO / "Pulumi.yaml").read_text(), (REPO / "Pulumi.dev.yaml").read_text()
    got, expected = both(tmp_path, project, stack, {"apiKey": "k" * 32})
    assert got == expected


def test_go_scalars_and_objects_reach_the_program_alike(tmp_path: Path) -> None:
    """Each scalar a Python reading gets wrong (test_config_text.py), an object with floats,
    YAML 1.1 booleans and HTML characters, and a secret set inside an object with --path's
    sibling: one stack, every value compared."""
    scalars = ["1.0", "20.0", "0.8", "1e16", "1e21", "1.5e-7", "1_000", "0x1F", "017", "09",
               "yes", "on", "True", "12:30", '"1.0"']  # fmt: skip
    lines = [f"  demo:v{i}: {text}" for i, text in enumerate(scalars)]
    lines.append("  demo:obj:\n    b: [1.0, 1e16, yes]\n    a: '<x&y>'\n    1: one\n    true: t")
    got, expected = both(tmp_path, DEMO, "config:\n" + "\n".join(lines) + "\n", {"token": "s3"})
    assert got == expected


@pytest.mark.parametrize(
    ("case", "config_block", "stack_block"),
    [
        ("an array without items", "hosts:\n  type: array\n", ""),
        ("default and value", "port:\n  default: 1\n  value: 2\n", ""),
        ("a default not of its type", "port:\n  type: integer\n  default: eighty\n", ""),
        ("a required key missing", "hosts:\n  type: array\n  items:\n    type: object\n", ""),
        (
            "a list where an object is declared",
            "ssh:\n  type: object\n",
            "  demo:ssh: [1, 2]\n",
        ),
        (
            "a plain value for a declared secret",
            "apiKey:\n  type: string\n  secret: true\n",
            "  demo:apiKey: plain\n",
        ),
    ],
)
def test_a_refusal_is_the_real_clis_message(
    tmp_path: Path, case: str, config_block: str, stack_block: str
) -> None:
    """The port refuses what the real CLI refuses, with the real CLI's own message."""
    project = DEMO + "config:\n" + textwrap.indent(config_block, "  ")
    stack = "config:\n" + stack_block if stack_block else "config: {}\n"
    got, expected = both(tmp_path, project, stack)
    assert isinstance(expected, str), f"{case}: the port accepted it: {expected}"
    assert isinstance(got, str), f"{case}: the real CLI accepted it: {got}"
    message = expected.replace(str(tmp_path / "port"), str(tmp_path / "real" / "project"))
    assert message in got.replace("\n", " ").replace("  ", " "), (case, message, got)


def test_the_binary_is_the_pinned_cli() -> None:
    pinned = (REPO / "scripts/pulumi-build/modules.tsv").read_text()
    version = os.popen(f"{pulumi_binary()} version").read().strip()
    assert f"github.com/pulumi/pulumi/pkg/v3@{version}\t" in pinned, version
