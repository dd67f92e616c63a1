"""The README's stack set-up, command by command, through the CLI's rules: wherever the README
says a `pulumi` command works, the conformance layer agrees. The commands are read from the
README itself, so the two cannot drift apart."""

from __future__ import annotations

import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli import PulumiCli
from tests.program.conftest import HOST_KEYS
from tests.program.harness import FakeHosts, run_stack

REPO = Path(__file__).resolve().parents[2]
OPTIONAL_MARK = "only for gated models"  # a README step a user may leave out


@dataclass(frozen=True)
class ReadmeCommand:
    words: list[str]
    comment: str


def readme_flows() -> dict[str, list[ReadmeCommand]]:
    """Each shell block of the README that inits a stack: its `pulumi` commands, by stack."""
    text = (REPO / "README.md").read_text()
    flows: dict[str, list[ReadmeCommand]] = {}
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        lines = [line for line in block.splitlines() if line.strip().startswith("pulumi")]
        commands = [_parse(line) for line in lines]
        inits = [c.words[3] for c in commands if c.words[1:3] == ["stack", "init"]]
        if inits:
            flows[inits[0]] = commands
    return flows


def _parse(line: str) -> ReadmeCommand:
    code, _, comment = line.strip().partition(" #")
    code = re.sub(r'"\$\([^)]*\)"', secrets.token_hex(24), code)  # "$(openssl rand -hex 24)"
    return ReadmeCommand(shlex.split(code.split("&&")[0]), comment.strip())


def walk(cli: PulumiCli, commands: list[ReadmeCommand]) -> list[str]:
    """Run each command as the CLI would, up to the program; returns the verbs that ran."""
    stack, ran = "", []
    for command in commands:
        verb = command.words[1]
        if verb == "stack" and command.words[2] == "init":
            stack = command.words[3]
            cli.stack_init(stack)
        elif verb == "config" and command.words[2] == "set":
            if OPTIONAL_MARK in command.comment:
                continue
            args = command.words[3:]
            secret = "--secret" in args
            key, value = [a for a in args if a != "--secret"]
            cli.config_set(stack, key, value, secret=secret)
        elif verb in ("preview", "up", "destroy", "refresh"):
            cli.program_config(stack)  # the CLI's checks before any program run
        elif verb != "login":
            raise AssertionError(f"the README runs a command this test does not know: {command}")
        ran.append(verb)
    return ran


def test_the_readme_sets_up_the_dev_and_lab_stacks() -> None:
    assert set(readme_flows()) == {"dev", "lab"}


def test_the_dev_flow_works_and_the_program_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The dev stack names ~/.ssh/id_ed25519 and a known_hosts that lists both hosts (README step 2).
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("test-private-key\n")
    (home / ".ssh" / "known_hosts").write_text(
        f"10.1.230.180 {HOST_KEYS['spark1']}\n192.168.200.13 {HOST_KEYS['spark2']}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    cli = PulumiCli(REPO)
    ran = walk(cli, readme_flows()["dev"])
    assert ran == ["stack", "config", "preview", "up"]
    assert cli.stacks["dev"].config["spark-vllm:apiKey"].secure is not None
    assert "spark-vllm:hfToken" not in cli.stacks["dev"].config  # left out: not gated
    preview = run_stack(cli, "dev", FakeHosts(), preview=True)
    assert preview.unknown_outputs >= {"endpointUrl", "readiness"}
    up = run_stack(cli, "dev", FakeHosts())
    assert up.outputs["modelId"] == "qwen3.5-122b"
    # Every host key is pinned through known_hosts: the warnings are the images' bare tags and
    # the model's branch, each with what to pin it to.
    pins = (" is a tag", "is a branch or tag")
    assert [w for w in up.warnings if not any(pin in w for pin in pins)] == []
    assert any(w.startswith("model.revision main of ") for w in up.warnings), up.warnings


def test_the_lab_flow_passes_the_clis_checks() -> None:
    """The program itself needs the lab's key files: tests/lab deploys the lab stack for real."""
    cli = PulumiCli(REPO)
    ran = walk(cli, readme_flows()["lab"])
    assert ran == ["stack", "config", "up", "destroy"]
    assert cli.program_config("lab").secret_keys == ["spark-vllm:apiKey"]
