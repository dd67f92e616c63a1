"""What every Python host script shares with lib.sh: `--flag value` arguments parsed as
parse_flags parses them, one failure format that names the host, the step and the likely cause
(lib.sh `fail`), and the quoting of what goes to a remote shell. A script imports it as a sibling
(`python3 DIR/x.py` puts DIR first on sys.path); one that is copied somewhere alone (into a
container or an image) cannot, and stays self-contained. Standard library only.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Sequence

BUG = "a bug in spark-vllm: please report it"


class StepFailed(Exception):
    """One clear failure: what went wrong and its likely cause (printed by `fail`)."""

    def __init__(self, what: str, cause: str = "") -> None:
        super().__init__(what)
        self.what, self.cause = what, cause


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_flags(argv: Sequence[str]) -> dict[str, str]:
    """`--some-flag VALUE` or `--some-flag=VALUE` pairs as {"some_flag": VALUE}; every flag takes
    one value (lib.sh parse_flags)."""
    flags: dict[str, str] = {}
    words = list(argv)
    while words:
        word = words.pop(0)
        if not word.startswith("--"):
            raise StepFailed(f"unexpected argument {word!r}", BUG)
        if "=" in word:
            key, value = word[2:].split("=", 1)
        elif words:
            key, value = word[2:], words.pop(0)
        else:
            raise StepFailed(f"flag {word} has no value", BUG)
        flags[key.replace("-", "_")] = value
    return flags


def require(flags: dict[str, str], *names: str) -> None:
    """Every named flag was given (lib.sh require)."""
    for name in names:
        if name.replace("-", "_") not in flags:
            raise StepFailed(f"missing --{name}", BUG)


def fail(host: str, step: str, failure: StepFailed) -> None:
    """The failure as lib.sh `fail` prints it: `spark-vllm: HOST: STEP: WHAT` and its cause."""
    print(f"spark-vllm: {host or os.uname().nodename}: {step}: {failure.what}", file=sys.stderr)
    if failure.cause:
        print(f"  likely cause: {failure.cause}", file=sys.stderr)


def run_step(step: str, argv: Sequence[str], body: Callable[[dict[str, str]], int | None]) -> int:
    """`body(flags)` as step `step`: its exit status (0 when it returns none), or 1 with one
    failure message when it fails, an unexpected error included (never a bare traceback)."""
    flags: dict[str, str] = {}
    try:
        flags = parse_flags(argv)
        return body(flags) or 0
    except StepFailed as failure:
        fail(flags.get("host", ""), step, failure)
    except Exception as error:
        fail(flags.get("host", ""), step, StepFailed(f"{type(error).__name__}: {error}", BUG))
    return 1


def words(*args: str) -> str:
    """One command line for a remote shell, every word quoted (lib.sh `words`)."""
    return shlex.join(args)


def ssh_option_value(value: str) -> str:
    """VALUE as OpenSSH reads an option's value (`ssh -o`), one word even with a space or a
    quote (lib.sh ssh_option_value)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
