"""What each host still has of the deployment: facts read on every run, receipts left by steps.

A command has no read: `pulumi refresh` never sees a host change behind the program's back (a
pruned image, a deleted snapshot, a removed state directory), and the next `up` would not
repair it. So, as pyinfra does, the program reads the facts it needs before it plans:

- A step that leaves something on a host records a receipt when it succeeds (receipt.sh): a
  token, and the checks that must keep holding for its work to count as done.
- On every run (preview included) the program reads each host's receipts over the host's own
  SSH (facts.sh, through pulumi-command's `local.run` invoke). A receipt whose checks hold gives
  back its token; one that is missing or failing gives none.
- The token is a word of the step's command line. A step whose receipt holds runs with the same
  token as before: no diff, nothing runs. A step whose receipt is gone gets a new token: its
  `create` differs, which pulumi-command plans as an update (only `triggers` replace,
  provider/pkg/provider/common/inputs.go) and performs by running `create` again when no
  `update` is set (provider/pkg/provider/remote/commandController.go). Exactly that step re-runs,
  and it writes the new token, so the run after plans nothing again.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pulumi
from pulumi_command import local

from components.bundle import facts_script
from components.connection import docker_ssh_opts
from stacks.credentials import SshAuth
from stacks.plan.cluster import NodePlan
from stacks.plan.containers import Ulimit, daemon_default_ulimits
from stacks.plan.nccl import HostNccl, parse_host_nccl

FACTS_HEADER = "spark-vllm-facts 1"
MISSING = "-"
SLOT_LINE = "slot"  # "slot K KEY": a server's slot, as the head recorded it
GUARD_LINE = "guard"  # "guard LINE": the memory guard's stop of a container stopped still
DOCKERD_ARG_LINE = "dockerd-arg"  # "dockerd-arg --default-ulimit=V": the running daemon's flag
DAEMON_JSON_LINE = "daemon-json"  # "daemon-json JSON": its config file, on one line
UNSAFE_LINE = "unsafe"  # "unsafe WHY": another user could change the state or the cache
NCCL_LINE = "nccl"  # "nccl PATH RESOLVED": the host's own libnccl.so.2 (vllm.hostNccl)
# "key-label NAME VALUE": a container's API_KEY_HASH_LABEL (stacks/plan/containers.py
# secret_label keeps an earlier release's value while the key is the same)
KEY_LABEL_LINE = "key-label"
KEY_LABEL_ERROR_LINE = "key-label-error"  # "key-label-error WHY": Docker did not list them


@dataclass
class HostFacts:
    """One host's receipts as read at the start of this run."""

    host: str
    holding: dict[str, str]  # step -> the token it ran with; its checks still hold
    failing: dict[str, str]  # step -> why its checks no longer hold
    slots: dict[str, int] = field(default_factory=dict)  # server's key -> its recorded slot
    # The memory guard's lines about containers it stopped that are stopped still.
    guard_stops: list[str] = field(default_factory=list)
    # What dockerd adds to every container that does not set them (default-ulimits).
    daemon_ulimits: tuple[Ulimit, ...] = ()
    # Why another local user could change what is in the state directory or the cache
    # (dir_safety.py); facts.sh reads no receipt then.
    unsafe: list[str] = field(default_factory=list)
    # The host's own NCCL, as its loader cache lists it; None: it has none.
    nccl: HostNccl | None = None
    # Each container's key label on the host (container name -> the label's value).
    key_labels: dict[str, str] = field(default_factory=dict)
    key_labels_unread: str = ""  # why they could not be listed ("": they were)
    _fresh: dict[str, str] = field(default_factory=dict)

    def token(self, step: str) -> str:
        """The token `step` runs with: its receipt's, or a new one (the same for this run)."""
        if step in self.holding:
            return self.holding[step]
        if step not in self._fresh:
            self._fresh[step] = secrets.token_hex(6)
            if step in self.failing:
                pulumi.log.info(f"{self.host}: re-running {step}: {self.failing[step]}")
        return self._fresh[step]


def parse_facts(host: str, stdout: str) -> HostFacts:
    """facts.sh's answer: the header, then `STEP TOKEN` or `STEP - WHY` per receipt, then
    `slot K KEY` per server's recorded slot, then `guard LINE` per server the memory guard
    stopped that is stopped still, then `key-label NAME VALUE` per container with a key label,
    then the running dockerd's `--default-ulimit` flags and its daemon.json, then
    `nccl PATH RESOLVED` when the host has its own NCCL; or, instead of all
    these, `unsafe WHY` for each reason the state directory or the cache could be changed by
    another user."""
    lines = stdout.splitlines()
    if FACTS_HEADER not in lines:
        raise ValueError(f"no facts in the answer: {stdout.strip()[-300:] or 'nothing'}")
    holding: dict[str, str] = {}
    failing: dict[str, str] = {}
    slots: dict[str, int] = {}
    guard_stops: list[str] = []
    dockerd_args: list[str] = []
    daemon_json = ""
    unsafe: list[str] = []
    nccl: HostNccl | None = None
    key_labels: dict[str, str] = {}
    key_labels_unread = ""
    for line in lines[lines.index(FACTS_HEADER) + 1 :]:
        step, _, rest = line.partition(" ")
        if step == NCCL_LINE:
            nccl = parse_host_nccl(rest)
            continue
        if step == UNSAFE_LINE:
            unsafe.append(rest)
            continue
        if step == KEY_LABEL_ERROR_LINE:
            key_labels_unread = rest
            continue
        if step == KEY_LABEL_LINE:
            name, _, value = rest.partition(" ")
            if name and value:
                key_labels[name] = value
            continue
        if step == GUARD_LINE:
            guard_stops.append(rest)
            continue
        if step == DOCKERD_ARG_LINE:
            dockerd_args.append(rest)
            continue
        if step == DAEMON_JSON_LINE:
            daemon_json = rest
            continue
        if step == SLOT_LINE:
            slot, _, key = rest.partition(" ")
            if slot.isdigit() and key:
                slots[key] = int(slot)
            continue
        token, _, why = rest.partition(" ")
        if token == MISSING:
            failing[step] = why
        elif step and token:
            holding[step] = token
    return HostFacts(
        host,
        holding,
        failing,
        slots,
        guard_stops,
        daemon_ulimits=daemon_default_ulimits(daemon_json, dockerd_args),
        unsafe=unsafe,
        nccl=nccl,
        key_labels=key_labels,
        key_labels_unread=key_labels_unread,
    )


def facts_command(
    node: NodePlan,
    auth: SshAuth,
    known_hosts: Path,
    control_dir: Path,
    cache_dir: str,
    guard: str = "",
) -> str:
    """The local command that reads `node`'s facts: OpenSSH with the Docker provider's options.
    `cache_dir`: model.cacheDir; `guard`: the memory guard's container name (none when off)."""
    words = ["ssh", *docker_ssh_opts(node, auth, known_hosts, control_dir)]
    words += ["-T", "-p", str(node.ssh.port), "--", node.ssh.destination]
    words.append(shlex.join(["bash", "-s", "--", node.state_dir, cache_dir, guard]))
    return shlex.join(words)


def gather_facts(
    node: NodePlan,
    auth: SshAuth,
    known_hosts: Path,
    control_dir: Path,
    cache_dir: str,
    guard: str = "",
) -> HostFacts:
    """Read `node`'s receipts now (a blocking invoke: the plan depends on them)."""
    try:
        result = local.run(
            command=facts_command(node, auth, known_hosts, control_dir, cache_dir, guard),
            stdin=facts_script(),
            logging=local.Logging.NONE,
            add_previous_output_in_env=False,
        )
        return parse_facts(node.name, result.stdout)
    except Exception as error:  # the invoke's error carries ssh's own message
        raise pulumi.RunError(
            f"spark-vllm: {node.name}: facts: cannot read the host's state over SSH "
            f"({_route(node)}): {_ssh_output(str(error))}\n"
            "  likely cause: the host is down or unreachable, its SSH host key changed, or "
            "the SSH key is not authorized there"
        ) from None


def refuse_unsafe(facts: Iterable[HostFacts]) -> None:
    """Stop before anything is planned when another local user could change what spark-vllm
    keeps on a host: every host's every reason, with its fix, in one message."""
    found = [
        f"spark-vllm: {host.host}: facts: another local user could change what spark-vllm "
        "keeps on this host, so nothing is written there:\n"
        + "\n".join(f"  {why}" for why in host.unsafe)
        for host in facts
        if host.unsafe
    ]
    if found:
        raise pulumi.RunError(
            "\n".join(found) + "\n  likely cause: hosts[].stateDir or model.cacheDir is in, or "
            "below, a directory that someone other than root and the SSH user owns or may write"
        )


def _route(node: NodePlan) -> str:
    hop = f" via {node.jump.destination}:{node.jump.port}" if node.jump is not None else ""
    return f"{node.ssh.destination}:{node.ssh.port}{hop}"


def _ssh_output(error: str) -> str:
    """What ssh said, without the long command line local.run's error repeats first
    (`exit status N: running "...":\n<output>`, commandOutputs.go)."""
    status = re.search(r"exit status \d+", error)
    output = error.split('":\n', 1)[1] if '":\n' in error else error
    said = " ".join(output.split())[-400:]
    return f"{status.group(0)}: {said}" if status else said
