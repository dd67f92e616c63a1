"""The copy engine: on the head, send one worker the serving image or the model's weights over
the fabric, only what it lacks, watched while the bytes move. image-sync.sh and weights-sync.sh
run it (same flags, same outputs as before it existed); standard library only: it runs with the
head's own python3.

    copy_engine.py image --host H --worker W --target ssh://user@ip:port --image-id ID --ref REF
        --pinned NAME --worker-bin DIR --timeout-minutes M [--compress zstd|none]
        [--progress-seconds S] [--stall-seconds S] [--fabric-key K --fabric-known-hosts F]
        [--relay CHAIN] [--remove yes [--owner ID]]
    copy_engine.py weights --host H --worker W --target ssh://user@ip:port --worker-bin DIR
        --cache-dir C --model M --manifest "commit files bytes" --timeout-minutes M
        [--progress-seconds S] [--stall-seconds S] [--fabric-key ...] [--relay CHAIN]

Organised as pyinfra organises an operation: the facts are read first (`probe`: every worker of
a relay chain at once, each over its own multiplexed connection, every question bounded in
time), the decisions are pure functions of them (copy_plan.py, table-tested), and `transfer`
moves the bytes: it counts them itself, prints progress every `--progress-seconds`, and stops a
stream that moved nothing for `--stall-seconds` (timeouts.copyStallSeconds), the processes of
both ends, naming the worker and the bytes sent. One relay (`relay`) serves both payloads: with
`--relay` (the first worker's step: every worker, a `name|destination|bin` line each), the
workers that lack the payload get one stream passed from worker to worker (relay.sh), so the
head's link carries one copy, not one per worker; each worker's own step then finds it there,
or copies what the chain did not bring.

The last line of stdout is `spark-vllm-image-sent {json}` or `spark-vllm-weights-sent {json}`;
a failure is one `spark-vllm: HOST: STEP: WHAT` line and its likely cause, exit status 1.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

import copy_plan
import image_layers
from hostlib import (
    StepFailed,
    note,
    require,
    run_step,
    ssh_option_value,
    words,
)

HERE = Path(__file__).resolve().parent
# Every question to a worker is bounded: a wedged daemon answers nothing, and the copy that
# follows then fails on its watchdog, naming the worker, instead of hanging on the question.
PROBE_SECONDS = 60
CHUNK = 1024 * 1024
MB = 1000000
# A stopped transfer's processes get this long to end on SIGTERM before SIGKILL.
KILL_GRACE_SECONDS = 5


# -- the fabric ---------------------------------------------------------------------------------


class Fabric:
    """The head reaching the workers over the fabric (lib.sh fabric_ssh has the same options and
    says why: a dead peer noticed within ~30 s, AES-GCM first). Short questions share one
    connection per worker (an OpenSSH ControlMaster, ended by `close`); a call that forwards
    the relay agent opens its own."""

    def __init__(self, key: str = "", known_hosts: str = "") -> None:
        self.key, self.known_hosts = key, known_hosts
        self.mux = tempfile.mkdtemp(prefix="spark-vllm-mux.")

    def options(self, forward: bool = False) -> list[str]:
        options = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=10",
                   "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR",
                   "-o", "Ciphers=^aes128-gcm@openssh.com"]  # fmt: skip
        if self.key:
            options += ["-i", self.key, "-o", "IdentitiesOnly=yes",
                        "-o", f"UserKnownHostsFile={ssh_option_value(self.known_hosts)}",
                        "-o", "StrictHostKeyChecking=yes"]  # fmt: skip
        if forward:
            options.append("-A")
        else:
            options += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.mux}/%C",
                        "-o", "ControlPersist=10"]  # fmt: skip
        return options

    def command(self, destination: str, remote: str, forward: bool = False) -> list[str]:
        return ["ssh", *self.options(forward), destination, remote]

    def run(
        self, destination: str, remote: str, stdin: str = "", seconds: int = PROBE_SECONDS
    ) -> tuple[int, str, str]:
        """`remote` run on `destination`: its exit status, stdout and stderr; 124 when it did
        not answer within `seconds`."""
        try:
            done = subprocess.run(
                self.command(destination, remote),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=seconds,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 124, "", ""
        return done.returncode, done.stdout, done.stderr

    def ask(
        self, destination: str, remote: str, stdin: str = "", seconds: int = PROBE_SECONDS
    ) -> tuple[int, str]:
        """`remote`'s exit status and all it said (stdout, then stderr)."""
        status, out, err = self.run(destination, remote, stdin, seconds)
        return status, out + err

    def output(self, destination: str, remote: str, stdin: str = "") -> str | None:
        """`remote`'s stdout on `destination`, None when it failed or did not answer."""
        status, out, _ = self.run(destination, remote, stdin)
        return out if status == 0 else None

    def check(self, destination: str) -> None:
        """Fail clearly when the head cannot open a session to a worker."""
        status, said = self.ask(destination, "true")
        if status != 0:
            said = " ".join(said.split())
            raise StepFailed(
                f"the head cannot SSH to {destination} over the fabric: {said or 'no answer'} "
                f"(ssh exit {status})",
                "the worker's sshd is down or not listening on its fabric IP, the fabric link is "
                "down, or the fabric trust (key/known host) is missing",
            )

    def close(self) -> None:
        for socket in Path(self.mux).glob("*"):
            subprocess.run(
                ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "spark-vllm-mux"],
                capture_output=True,
                timeout=15,
                check=False,
            )
        shutil.rmtree(self.mux, ignore_errors=True)


# -- relay chains -------------------------------------------------------------------------------


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


def probe_all(chain: Sequence[Member], fact: Callable[[Member], str]) -> list[str]:
    """`fact(member)` for every member at once (their handshakes and questions in parallel),
    in the chain's order; a probe that raised counts as `unreachable`."""

    def safe(member: Member) -> str:
        try:
            return fact(member)
        except Exception:
            return "unreachable"

    with ThreadPoolExecutor(max_workers=max(1, len(chain))) as pool:
        return list(pool.map(safe, chain))


# -- moving bytes -------------------------------------------------------------------------------


@dataclass
class Watch:
    """How a copy watches its streams: who and what (for progress lines), a progress line every
    `progress_seconds`, a stream stopped after `stall_seconds` (0: never) without a byte moving,
    and the copy's deadline (time.monotonic)."""

    label: str
    what: str
    progress_seconds: float
    stall_seconds: float
    deadline: float


@dataclass
class Outcome:
    """How a stream ended: its exit status (124: the deadline passed), the bytes it moved,
    whether the watchdog stopped it, and what the receiving end printed."""

    status: int
    sent: int
    stalled: bool
    output: str


@dataclass
class Meter:
    sent: int = 0
    moved_at: float = field(default_factory=time.monotonic)

    def add(self, count: int) -> None:
        self.sent += count
        self.moved_at = time.monotonic()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pump(source: IO[bytes], sink: IO[bytes], meter: Meter) -> None:
    """Every byte of `source` into `sink`, counted once written; ends at EOF or a broken pipe."""
    try:
        while chunk := os.read(source.fileno(), CHUNK):
            _write_all(sink.fileno(), chunk)
            meter.add(len(chunk))
    except OSError:
        pass
    finally:
        for end in (sink, source):
            with suppress(OSError):
                end.close()


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """Each process's whole group (each runs in a session of its own): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in processes:
            if process.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
        ends = time.monotonic() + KILL_GRACE_SECONDS
        while time.monotonic() < ends and any(p.poll() is None for p in processes):
            time.sleep(0.1)


def _status(process: subprocess.Popen[bytes]) -> int:
    code = process.wait()
    return 128 - code if code < 0 else code


def transfer(
    source: str, sink: str, watch: Watch, total: int, env: dict[str, str] | None = None
) -> Outcome:
    """`source`'s stdout (a bash pipeline) into `sink`'s stdin (another), counted here. Every
    `progress_seconds` a line `LABEL: WHAT SENT of TOTAL MB, RATE MB/s, ETA S s`; a stream still
    in flight that moved nothing for `stall_seconds` is stopped, both ends' process groups, as is
    one still running at the deadline. Once every byte is out, a quiet while is the receiving
    end storing what it got (a `docker load` takes minutes), not a stall."""
    meter = Meter()
    with tempfile.TemporaryFile() as output:
        producer = subprocess.Popen(
            ["bash", "-c", "set -o pipefail; " + source],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        consumer = subprocess.Popen(
            ["bash", "-c", "set -o pipefail; " + sink],
            stdin=subprocess.PIPE,
            stdout=output,
            start_new_session=True,
            env=env,
        )
        assert producer.stdout is not None and consumer.stdin is not None
        pump = threading.Thread(target=_pump, args=(producer.stdout, consumer.stdin, meter))
        pump.start()
        started = reported = time.monotonic()
        stalled = timed_out = False
        while pump.is_alive() or producer.poll() is None or consumer.poll() is None:
            pump.join(timeout=0.2)
            now = time.monotonic()
            if (
                watch.stall_seconds
                and pump.is_alive()
                and now - meter.moved_at >= watch.stall_seconds
            ):
                stalled = True
            timed_out = now >= watch.deadline
            if stalled or timed_out:
                _stop([producer, consumer])
                break
            if now - reported >= watch.progress_seconds:
                reported = now
                rate = meter.sent // max(1, int(now - started))
                eta = (total - meter.sent) // rate if rate else 0
                note(
                    f"{watch.label}: {watch.what} {meter.sent // MB} of {total // MB} MB, "
                    f"{rate // MB} MB/s, ETA {max(0, eta)} s"
                )
        pump.join()
        produced, consumed = _status(producer), _status(consumer)
        output.seek(0)
        said = output.read().decode(errors="replace")
    status = 124 if timed_out and not stalled else (consumed or produced)
    return Outcome(status=status, sent=meter.sent, stalled=stalled, output=said)


def ssh_sink(fabric: Fabric, destination: str, remote: str, forward: bool = False) -> str:
    """The bash words that run `remote` on `destination` with its stdin from the stream."""
    return shlex.join(fabric.command(destination, remote, forward))


class Copy:
    """What both copies share: the flags every copy step has, the fabric, one deadline for the
    whole copy (relay included), the bytes sent and the workers a relay served."""

    step = ""
    what = ""
    needs: tuple[str, ...] = ()

    def __init__(self, flags: dict[str, str]) -> None:
        require(flags, "host", "worker", "target", "worker-bin", "timeout-minutes", *self.needs)
        self.flags = flags
        self.worker, self.target = flags["worker"], flags["target"]
        self.minutes = int(flags["timeout_minutes"])
        self.deadline = time.monotonic() + 60 * self.minutes
        self.fabric = Fabric(flags.get("fabric_key", ""), flags.get("fabric_known_hosts", ""))
        self.sent = 0
        self.relayed = 0

    def watch(self, label: str) -> Watch:
        return Watch(
            label=label,
            what=self.what,
            progress_seconds=float(self.flags.get("progress_seconds", "10")),
            stall_seconds=float(self.flags.get("stall_seconds", "0")),
            deadline=self.deadline,
        )

    def run(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.fabric.close()


# -- the image ----------------------------------------------------------------------------------


@dataclass
class ImageFacts:
    """What the image copy knows of a worker (image-probe.sh)."""

    reachable: bool = False
    identity: str = ""  # the content identity of what it holds under the pinned name
    staged: dict[str, int] = field(default_factory=dict)  # a cut copy's members: name -> size
    zstd: bool = False
    images: list[list[str]] = field(default_factory=list)  # every image's layers there


def parse_image_probe(text: str) -> ImageFacts:
    """image-probe.sh's answer: sections, each after a `== NAME` line."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    if "end" not in sections:
        return ImageFacts()
    facts = ImageFacts(reachable=True)
    pinned = "\n".join(sections.get("pinned", [])).strip()
    try:
        inspected = json.loads(pinned) if pinned else []
        facts.identity = image_layers.identity(inspected[0]) if inspected else ""
    except (ValueError, KeyError, TypeError, IndexError):
        facts.identity = ""
    for line in sections.get("staged", []):
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            facts.staged[parts[0]] = int(parts[1])
    facts.zstd = sections.get("zstd", ["no"])[:1] == ["yes"]
    for line in sections.get("layers", []):
        if line.strip().startswith("["):
            try:
                facts.images.append(list(json.loads(line)))
            except ValueError:
                continue
    return facts


def image_chain_fact(facts: ImageFacts, identity: str, layers: list[str]) -> str:
    """A member's fact as copy_plan.image_chain reads it."""
    if not facts.reachable:
        return "unreachable"
    if facts.identity and facts.identity == identity:
        return "has"
    if any(size > 0 for size in facts.staged.values()):
        return "staged"  # a copy cut earlier: its own step resumes it
    held = image_layers.held_count(layers, facts.images)
    return f"{held} {'zstd' if facts.zstd else 'plain'}"


class ImageCopy(Copy):
    """The image to one worker (image-sync.sh's flags)."""

    step, what, needs = "image-sync", "image", ("image-id", "ref", "pinned")

    def __init__(self, flags: dict[str, str]) -> None:
        super().__init__(flags)
        self.image_id, self.ref, self.pinned = flags["image_id"], flags["ref"], flags["pinned"]
        self.stage_name = self.image_id.removeprefix("sha256:")
        compress = flags.get("compress", "none")
        self.zstd_wanted = compress == "zstd" and shutil.which("zstd") is not None
        self.identity = ""
        self.layers: list[str] = []
        self.source_ref = self.image_id
        self.index: dict[str, object] | None = None
        self.index_path = HERE.parent / "image-index" / f"{self.stage_name}.json"
        self.work = tempfile.mkdtemp(prefix="spark-vllm-copy.")

    # facts
    def probe(self, destination: str, bin_dir: str) -> ImageFacts:
        call = words("bash", f"{bin_dir}/image-probe.sh", self.pinned, self.stage_name,
                     str(PROBE_SECONDS))  # fmt: skip
        answer = self.fabric.output(destination, call)
        return parse_image_probe(answer or "")

    def has_it(self, destination: str, bin_dir: str) -> bool:
        return self.probe(destination, bin_dir).identity == self.identity

    def read_head(self) -> None:
        inspected = docker_json(["docker", "image", "inspect", self.image_id])
        if not inspected:
            raise StepFailed(
                f"image {self.image_id} is not on the head",
                "it was removed after the pull; run 'pulumi up --refresh'",
            )
        self.identity = image_layers.identity(inspected[0])
        self.layers = list(inspected[0].get("RootFS", {}).get("Layers", []))
        # Save by reference when it names this exact image (keeps the tag), else by ID.
        by_ref = docker_json(["docker", "image", "inspect", self.ref])
        if by_ref and by_ref[0].get("Id") == self.image_id:
            self.source_ref = self.ref

    def use_index(self, wanted: bool) -> None:
        """The saved stream's index (which member holds which layer, every member's size), made
        once per image on this head and kept beside the scripts; None when not `wanted` (the
        worker has nothing of the image: the whole stream goes) or when indexing failed."""
        self.index = None
        if not wanted:
            return
        path = self.index_path
        directory = path.parent
        if not path.is_file() or path.stat().st_size == 0:
            directory.mkdir(parents=True, exist_ok=True)
            for old in directory.glob("*.json"):
                if old != path:
                    old.unlink(missing_ok=True)
            # Copies to several workers run at once: each writes its own part, renamed into place.
            part = path.with_suffix(f".{os.getpid()}")
            made = subprocess.run(
                f"docker save {shlex.quote(self.source_ref)} | python3 "
                f"{shlex.quote(str(HERE / 'image_layers.py'))} index > {shlex.quote(str(part))}",
                shell=True,
                check=False,
            )
            if made.returncode != 0:
                part.unlink(missing_ok=True)
                note(f"{self.worker}: reading the saved image's layers failed: sending it whole")
                return
            part.replace(path)
        self.index = json.loads(path.read_text())

    def stream_size(self, held: int, staged: set[str]) -> int:
        if self.index is None:
            inspected = docker_json(["docker", "image", "inspect", self.image_id])
            return int(inspected[0].get("Size", 0)) if inspected else 0
        return image_layers.bytes_to_send(
            self.index, image_layers.emptied(self.index, held, staged)
        )

    def source(self, held: int, staged: set[str]) -> str:
        """The saved stream, its first `held` layers and the `staged` members as empty files."""
        save = words("docker", "save", self.source_ref)
        if self.index is None or (held == 0 and not staged):
            return save
        names = Path(self.work, "staged")
        names.write_text("".join(f"{name}\n" for name in sorted(staged)))
        filter_call = words("python3", str(HERE / "image_layers.py"), "filter",
                            str(self.index_path), str(held), str(names))  # fmt: skip
        return f"{save} | {filter_call}"

    def load_command(self, bin_word: str, zstd: bool) -> str:
        """What a worker runs to take the stream (its image-load.sh: stages, loads, names it);
        `bin_word` its scripts, already a shell word."""
        return (
            f"bash {bin_word}/image-load.sh {shlex.quote(self.stage_name)} "
            f"{shlex.quote(self.pinned)} {'zstd' if zstd else 'plain'}"
        )

    def stop_remote_load(self, destination: str, bin_dir: str) -> None:
        """What a worker ran for an earlier or stalled stream (a wedged `docker load` would hold
        the stage until killed by hand): stopped, bounded, best effort."""
        self.fabric.ask(
            destination,
            words("bash", f"{bin_dir}/image-load.sh", "stop", self.stage_name),
            seconds=30,
        )

    def remove(self) -> None:
        """Destroy with image.keepOnDestroy false: untag and remove it on the worker (gone is
        fine), and what a cut copy left staged, in the worker's state leaf while it is ours."""
        self.fabric.ask(
            self.target,
            words("docker", "image", "rm", self.pinned, self.ref, self.image_id)
            + " >/dev/null 2>&1 || true",
        )
        owner = self.flags.get("owner", "")
        if owner:
            leaf = str(Path(self.flags["worker_bin"]).parent)
            self.fabric.ask(
                self.target,
                f'if [ "$(cat {words(leaf + "/.spark-vllm-owner")} 2>/dev/null)" = {words(owner)} ]'
                "; "
                f"then rm -rf {words(leaf + '/image-stage')}; fi",
            )

    # the relay chain
    def relay(self, chain: list[Member]) -> None:
        facts = probe_all(
            chain,
            lambda m: image_chain_fact(
                self.probe(m.destination, m.bin), self.identity, self.layers
            ),
        )
        plan = copy_plan.image_chain(facts)
        for position, why in plan.skipped.items():
            if why == "unreachable":
                note(
                    f"{chain[position - 1].name} cannot be reached over the fabric: its own step "
                    "copies the image"
                )
        members = [chain[position - 1] for position in plan.members]
        if len(members) < 2:
            return
        zstd = self.zstd_wanted and plan.zstd
        self.use_index(plan.least > 0)
        least = plan.least if self.index is not None else 0
        size = self.stream_size(least, set())
        names = ",".join(m.name for m in members)
        note(
            f"relaying {self.ref} to {names} in one chain (they all hold {least} of "
            f"{len(self.layers)} layers; {size // 1000000} MB)"
        )
        started = time.monotonic()
        # Each member stages what arrives beside its own scripts (relay.sh exports SPARK_BIN).
        sink = self.load_command('"$SPARK_BIN"', zstd)
        outcome = run_chain(self.fabric, members, sink, self.source(least, set()), zstd,
                            self.watch(names), size)  # fmt: skip
        self.sent += outcome.sent
        for member in members:
            if self.has_it(member.destination, member.bin):
                self.relayed += 1
            else:
                note(
                    f"{member.name} did not get the image from the chain (relay status "
                    f"{relayed_status(outcome.output, member.name)}, stream exit "
                    f"{outcome.status}): its own step copies it"
                )
        note(
            f"relayed {self.ref} to {self.relayed} of {len(members)} workers in "
            f"{int(time.monotonic() - started)}s"
        )

    # the worker's own copy
    def complete_staged(self, stage: str, name: str, have: int, want: int) -> bool:
        """Append to the worker's staged member `name` the tail it lacks; whether it is whole."""
        tail = words("python3", str(HERE / "image_stage.py"), "tail", name, str(have))
        source = f"docker save {shlex.quote(self.source_ref)} | {tail}"
        sink = ssh_sink(self.fabric, self.target, f"cat >> {shlex.quote(f'{stage}/{name}')}")
        # docker save ends on a broken pipe once the member is out: the size below is the check.
        outcome = transfer(source, sink, self.watch(self.worker), want - have)
        self.sent += outcome.sent
        size = self.fabric.output(self.target, words("stat", "-c", "%s", f"{stage}/{name}"))
        if (size or "").strip() != str(want):
            note(f"{self.worker}: completing its staged {name} failed: sending it again")
            return False
        return True

    def run(self) -> None:
        if self.flags.get("remove") == "yes":
            self.remove()
            return
        self.fabric.check(self.target)
        self.read_head()
        relay = self.flags.get("relay", "")
        if relay and self.fabric.key:
            self.relay(parse_chain(relay))
        bin_dir = self.flags["worker_bin"]
        facts = self.probe(self.target, bin_dir)
        if facts.identity == self.identity:
            print(
                f"{self.worker} has {self.ref} ({self.image_id}) as {self.pinned}; "
                "nothing more to copy"
            )
            self.report(0, 0, 0)
            return
        self.read_head()  # still there after the chain
        zstd = self.zstd_wanted and facts.zstd
        started = time.monotonic()
        # What an earlier run left loading on the worker would race this copy's writes to the
        # stage: stopped first (only a stream of ours), and the facts read again after it.
        self.stop_remote_load(self.target, bin_dir)
        facts = self.probe(self.target, bin_dir)
        held = image_layers.held_count(self.layers, facts.images)
        self.use_index(held > 0 or bool(facts.staged))
        planned = copy_plan.image_copy(len(self.layers), held, self.index, facts.staged)
        note(f"{self.worker}: {planned.why}")
        stage = f"{Path(bin_dir).parent}/image-stage/{self.stage_name}"
        staged = set(planned.staged_whole)
        for name, (have, want) in planned.staged_parts.items():
            if self.complete_staged(stage, name, have, want):
                staged.add(name)
        held = planned.kept_layers if self.index is not None else 0
        size = self.stream_size(held, staged)
        note(f"{self.worker}: sending {size // 1000000} MB of the image")
        sink = ssh_sink(self.fabric, self.target, self.load_command(shlex.quote(bin_dir), zstd))
        compress = "zstd -1 -T0 -q | " if zstd else ""
        outcome = transfer(
            self.source(held, staged), compress + sink, self.watch(self.worker), size
        )
        self.sent += outcome.sent
        if (
            self.index is not None
            and outcome.status not in (0, 124)
            and not outcome.stalled
            and self.fabric.ask(self.target, "true")[0] == 0
        ):
            # Not when the link failed, nor a stall: the whole image would fail the same way.
            note(
                f"{self.worker}: loading the image without the layers it holds failed "
                f"(exit {outcome.status}): sending it whole"
            )
            held, staged = 0, set()
            self.index = None
            size = self.stream_size(0, staged)
            outcome = transfer(
                self.source(0, staged), compress + sink, self.watch(self.worker), size
            )
            self.sent += outcome.sent
        if outcome.output.strip():
            note(outcome.output.strip())  # what the worker's load said
        elapsed = int(time.monotonic() - started)
        if outcome.stalled:
            self.stop_remote_load(self.target, bin_dir)
            raise StepFailed(
                f"copying {self.ref} to {self.worker} stalled: nothing moved for "
                f"{self.flags.get('stall_seconds')}s (timeouts.copyStallSeconds) after "
                f"{self.sent // 1000000} MB; the transfer was stopped and nothing was tagged there",
                f"{self.worker} stopped taking the stream: its Docker daemon or disk is wedged "
                "(docker info there), or the fabric link stalled; the next run resumes from what "
                "it staged",
            )
        if outcome.status != 0:
            cause = (
                f"the transfer is slower than timeouts.imageTransferMinutes={self.minutes} allows"
                if outcome.status == 124
                else f"the fabric link to {self.target} dropped, the worker's disk is full, or its "
                "Docker daemon failed"
            )
            raise StepFailed(
                f"copying {self.ref} to {self.worker} failed after {elapsed}s "
                f"(exit {outcome.status}); nothing was tagged there",
                cause,
            )
        if not self.has_it(self.target, bin_dir):
            raise StepFailed(
                f"after the copy {self.worker} does not have image {self.image_id} as "
                f"{self.pinned}",
                "the worker's Docker daemon rejected the image (architecture? disk?)",
            )
        print(f"copied {self.ref} ({self.image_id}) to {self.worker} in {elapsed}s")
        self.report(held, len(self.layers), len(staged))

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.work, ignore_errors=True)

    def report(self, kept: int, layers: int, staged: int) -> None:
        sent = {"bytes": self.sent, "layersKept": kept, "layers": layers, "staged": staged,
                "relayed": self.relayed}  # fmt: skip
        print(f"spark-vllm-image-sent {json.dumps(sent)}", flush=True)


def run_chain(
    fabric: Fabric,
    members: list[Member],
    sink: str,
    source: str,
    zstd: bool,
    watch: Watch,
    size: int,
) -> Outcome:
    """One stream through `members` (relay.sh on each stores it with `sink` and passes it on),
    under the chain's own agent. A stall is said, not failed: each member's own step copies
    what the chain did not bring, on its own watchdog."""
    call = relay_call(sink, members, Path(fabric.known_hosts).read_text().rstrip("\n"),
                      Path(fabric.key + ".pub").read_text().rstrip("\n"))  # fmt: skip
    try:
        with relay_agent(fabric, members) as env:
            compress = "zstd -1 -T0 -q | " if zstd else ""
            target = ssh_sink(fabric, members[0].destination, call, forward=True)
            outcome = transfer(source, compress + target, watch, size, env=env)
    except ChainUnavailable as why:
        note(str(why))
        return Outcome(status=97, sent=0, stalled=False, output="")
    if outcome.stalled:
        note(f"the relay chain stalled after {outcome.sent} bytes: stopped")
    return outcome


def docker_json(argv: list[str]) -> list[dict[str, Any]]:
    """The head's Docker's JSON answer, [] when it has none (or gave none in time)."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_SECONDS, check=False
        )
        value = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else []
    except (subprocess.TimeoutExpired, ValueError):
        return []
    return value if isinstance(value, list) else []


# -- the weights --------------------------------------------------------------------------------


class WeightsCopy(Copy):
    """One worker's copy of the head's snapshot (weights-sync.sh's flags). HF cache blobs are
    content-addressed: a blob the worker holds whole is kept, one held in part is resumed and its
    sha256 checked, only this revision's blobs are considered; tar keeps the snapshot's links."""

    step, what, needs = "weights-sync", "weights", ("cache-dir", "model", "manifest")

    def __init__(self, flags: dict[str, str]) -> None:
        super().__init__(flags)
        self.model, self.manifest = flags["model"], flags["manifest"]
        parts = self.manifest.split()
        self.commit, self.files, self.bytes = ([*parts, "", "0", "0"])[:3]
        self.repo = "models--" + self.model.replace("/", "--")
        self.hub = f"{flags['cache_dir']}/hub"
        self.snapshot = Path(self.hub, self.repo, "snapshots", self.commit)
        self.head: dict[str, int] = {}

    def read_head(self) -> None:
        """The revision's blobs (what its snapshot links to), with the head's sizes."""
        if self.snapshot.is_dir():
            for link in self.snapshot.rglob("*"):
                if link.is_symlink():
                    blob = link.resolve()
                    self.head[blob.name] = blob.stat().st_size

    def worker_manifest(self, destination: str, bin_dir: str) -> str:
        call = words("bash", f"{bin_dir}/hf-manifest.sh", "--host", self.worker,
                     "--cache-dir", self.flags["cache_dir"], "--model", self.model,
                     "--revision", self.commit)  # fmt: skip
        return self.fabric.ask(destination, call)[1].strip()

    def blob_sizes(self, destination: str, bin_dir: str) -> dict[str, int] | None:
        """What `destination` holds of each of the revision's blobs (0: absent); None when it
        could not say."""
        call = words("bash", f"{bin_dir}/hf-blob-sizes.sh", "--host", self.worker, "--cache-dir",
                     self.flags["cache_dir"], "--model", self.model)  # fmt: skip
        status, said = self.fabric.ask(
            destination, call, stdin="".join(f"{n}\n" for n in self.head)
        )
        if status != 0:
            raise StepFailed(
                f"cannot read which blobs {self.worker} has: {' '.join(said.split())}",
                "the worker's scripts are missing (run pulumi up again)",
            )
        sizes: dict[str, int] = {}
        for line in said.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                sizes[parts[0]] = int(parts[1])
        return sizes

    def untar(self) -> str:
        """What a worker runs to store a tar stream of the cache's files."""
        return f"{words('mkdir', '-p', self.hub)} && {words('tar', '-C', self.hub, '-xf', '-')}"

    def member_fact(self, member: Member) -> dict[str, int] | str:
        if self.fabric.ask(member.destination, "true")[0] != 0:
            return "unreachable"
        if self.worker_manifest(member.destination, member.bin) == self.manifest:
            return "has"
        try:
            return self.blob_sizes(member.destination, member.bin) or {}
        except StepFailed:
            return "unreachable"

    def relay(self, chain: list[Member]) -> None:
        with ThreadPoolExecutor(max_workers=max(1, len(chain))) as pool:
            facts = list(pool.map(self.member_fact, chain))
        members, holdings = [], []
        for member, fact in zip(chain, facts, strict=True):
            if fact == "unreachable":
                note(
                    f"{member.name} cannot be reached over the fabric: its own step copies "
                    "the weights"
                )
            elif isinstance(fact, dict):
                members.append(member)
                holdings.append(fact)
        if len(members) < 2:
            return
        blobs = copy_plan.chain_blobs(self.head, holdings)
        if not blobs:
            return
        size = sum(self.head[name] for name in blobs)
        names = ",".join(m.name for m in members)
        note(
            f"relaying {len(blobs)} blob(s) of {self.model}@{self.commit} ({size} bytes) to "
            f"{names} in one chain"
        )
        started = time.monotonic()
        source = words(
            "tar", "-C", self.hub, "-cf", "-", *(f"{self.repo}/blobs/{n}" for n in blobs)
        )
        sink = self.untar()
        outcome = run_chain(self.fabric, members, sink, source, False, self.watch(names), size)
        self.sent += outcome.sent
        for member in members:
            if relayed_status(outcome.output, member.name) == "0":
                self.relayed += 1
            else:
                note(
                    f"{member.name} did not take the chain's blobs (relay status "
                    f"{relayed_status(outcome.output, member.name)}, stream exit "
                    f"{outcome.status}): its own step sends what it lacks"
                )
        note(
            f"relayed {len(blobs)} blob(s) to {self.relayed} of {len(members)} workers in "
            f"{int(time.monotonic() - started)}s"
        )

    def failed(self, outcome: Outcome, to_send: int, started: float) -> NoReturn:
        if outcome.stalled:
            raise StepFailed(
                f"copying {self.model} to {self.worker} stalled: nothing moved for "
                f"{self.flags.get('stall_seconds')}s (timeouts.copyStallSeconds; {self.sent} of "
                f"{to_send} bytes sent); the transfer was stopped, the next run resumes",
                f"{self.worker} stopped taking the stream: its disk is wedged or full, or the "
                "fabric link stalled",
            )
        cause = (
            f"the copy is slower than timeouts.weightsTransferMinutes={self.minutes} allows"
            if outcome.status == 124
            else f"the fabric link to {self.target} dropped or the worker's disk is full"
        )
        raise StepFailed(
            f"copying {self.model} to {self.worker} failed after "
            f"{int(time.monotonic() - started)}s "
            f"(exit {outcome.status}; {self.sent} of {to_send} bytes sent, the next run resumes)",
            cause,
        )

    def run(self) -> None:
        self.fabric.check(self.target)
        self.read_head()
        relay = self.flags.get("relay", "")
        if relay and self.fabric.key and self.snapshot.is_dir():
            self.relay(parse_chain(relay))
        bin_dir = self.flags["worker_bin"]
        if self.worker_manifest(self.target, bin_dir) == self.manifest:
            print(
                f"{self.worker} has {self.model}@{self.commit} ({self.files} files, "
                f"{self.bytes} bytes); nothing more to copy"
            )
            self.report(int(self.files or 0), 0, 0)
            return
        if not self.snapshot.is_dir():
            raise StepFailed(
                f"the head has no snapshot {self.commit} of {self.model}",
                "the fetch step did not complete",
            )
        worker = self.blob_sizes(self.target, bin_dir) or {}
        plan = copy_plan.plan_blobs(self.head, worker)
        note(
            f"{self.worker}: {self.model}@{self.commit}: {len(plan.kept)} blob(s) kept, "
            f"{len(plan.resumed)} resumed, {len(plan.whole)} to send; {plan.to_send} of "
            f"{self.bytes} bytes to go"
        )
        started = time.monotonic()
        blobs = f"{self.hub}/{self.repo}/blobs"
        for name, have in plan.resumed.items():
            source = words("tail", "-c", f"+{have + 1}", f"{blobs}/{name}")
            blob = f"{blobs}/{name}"
            sink = ssh_sink(
                self.fabric, self.target, f"cat >> {words(blob)} && {words('sha256sum', blob)}"
            )
            outcome = transfer(source, sink, self.watch(self.worker), self.head[name] - have)
            self.sent += outcome.sent
            if outcome.status != 0 or outcome.stalled:
                self.failed(outcome, plan.to_send, started)
            found = outcome.output.split()[0] if outcome.output.split() else ""
            if found != name:
                raise StepFailed(
                    f"the resumed blob {name} on {self.worker} does not match its sha256 ({found})",
                    "the part the worker held was not the blob's beginning; the next run sends it "
                    "whole after you delete it there",
                )
        # Whole blobs first, the snapshot's links last: a cut leaves no link to a missing blob.
        members = [f"{self.repo}/blobs/{name}" for name in plan.whole]
        source = words("tar", "-C", self.hub, "-cf", "-", *members, f"{self.repo}/refs",
                       f"{self.repo}/snapshots/{self.commit}")  # fmt: skip
        sink = ssh_sink(self.fabric, self.target, self.untar())
        outcome = transfer(source, sink, self.watch(self.worker), plan.to_send)
        self.sent += outcome.sent
        if outcome.status != 0 or outcome.stalled:
            self.failed(outcome, plan.to_send, started)
        after = self.worker_manifest(self.target, bin_dir)
        if after != self.manifest:
            raise StepFailed(
                f"after the copy {self.worker} reports '{after}', the head has '{self.manifest}'",
                "the copy was incomplete (disk full?) or the cache is being changed concurrently",
            )
        print(
            f"copied {self.model}@{self.commit} to {self.worker} ({self.files} files, {self.bytes} "
            f"bytes; {self.sent} bytes sent) in {int(time.monotonic() - started)}s"
        )
        self.report(len(plan.kept), len(plan.resumed), len(plan.whole))

    def report(self, kept: int, resumed: int, whole: int) -> None:
        sent = {"bytes": self.sent, "total": int(self.bytes or 0), "kept": kept, "resumed": resumed,
                "sent": whole, "relayed": self.relayed}  # fmt: skip
        print(f"spark-vllm-weights-sent {json.dumps(sent, separators=(',', ':'))}", flush=True)


COPIES: dict[str, type[Copy]] = {
    "image": ImageCopy,
    "weights": WeightsCopy,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COPIES:
        print(__doc__, file=sys.stderr)
        return 2
    kind = COPIES[argv[0]]

    def copy(flags: dict[str, str]) -> None:
        made = kind(flags)
        try:
            made.run()
        finally:
            made.close()

    return run_step(kind.step, argv[1:], copy)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
