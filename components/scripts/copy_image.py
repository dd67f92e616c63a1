"""The image copy (image-sync.sh, through copy_engine.py): on the head, send one worker the
serving image, only what it lacks. The worker's facts come from its image-probe.sh, the
decisions from copy_plan.py; a worker that holds some of the image's layers, or a part of a cut
copy, gets the saved stream without them (image_layers.py, image_stage.py). Standard library
only.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import copy_compress
import copy_plan
import image_layers
from copy_compress import ZSTD_STAGE
from copy_pump import Outcome, transfer
from copy_relay import Member, Stream, member_names, parse_chain, relay
from copy_step import Copy
from copy_transport import PROBE_SECONDS, ssh_sink
from hostlib import StepFailed, note, words

HERE = Path(__file__).resolve().parent


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

    def sample(self, source: str) -> bytes:
        """Not the saved stream's first bytes (a whole `docker save` first, on the classic
        store): the head's own libraries and programs stand for the image's layers."""
        return copy_compress.system_sample()

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
    missed, left = "did not get the image from the chain", "its own step copies it"

    def chain_fact(self, member: Member) -> str:
        return image_chain_fact(self.probe(member.destination, member.bin), self.identity,
                                self.layers)  # fmt: skip

    def chain_stream(self, chain: list[Member], facts: list[str]) -> Stream | None:
        plan = copy_plan.image_chain(facts)
        members = [chain[position - 1] for position in plan.members]
        if len(members) < 2:
            return None
        self.use_index(plan.least > 0)
        least = plan.least if self.index is not None else 0
        size = self.stream_size(least, set())
        source = self.source(least, set())
        zstd = self.compression(source, members[0].destination, size, plan.zstd).zstd
        return Stream(
            members=members,
            source=source,
            # Each member stages what arrives beside its own scripts (relay.sh exports SPARK_BIN).
            sink=self.load_command('"$SPARK_BIN"', zstd),
            zstd=zstd,
            size=size,
            announcement=(
                f"relaying {self.ref} to {member_names(members)} in one chain (they all hold "
                f"{least} of {len(self.layers)} layers; {size // 1000000} MB)"
            ),
            subject=self.ref,
        )

    def arrived(self, member: Member, outcome: Outcome) -> bool:
        return self.has_it(member.destination, member.bin)

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
        chain = self.flags.get("relay", "")
        if chain and self.fabric.key:
            sent, self.relayed = relay(self, parse_chain(chain))
            self.sent += sent
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
        source = self.source(held, staged)
        zstd = self.compression(source, self.target, size, facts.zstd).zstd
        sink = ssh_sink(self.fabric, self.target, self.load_command(shlex.quote(bin_dir), zstd))
        compress = ZSTD_STAGE if zstd else ""
        outcome = transfer(source, compress + sink, self.watch(self.worker), size)
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
                "relayed": self.relayed, "seconds": self.seconds(),
                "compress": self.compression_report()}  # fmt: skip
        print(f"spark-vllm-image-sent {json.dumps(sent)}", flush=True)
