"""A lab stack deployed and changed by the real Pulumi CLI and engine (tests/lab/realcli.py), the
way the README's lab flow runs it: `stack init`, `config set --secret apiKey`, `up`, a tunnel
through the bastion, then day-two changes as `pulumi preview` shows them and `pulumi up` does
them, and `pulumi destroy` at the end."""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import Lab
from lab.stack import PROJECT
from tests.lab.deploying import API_KEY, EndpointPoller, forward_through_bastion
from tests.lab.realcli import RealPulumi, Run, plan_of_events
from tests.lab.timings import record_day_two

REPO = Path(__file__).resolve().parents[2]
OPERATIONS_DOC = REPO / "docs" / "operations.md"
COUNTED = ("create", "update", "replace", "delete")


class Plan(dict[str, str]):
    """{resource name: op} of one run, as the engine did it."""

    def changed(self) -> dict[str, str]:
        return changes(self)

    def summary(self) -> str:
        return summary(self)


@dataclass
class CliStack:
    lab: Lab
    cli: RealPulumi
    name: str
    config: dict[str, Any]  # namespaced plain settings and the apiKey
    outputs: dict[str, Any]
    endpoint: str  # through an ssh tunnel via the bastion
    api_key: str = API_KEY

    def resource_outputs(self, name: str) -> dict[str, Any]:
        """The outputs the engine's state holds for resource `name`."""
        return outputs_by_name(self.cli)[name]

    def destroy(self) -> Plan:
        """`pulumi destroy`: every resource in the state deleted; what each delete did."""
        return Plan(
            plan_of_events(self.cli.run("destroy", "--yes", "--skip-preview", "--json").stdout)
        )


def outputs_by_name(cli: RealPulumi) -> dict[str, dict[str, Any]]:
    """Each resource's outputs in the engine's state (`stack export`), by name (names are
    unique in this program)."""
    resources = cli.state()["deployment"]["resources"]
    return {str(r["urn"]).rsplit("::", 1)[-1]: dict(r.get("outputs") or {}) for r in resources}


def plain_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key != f"{PROJECT}:apiKey"}


def init_stack(cli: RealPulumi, name: str, config: Mapping[str, Any]) -> None:
    """The README's lab flow up to `up`: the stack file, `stack init`, the secret key."""
    cli.write_stack_file(name, plain_settings(config))
    cli.run("stack", "init", name)
    cli.run("config", "set", "--secret", "apiKey", str(config.get(f"{PROJECT}:apiKey", API_KEY)))


@contextlib.contextmanager
def cli_deployed(
    lab: Lab, config: dict[str, Any], root: Path, name: str = "lab"
) -> Iterator[CliStack]:
    """A first `pulumi up` of `config` with the real CLI, the tunnel to its endpoint, and a
    `pulumi destroy` at the end (whatever the tests did meanwhile)."""
    cli = RealPulumi.for_project(root)
    init_stack(cli, name, config)
    try:
        cli.run("up", "--yes", "--skip-preview")
        tunnel, endpoint = forward_through_bastion(lab, cli.outputs()["endpointUrl"])
    except BaseException:
        cli.run("destroy", "--yes", "--skip-preview", check=False)
        raise
    stack = CliStack(lab, cli, name, config, cli.outputs(), endpoint)
    try:
        yield stack
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)
        stack.cli.run("destroy", "--yes", "--skip-preview", check=False)


def steps_of(run: Run) -> Plan:
    """{resource name: op} from `pulumi up --json`'s events."""
    return Plan(plan_of_events(run.stdout))


def changes(plan: Mapping[str, str]) -> dict[str, str]:
    return {name: op for name, op in plan.items() if op not in ("same", "read", "refresh")}


def counts(plan: Mapping[str, str]) -> dict[str, int]:
    """How many resources each op touches, as the summary of `pulumi up` counts them."""
    tally = Counter(op for op in changes(plan).values() if op in COUNTED)
    return {op: tally[op] for op in COUNTED if tally[op]}


def summary(plan: Mapping[str, str]) -> str:
    return ", ".join(f"{n} {op}" for op, n in counts(plan).items()) or "no change"


def documented_counts(change: str) -> dict[str, int]:
    """What docs/operations.md's Day two table says `pulumi preview` shows for the row whose
    first cell starts with `change`: {"update": 1, "replace": 3}, {} for "no change"."""
    for line in OPERATIONS_DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith(change):
            found = re.findall(rf"(\d+) ({'|'.join(COUNTED)})\b", cells[1])
            return {op: int(n) for n, op in found}
    raise AssertionError(f"no row starting {change!r} in {OPERATIONS_DOC}")


def cli_next_up(
    stack: CliStack, scenario: str, config: dict[str, Any], *, refresh: bool = False
) -> Plan:
    """One `pulumi up` (`--refresh`) of `config` on the deployed stack while a client polls the
    endpoint: {resource name: op} as the engine did it. A changed apiKey is set with --secret
    first, as a user rotates it; a failed run raises PulumiFailed with what the user saw."""
    cli = stack.cli
    cli.replace_config(stack.name, plain_settings(config))
    new_key = str(config.get(f"{PROJECT}:apiKey", stack.api_key))
    if new_key != stack.api_key:
        cli.run("config", "set", "--secret", "apiKey", new_key)
    started = time.monotonic()
    with EndpointPoller(stack.endpoint, stack.api_key, new_key) as poller:
        args = ["up", "--yes", "--skip-preview", "--json", *(["--refresh"] if refresh else [])]
        try:
            run = cli.run(*args)
        finally:
            stack.config = config
        time.sleep(1)  # the run returns once the new server answered; let the poller see it
    plan = steps_of(run)
    record_day_two(scenario, summary(plan), time.monotonic() - started, poller.downtime())
    stack.api_key = new_key
    stack.outputs = cli.outputs()
    return plan
