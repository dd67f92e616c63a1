"""The relay of a copy (copy_engine.py): one stream passed from worker to worker (relay.sh on
each stores it and passes it on), so the head's link carries one copy for the whole chain, not
one per worker. `relay` is the one skeleton both payloads run (copy_image.py, copy_weights.py):
every member's fact read at once, the payload choosing the members and the stream, the stream
sent under an agent of its own, and each member found served or left to its own step.
Standard library only.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from copy_compress import ZSTD_STAGE
from copy_pump import Outcome, Watch, transfer
from copy_transport import Fabric, ssh_sink
from hostlib import note

F = TypeVar("F")


@dataclass(frozen=True)
class Member:
    """A worker of a relay chain: its name, where the fabric reaches it, its scripts."""

    name: str
    destination: str
    bin: str


def parse_chain(text: str) -> list[Member]:
    members = []
    for line in text.splitlines():
        if line.strip():
            name, destination, bin_dir = line.split("|", 2)
            members.append(Member(name, destination, bin_dir))
    return members


def chain_text(chain: Sequence[Member]) -> str:
    return "\n".join(f"{m.name}|{m.destination}|{m.bin}" for m in chain)


def relay_call(sink: str, chain: Sequence[Member], known_hosts: str, agent_key: str) -> str:
    """The command line that runs relay.sh on the chain's first member: it stores its stdin with
    `sink` and passes it on to the rest (each member builds the call for the next: lib.sh
    relay_call, which this matches word for word)."""
    first, rest = chain[0], chain[1:]
    return shlex.join(["bash", f"{first.bin}/relay.sh", "--host", first.name, "--sink", sink,
                       "--chain", chain_text(rest), "--known-hosts", known_hosts,
                       "--agent-key", agent_key])  # fmt: skip


def relay_limits(chain: Sequence[Member]) -> list[str]:
    """Where the forwarded key may sign in (ssh-add -h): the head to the first member, then each
    member to the next (lib.sh relay_agent_limits says why)."""
    limits, previous = [], ""
    for member in chain:
        hop = member.destination.removeprefix("ssh://").rsplit(":", 1)[0]  # user@ip
        limits += ["-h", f"{previous}>{hop}" if previous else hop]
        previous = hop.split("@", 1)[-1]
    return limits


def relayed_status(output: str, name: str) -> str:
    """The exit status relay.sh reported for `name` ("none": the hop to it failed first)."""
    status = "none"
    for line in output.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "spark-vllm-relayed" and words[1] == name:
            status = words[2]
    return status


class ChainUnavailable(Exception):
    """The relay agent could not be made: no unlimited key is ever forwarded."""


@contextmanager
def relay_agent(fabric: Fabric, chain: Sequence[Member]) -> Iterator[dict[str, str]]:
    """The environment of an ssh-agent of this copy's own holding the fabric key for the chain's
    hops alone, each bound to the host key the head pinned for it (lib.sh with_relay_agent);
    the agent ends with the copy."""
    work = tempfile.mkdtemp(prefix="spark-vllm-agent.")
    socket = f"{work}/agent"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", socket], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            if Path(socket).exists() or agent.poll() is not None:
                break
            time.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": socket}
        # ssh-add -H looks the hops up by host name alone: the pins without their [ip]:port form.
        pins = Path(fabric.known_hosts).read_text()
        keys = Path(work, "known_hosts")
        keys.write_text(re.sub(r"(?m)^\[([^]]*)\]:[0-9]+ ", r"\1 ", pins))
        added = subprocess.run(
            ["ssh-add", "-q", "-H", str(keys), *relay_limits(chain), fabric.key],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if added.returncode != 0:
            raise ChainUnavailable(
                "ssh-add cannot limit the forwarded key to the relay hops (OpenSSH 8.9 or later "
                f"needed): {' '.join((added.stdout + added.stderr).split())}"
            )
        yield env
    finally:
        agent.terminate()
        agent.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


def probe_all(chain: Sequence[Member], fact: Callable[[Member], F]) -> list[F | str]:
    """`fact(member)` for every member at once (their handshakes and questions in parallel),
    in the chain's order; a probe that raised counts as `unreachable`."""

    def safe(member: Member) -> F | str:
        try:
            return fact(member)
        except Exception:
            return "unreachable"

    with ThreadPoolExecutor(max_workers=max(1, len(chain))) as pool:
        return list(pool.map(safe, chain))


def member_names(members: Sequence[Member]) -> str:
    return ",".join(m.name for m in members)


@dataclass(frozen=True)
class Stream:
    """What a payload sends down a chain: to which members, the head's `source` pipeline, the
    `sink` each member stores it with, whether it goes compressed, its size, the line that
    announces it and what the closing line says was relayed."""

    members: list[Member]
    source: str
    sink: str
    zstd: bool
    size: int
    announcement: str
    subject: str


def run_chain(fabric: Fabric, stream: Stream, watch: Watch) -> Outcome:
    """The stream through its members (relay.sh on each stores it with the stream's sink and
    passes it on), under the chain's own agent. A stall is said, not failed: each member's own
    step copies what the chain did not bring, on its own watchdog."""
    members = stream.members
    call = relay_call(stream.sink, members, Path(fabric.known_hosts).read_text().rstrip("\n"),
                      Path(fabric.key + ".pub").read_text().rstrip("\n"))  # fmt: skip
    try:
        with relay_agent(fabric, members) as env:
            compress = ZSTD_STAGE if stream.zstd else ""
            target = ssh_sink(fabric, members[0].destination, call, forward=True)
            outcome = transfer(stream.source, compress + target, watch, stream.size, env=env)
    except ChainUnavailable as why:
        note(str(why))
        return Outcome(status=97, sent=0, stalled=False, output="")
    if outcome.stalled:
        note(f"the relay chain stalled after {outcome.sent} bytes: stopped")
    return outcome


class Payload(Protocol[F]):
    """What the relay needs of a copy: its fabric and watch, `what` it copies, each member's
    fact, the stream those facts call for (None: no chain is worth it), whether a member got
    it, and what the note about a member the chain missed says (`missed`, then `left`)."""

    fabric: Fabric
    what: str
    missed: str
    left: str

    def watch(self, label: str) -> Watch: ...

    def chain_fact(self, member: Member) -> F: ...

    def chain_stream(self, chain: list[Member], facts: list[F | str]) -> Stream | None: ...

    def arrived(self, member: Member, outcome: Outcome) -> bool: ...


def relay(payload: Payload[F], chain: list[Member]) -> tuple[int, int]:
    """One stream to the members of `chain` that lack the payload: the bytes it sent and how
    many members it served. A member the fabric does not reach, or one the stream did not
    serve, is said and left to its own step, which copies what the chain did not bring."""
    facts = probe_all(chain, payload.chain_fact)
    for member, fact in zip(chain, facts, strict=True):
        if fact == "unreachable":
            note(
                f"{member.name} cannot be reached over the fabric: its own step copies the "
                f"{payload.what}"
            )
    stream = payload.chain_stream(chain, facts)
    if stream is None:
        return 0, 0
    note(stream.announcement)
    started = time.monotonic()
    outcome = run_chain(payload.fabric, stream, payload.watch(member_names(stream.members)))
    served = 0
    for member in stream.members:
        if payload.arrived(member, outcome):
            served += 1
        else:
            note(
                f"{member.name} {payload.missed} (relay status "
                f"{relayed_status(outcome.output, member.name)}, stream exit "
                f"{outcome.status}): {payload.left}"
            )
    note(
        f"relayed {stream.subject} to {served} of {len(stream.members)} workers in "
        f"{int(time.monotonic() - started)}s"
    )
    return outcome.sent, served
