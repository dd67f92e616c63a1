"""The weights copy (weights-sync.sh, through copy_engine.py): on the head, send one worker the
model's snapshot from the HF cache, only the blobs it lacks, and verify it there (hf-manifest.sh);
the decisions are copy_plan.py's. With the model's include/exclude patterns, only the snapshot's
files they keep (weights_filter.py) are sent and verified. Standard library only.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NoReturn

import copy_plan
from copy_compress import ZSTD_STAGE
from copy_pump import Outcome, transfer
from copy_relay import Member, Stream, member_names, parse_chain, relay, relayed_status
from copy_step import Copy
from copy_transport import ssh_sink
from hostlib import StepFailed, note, words
from weights_filter import kept, patterns


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
        self.include, self.exclude = flags.get("include", "[]"), flags.get("exclude", "[]")
        self.head: dict[str, int] = {}
        self.files_kept: list[str] = []
        self.chain_blobs: dict[str, list[str]] = {}  # what the chain sent each member

    def read_head(self) -> None:
        """The snapshot's files the patterns keep (paths relative to it), and the blobs they
        link to, with the head's sizes."""
        if not self.snapshot.is_dir():
            return
        include, exclude = patterns(self.include), patterns(self.exclude)
        for entry in sorted(self.snapshot.rglob("*")):
            path = entry.relative_to(self.snapshot).as_posix()
            if entry.is_dir() or not kept(path, include, exclude):
                continue
            self.files_kept.append(path)
            if entry.is_symlink():
                blob = entry.resolve()
                self.head[blob.name] = blob.stat().st_size

    def filter_flags(self) -> list[str]:
        """hf-manifest.sh's flags for the patterns; none without them (as before patterns)."""
        if (self.include, self.exclude) == ("[]", "[]"):
            return []
        return ["--include", self.include, "--exclude", self.exclude]

    def worker_manifest(self, destination: str, bin_dir: str) -> str:
        call = words("bash", f"{bin_dir}/hf-manifest.sh", "--host", self.worker,
                     "--cache-dir", self.flags["cache_dir"], "--model", self.model,
                     "--revision", self.commit, *self.filter_flags())  # fmt: skip
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

    def check_content(self, worker: str, destination: str, bin_dir: str, names: list[str]) -> None:
        """The blobs this copy wrote on `destination`, hashed there against their names (a size
        is all the next run compares): a wrong one is removed there, so the next run sends it
        again, and the step fails naming it."""
        if not names:
            return
        blobs = f"{self.hub}/{self.repo}/blobs"
        call = words("python3", f"{bin_dir}/blob_check.py", blobs, "--remove")
        # Hashing reads every byte once: within what is left of the step's time, at least 60 s.
        seconds = max(60, int(self.deadline - time.monotonic()))
        status, said = self.fabric.ask(destination, call, "".join(f"{n}\n" for n in names),
                                       seconds)  # fmt: skip
        if status != 0:
            raise StepFailed(
                f"cannot check the content of the blobs copied to {worker}: "
                f"{' '.join(said.split()) or f'exit {status}'}",
                "a blob was removed or became unreadable there while the step ran, or the "
                "worker's disk failed",
            )
        bad = said.split()
        if bad:
            raise StepFailed(
                f"{len(bad)} blob(s) of {self.model}@{self.commit} arrived on {worker} with other "
                f"bytes than their hash names ({', '.join(bad[:3])}); removed there, the next "
                "run sends them again",
                f"the worker's disk or memory, or the fabric, corrupted them: check {worker}'s "
                "kernel log (dmesg) for I/O or memory errors",
            )

    def untar(self, zstd: bool = False) -> str:
        """What a worker runs to store a tar stream of the cache's files (`zstd`: compressed)."""
        unpack = "zstd -d -q | " if zstd else ""
        untar = words("tar", "-C", self.hub, "-xf", "-")
        return f"{words('mkdir', '-p', self.hub)} && {unpack}{untar}"

    def can_unpack(self, destinations: list[str]) -> bool:
        """Whether every one of `destinations` has zstd (a compressed stream needs it there)."""
        return all(
            self.fabric.ask(destination, "command -v zstd >/dev/null")[0] == 0
            for destination in destinations
        )

    # the relay chain
    missed, left = "did not take the chain's blobs", "its own step sends what it lacks"

    def chain_fact(self, member: Member) -> dict[str, int] | str:
        if self.fabric.ask(member.destination, "true")[0] != 0:
            return "unreachable"
        if self.worker_manifest(member.destination, member.bin) == self.manifest:
            return "has"
        try:
            return self.blob_sizes(member.destination, member.bin) or {}
        except StepFailed:
            return "unreachable"

    def chain_stream(self, chain: list[Member], facts: list[dict[str, int] | str]) -> Stream | None:
        lacking = [
            (m, fact) for m, fact in zip(chain, facts, strict=True) if isinstance(fact, dict)
        ]
        if len(lacking) < 2:
            return None
        members = [member for member, _ in lacking]
        blobs = copy_plan.chain_blobs(self.head, [holding for _, holding in lacking])
        if not blobs:
            return None
        size = sum(self.head[name] for name in blobs)
        # tar writes every blob of the stream on every member, whatever it held.
        self.chain_blobs = {member.name: list(blobs) for member in members}
        source = words(
            "tar", "-C", self.hub, "-cf", "-", *(f"{self.repo}/blobs/{n}" for n in blobs)
        )
        unpack = self.can_unpack([member.destination for member in members])
        zstd = self.compression(source, members[0].destination, size, unpack).zstd
        return Stream(
            members=members,
            source=source,
            sink=self.untar(zstd),
            zstd=zstd,
            size=size,
            announcement=(
                f"relaying {len(blobs)} blob(s) of {self.model}@{self.commit} ({size} bytes) to "
                f"{member_names(members)} in one chain"
            ),
            subject=f"{len(blobs)} blob(s)",
        )

    def arrived(self, member: Member, outcome: Outcome) -> bool:
        if relayed_status(outcome.output, member.name) != "0":
            return False
        self.check_content(
            member.name, member.destination, member.bin, self.chain_blobs.get(member.name, [])
        )
        return True

    # the worker's own copy
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
        chain = self.flags.get("relay", "")
        if chain and self.fabric.key and self.snapshot.is_dir():
            sent, self.relayed = relay(self, parse_chain(chain))
            self.sent += sent
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
        # Only the links the patterns keep: one to a blob left out would dangle on the worker.
        members = [f"{self.repo}/blobs/{name}" for name in plan.whole]
        snapshot = f"{self.repo}/snapshots/{self.commit}"
        links = [f"{snapshot}/{path}" for path in self.files_kept]
        source = words("tar", "-C", self.hub, "-cf", "-", *members, f"{self.repo}/refs", *links)
        zstd = self.compression(
            source, self.target, plan.to_send, self.can_unpack([self.target])
        ).zstd
        sink = ssh_sink(self.fabric, self.target, self.untar(zstd))
        compress = ZSTD_STAGE if zstd else ""
        outcome = transfer(source, compress + sink, self.watch(self.worker), plan.to_send)
        self.sent += outcome.sent
        if outcome.status != 0 or outcome.stalled:
            self.failed(outcome, plan.to_send, started)
        after = self.worker_manifest(self.target, bin_dir)
        self.check_content(self.worker, self.target, bin_dir, list(plan.whole))
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
                "sent": whole, "relayed": self.relayed, "seconds": self.seconds(),
                "compress": self.compression_report()}  # fmt: skip
        print(f"spark-vllm-weights-sent {json.dumps(sent, separators=(',', ':'))}", flush=True)
