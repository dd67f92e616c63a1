"""The real Pulumi CLI and engine (scripts/build-pulumi.sh) on a copy of the project, as a user
runs them: a file backend, passphrase secrets, offline, the lab's plugins on PATH where the Go
module proxy serves no real one (tests/lab/plugins).

    cli = RealPulumi.for_project(tmp_dir)            # copies the program, a fresh backend
    cli.run("stack", "init", "lab")
    cli.run("config", "set", "--secret", "apiKey", key)
    plan = cli.preview()                             # {resource name: op} from `preview --json`
    cli.run("up", "--yes", "--skip-preview")
    cli.outputs()                                    # `stack output --json --show-secrets`
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.lab.plugins.providers import INVOKE_TIMING, STEP_TIMING

REPO = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).resolve().parent / "plugins" / "bin"
# What a program run needs of the repository (the README's setup has the rest: the venv).
PROGRAM_FILES = ("Pulumi.yaml", "__main__.py", "components", "composition", "stacks")
PASSPHRASE = "lab-passphrase-not-a-secret"
# A whole `up` of the lab (image and weights copies, the readiness wait) stays well within this.
RUN_TIMEOUT_S = 30 * 60
# Replacements show as several steps of one resource; the main one names what the user sees.
REPLACE_OPS = {"replace", "create-replacement", "delete-replaced", "discard-replaced"}


class PulumiFailed(AssertionError):
    """A CLI run that exited non-zero; its message is what the user saw."""


def pulumi_binary() -> str:
    found = shutil.which("pulumi")
    if found is None:
        raise RuntimeError(
            "no `pulumi` on PATH: run scripts/setup-dev.sh (scripts/build-pulumi.sh)"
        )
    return found


def main_op(ops: Sequence[str]) -> str:
    """The step a resource's preview steps add up to, as the summary counts it."""
    if any(op in REPLACE_OPS for op in ops):
        return "replace"
    return ops[-1]


@dataclass
class Run:
    """One CLI run: its arguments, exit code, output and wall time."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    started: float  # epoch seconds

    @property
    def output(self) -> str:
        """What the user reads: with --json, the diagnostics' text out of the event stream."""
        if "--json" not in self.args:
            return self.stdout + self.stderr
        messages = []
        for line in self.stdout.splitlines():
            with contextlib.suppress(ValueError):
                diagnostic = json.loads(line).get("diagnosticEvent")
                if diagnostic:
                    messages.append(f"{diagnostic.get('prefix', '')}{diagnostic['message']}")
        return "".join(messages) + self.stderr


@dataclass
class RealPulumi:
    project_dir: Path
    home: Path
    backend: Path
    log_dir: Path
    runs: list[Run] = field(default_factory=list)

    @classmethod
    def for_project(
        cls, root: Path, source: Path = REPO, files: Sequence[str] = PROGRAM_FILES
    ) -> RealPulumi:
        """A copy of `source`'s `files` under `root`, with its own backend and PULUMI_HOME."""
        project_dir = root / "project"
        project_dir.mkdir(parents=True, exist_ok=True)
        for name in files:
            path = source / name
            if path.is_dir():
                shutil.copytree(path, project_dir / name, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
            else:
                shutil.copy2(path, project_dir / name)
        for sub in ("home", "backend", "logs"):
            (root / sub).mkdir(exist_ok=True)
        return cls(project_dir, root / "home", root / "backend", root / "logs")

    def env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            # The user's own Pulumi settings never leak into the lab's runs.
            if not key.startswith(("PULUMI_", "DOCKER_"))
        }
        env.update(
            PATH=f"{PLUGINS}:{os.path.dirname(pulumi_binary())}:{env.get('PATH', '')}",
            PULUMI_HOME=str(self.home),
            PULUMI_BACKEND_URL=f"file://{self.backend}",
            PULUMI_CONFIG_PASSPHRASE=PASSPHRASE,
            PULUMI_SKIP_UPDATE_CHECK="true",
            PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true",
            PULUMI_CREDENTIAL_STORE="plaintext",
            PULUMI_SKIP_CONFIRMATIONS="true",
            NO_COLOR="1",
            SPARK_VLLM_PLUGIN_LOG=str(self.log_dir),
        )
        return env

    def run(self, *args: str, check: bool = True, timeout: float = RUN_TIMEOUT_S) -> Run:
        started, wall = time.monotonic(), time.time()
        done = subprocess.run(
            [pulumi_binary(), *args, "--non-interactive"],
            cwd=self.project_dir,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        seconds = time.monotonic() - started
        run = Run(args, done.returncode, done.stdout, done.stderr, seconds, wall)
        self.runs.append(run)
        if check and done.returncode != 0:
            raise PulumiFailed(f"pulumi {' '.join(args)} exited {done.returncode}:\n{run.output}")
        return run

    # -- the stack's files -------------------------------------------------------------------

    def write_stack_file(self, stack: str, config: Mapping[str, Any]) -> Path:
        """`Pulumi.<stack>.yaml` with `config` (namespaced keys), as a user writes it."""
        path = self.project_dir / f"Pulumi.{stack}.yaml"
        document = yaml.safe_load(path.read_text()) if path.exists() else {}
        document = document or {}
        document["config"] = {**(document.get("config") or {}), **config}
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def replace_config(self, stack: str, config: Mapping[str, Any]) -> None:
        """The stack file's plain settings become `config`; its secrets stay as they are."""
        path = self.project_dir / f"Pulumi.{stack}.yaml"
        document = yaml.safe_load(path.read_text()) or {}
        secure = {
            key: value
            for key, value in (document.get("config") or {}).items()
            if isinstance(value, dict) and "secure" in value
        }
        document["config"] = {**config, **secure}
        path.write_text(yaml.safe_dump(document, sort_keys=False))

    # -- what the engine reports -------------------------------------------------------------

    def preview(self, *extra: str, custom_only: bool = False) -> dict[str, str]:
        """`pulumi preview --json`: each resource's step by name (a component's too, unless
        `custom_only`)."""
        run = self.run("preview", "--json", *extra)
        return plan_of(json.loads(run.stdout), custom_only)

    def outputs(self) -> dict[str, Any]:
        return dict(json.loads(self.run("stack", "output", "--json", "--show-secrets").stdout))

    def secret_output_names(self) -> set[str]:
        """The outputs the engine keeps secret: `stack output --json` shows them as [secret]."""
        shown = json.loads(self.run("stack", "output", "--json").stdout)
        return {name for name, value in shown.items() if value == "[secret]"}

    def state(self) -> dict[str, Any]:
        """`pulumi stack export --show-secrets`: the engine's own state."""
        return dict(json.loads(self.run("stack", "export", "--show-secrets").stdout))

    def plugin_log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.log_dir.glob("*.log")))

    def step_seconds(self, op: str, name: str) -> float:
        """The wall time of the last `op` ("create", "update", ...) of resource `name`, as the
        plugin that performed it logged it."""
        found = [
            float(words[-1])
            for words in (line.split() for line in self.plugin_log().splitlines())
            if STEP_TIMING in words and words[words.index(STEP_TIMING) + 1 :][:2] == [op, name]
        ]
        assert found, f"no {op} of {name} in the plugins' log"
        return found[-1]

    def facts_seconds(self, run: Run) -> float:
        """The wall time within `run` during which at least one facts invoke (`local.run` over
        SSH) was under way: the union of their intervals, from the provider's log."""
        intervals = sorted(
            (start, end)
            for start, end in invoke_intervals(self.plugin_log())
            if run.started <= start <= run.started + run.seconds
        )
        covered, reach = 0.0, 0.0
        for start, end in intervals:
            start = max(start, reach)
            if end > start:
                covered += end - start
            reach = max(reach, end)
        return covered


def invoke_intervals(log_text: str) -> list[tuple[float, float]]:
    """Each invoke's (start, end) from the provider's timing lines (tests/lab/plugins)."""
    found = []
    for line in log_text.splitlines():
        words = line.split()
        if INVOKE_TIMING in words:
            at = words.index(INVOKE_TIMING)
            found.append((float(words[at + 2]), float(words[at + 3])))
    return found


def plan_of(preview: Mapping[str, Any], custom_only: bool = False) -> dict[str, str]:
    """{name: op} from `preview --json`'s steps, where op is what the summary counts."""
    return plan_of_steps(
        (str(step["urn"]), str(step["op"]))
        for step in preview.get("steps") or []
        if not custom_only or (step.get("newState") or step.get("oldState") or {}).get("custom")
    )


def plan_of_events(stream: str) -> dict[str, str]:
    """{name: op} from the engine's event stream (`up --json`, `destroy --json`): the op of each
    resource's step events."""
    steps = []
    for line in stream.splitlines():
        event = json.loads(line)
        for kind in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            metadata = (event.get(kind) or {}).get("metadata")
            if metadata:
                steps.append((str(metadata["urn"]), str(metadata["op"])))
    return plan_of_steps(steps)


def plan_of_steps(steps: Iterable[tuple[str, str]]) -> dict[str, str]:
    ops: dict[str, list[str]] = {}
    for urn, op in steps:
        ops.setdefault(urn.rsplit("::", 1)[-1], []).append(op)
    return {name: main_op(found) for name, found in ops.items()}
