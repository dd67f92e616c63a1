"""The distribution benchmark: the image and the weights from the head to 1..3 workers over the
lab's fabric, measured side by side in one run, for each case:

- the physical floor: bytes / link rate (rate-limited regime), and one raw `cat | ssh cat` stream
  of the same bytes;
- the seeds' method: one worker after another, a full `docker save | ssh | docker load` and a
  full `tar | ssh | tar` of the model's directory;
- spark-vllm: its own copy scripts (components/scripts/image-sync.sh, weights-sync.sh), run on
  the head for every worker at once, as the program's graph runs them.

    sudo uv run python -m lab bench [--short] [--out DIR]

Regimes: the fabric rate-limited on every host (tc tbf, so that the link and not the CPU is the
bottleneck) and unlimited (the CPU is: ssh's cipher, as on real Sparks where one stream is far
below 200 Gbit/s). Workloads it generates: a multi-layer image, a multi-blob HF snapshot, an
image update that changes one layer, a revision that changes one file, a copy cut midway.
The last worker runs Docker 26 with the containerd image store (Docker 29's default; the others
Debian 12's 20.10): it is in every chain, and the image's own cases (nothing changed, one
layer, a cut) run against it too, rate-limited.
Times are medians of the repetitions; the goals (issue 11) print as PASS or MISS. Writes
bench.md, bench.json and bench.png into DIR.

    sudo uv run python -m lab bench --real-image

brings up a 2-host lab with the real vLLM image (vLLM's CPU build, about 4 GB) on the head and
copies it to the worker twice, side by side: the copy engine and `docker save | ssh | docker load`
(about five minutes here; CI runs the same comparison on the short run's small image).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import statistics
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from lab.core import Lab
from lab.net import tbf_shaping
from lab.spec import IMAGE_NAME as LAB_IMAGE
from lab.spec import LabSpec
from stacks.plan.image import pinned_image

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "components" / "scripts"
HEAD = "spark1"
STATE = "/root/.spark-vllm"
BIN = f"{STATE}/bin"
KEY = f"{STATE}/fabric_ed25519"
KNOWN = f"{STATE}/fabric_known_hosts"
CACHE = "/root/.cache/huggingface"
MODEL = "bench/snapshot"
REPO_DIR = f"{CACHE}/hub/models--bench--snapshot"
IMAGE = "spark-vllm-bench:v1"
IMAGE_UPDATE = "spark-vllm-bench:v2"
CONTAINERD = "spark-vllm (containerd store)"  # the method of the containerd worker's rows
BENCH_ENGINES = ("20.10", "20.10", "20.10", "26-containerd")  # the head, then the workers
MB = 1_000_000
# OpenSSH's default preference is chacha20 first; AES-GCM is faster where the CPU has AES
# instructions (x86 AES-NI, the Grace CPU's ARMv8 crypto extensions).
CIPHERS = ("aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com", "aes256-ctr")
SENT = r'spark-vllm-(?:image|weights)-sent \{"bytes": ?(\d+)'  # the copy scripts' last lines


@dataclass(frozen=True)
class Sizes:
    image_layers: tuple[int, ...]
    blobs: tuple[int, ...]
    rate_mbit: int  # the rate-limited regime
    repetitions: int
    workers: tuple[int, ...]


# The rate-limited regime's rate is one at which the link, not the CPU, is the limit even for a
# chain through three workers: this 2-core machine runs all four simulated hosts, and a chain
# asks it for every worker's ssh, unpacking and `docker load` at once (at 200 Mbit/s a chain of
# three ran CPU-bound here; a real host has its own CPU for its part).
FULL = Sizes((64 * MB,) * 4, (128 * MB,) * 4, 100, 2, (1, 2, 3))
# CI's: every case and goal of the full run at half the bytes of its first sizes (48 MB of
# payload; each byte goal has slack for a few KB of headers); what it shows is that each
# case runs and moves the bytes it should, not how fast.
SHORT = Sizes((4 * MB,) * 4, (8 * MB,) * 4, 50, 1, (1, 3))


@dataclass
class Row:
    case: str
    regime: str
    workers: int
    method: str
    seconds: float
    bytes: int


class Bench:
    def __init__(self, lab: Lab, sizes: Sizes) -> None:
        self.lab, self.sizes = lab, sizes
        self.workers = [n for n in lab.spec.host_names if n != HEAD]
        stores = dict(zip(lab.spec.host_names, lab.spec.engines, strict=False))
        self.containerd_worker = next(
            (w for w in self.workers if stores.get(w) == "26-containerd"), None
        )
        self.rows: list[Row] = []

    # -- set-up --------------------------------------------------------------------------------

    def prepare(self) -> None:
        """The scripts on every host, the head's fabric key trusted by every worker."""
        for host in self.lab.spec.host_names:
            target = self.lab.node(host).hostdir / BIN.removeprefix("/")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(SCRIPTS, target)
        self.head(f"rm -f {KEY} {KEY}.pub && ssh-keygen -q -t ed25519 -N '' -f {KEY}")
        public = (self.lab.node(HEAD).hostdir / KEY.removeprefix("/")).with_suffix(".pub")
        known = []
        for index, worker in enumerate(self.workers, start=1):
            auth = self.lab.node(worker).hostdir / "root/.ssh/authorized_keys"
            auth.write_text(auth.read_text() + public.read_text())
            ip = self.lab.spec.host_fabric_ip(index)
            known.append(self.head(f"ssh-keyscan -t ed25519 {ip} 2>/dev/null").strip())
        (self.lab.node(HEAD).hostdir / KNOWN.removeprefix("/")).write_text("\n".join(known) + "\n")

    def head(self, script: str, timeout: float = 3600) -> str:
        return self.lab.sh(HEAD, script, timeout=timeout).stdout

    def target(self, worker: str) -> str:
        return f"ssh://root@{self.lab.spec.host_fabric_ip(self.workers.index(worker) + 1)}:22"

    def ssh(self, worker: str) -> str:
        """The head's ssh to a worker over the fabric, as a shell prefix."""
        ip = self.lab.spec.host_fabric_ip(self.workers.index(worker) + 1)
        return (
            f"ssh -i {KEY} -o IdentitiesOnly=yes -o UserKnownHostsFile={KNOWN} "
            f"-o StrictHostKeyChecking=yes -o BatchMode=yes root@{ip}"
        )

    changed_file_bytes = 0
    revision_b: dict[str, bytes] = {}  # noqa: RUF012 (set per run in make_workloads)
    payload = 0
    missing_after_cut = 0
    image_missing_after_cut = 0
    containerd_missing_after_cut = 0

    def make_workloads(self) -> None:
        """The images (v2 changes the top layer) and the snapshot's two revisions (the second
        changes one file), made on the head from random bytes (nothing compresses them)."""
        layers = [half_compressible(size) for size in self.sizes.image_layers]
        bench_dir = self.lab.node(HEAD).hostdir / "root/bench"
        bench_dir.mkdir(parents=True, exist_ok=True)
        (bench_dir / "v1.tar").write_bytes(image_tar(IMAGE, layers))
        update = [*layers[:-1], half_compressible(self.sizes.image_layers[-1])]
        (bench_dir / "v2.tar").write_bytes(image_tar(IMAGE_UPDATE, update))
        self.head(
            "docker load -i /root/bench/v1.tar >/dev/null && "
            "docker load -i /root/bench/v2.tar >/dev/null && rm -f /root/bench/v[12].tar"
        )
        repo = self.lab.node(HEAD).hostdir / REPO_DIR.removeprefix("/")
        shutil.rmtree(repo, ignore_errors=True)
        files = {
            f"model-{i:05d}.safetensors": os.urandom(s) for i, s in enumerate(self.sizes.blobs)
        }
        files["config.json"] = b'{"max_position_embeddings": 2048}'
        write_snapshot(repo, "a" * 40, files)
        # The next revision is written only for its own case: the seeds' method tars the whole
        # model directory, which must hold the first revision alone until then.
        self.revision_b = {**files, "model-00001.safetensors": os.urandom(self.sizes.blobs[1])}
        self.changed_file_bytes = self.sizes.blobs[1]
        self.payload = self.payload_bytes(IMAGE)
        self.head(f"head -c {self.payload} /dev/urandom > /root/bench/raw.bin")

    def reset_workers(self) -> None:
        for worker in self.workers:
            self.lab.sh(
                worker,
                f"docker image rm -f {IMAGE} {IMAGE_UPDATE} >/dev/null 2>&1; "
                f"docker image prune -af >/dev/null; rm -rf {REPO_DIR} {STATE}/image-stage",
            )

    def shape(self, rate_mbit: int | None) -> None:
        for index, host in enumerate(self.lab.spec.host_names):
            ifname = self.lab.spec.fabric_ifname(index)
            self.lab.exec(host, ["tc", "qdisc", "del", "dev", ifname, "root"], check=False)
            if rate_mbit:
                self.lab.exec(host, tbf_shaping(ifname, f"{rate_mbit}mbit"))

    # -- the methods -----------------------------------------------------------------------------

    def manifest(self, revision: str) -> str:
        return self.head(
            f"bash {BIN}/hf-manifest.sh --host {HEAD} --cache-dir {CACHE} --model {MODEL} "
            f"--revision {revision}"
        ).strip()

    def relay_chain(self, workers: list[str]) -> str:
        """The program's --relay for the first worker's steps: every worker, in order."""
        return "\n".join(f"{w}|{self.target(w)}|{BIN}" for w in workers)

    def image_script(self, worker: str, image: str, relay: str = "", compress: str = "zstd") -> str:
        """What the program runs on the head to copy the image to one worker (with the
        program's --compress unless told another: stacks/plan/image.py sync_image)."""
        image_id = self.head(f"docker image inspect --format '{{{{.Id}}}}' {image}").strip()
        return (
            f"bash {BIN}/image-sync.sh --host {HEAD} --worker {worker} --target "
            f"{self.target(worker)} --worker-bin {BIN} --image-id {image_id} --ref {image} "
            f"--pinned {pinned_image(image_id)} --timeout-minutes 60 "
            f"--compress {compress} --progress-seconds 600 {self.fabric}"
            + (f" --relay {shlex.quote(relay)}" if relay else "")
        )

    def weights_script(self, worker: str, revision: str, relay: str = "") -> str:
        """What the program runs on the head to copy the weights to one worker."""
        return (
            f"bash {BIN}/weights-sync.sh --host {HEAD} --worker {worker} --target "
            f"{self.target(worker)} --worker-bin {BIN} --cache-dir {CACHE} --model {MODEL} "
            f"--manifest {shlex.quote(self.manifest(revision))} --timeout-minutes 60 "
            f"--progress-seconds 600 {self.fabric}"
            + (f" --relay {shlex.quote(relay)}" if relay else "")
        )

    fabric = f"--fabric-key {KEY} --fabric-known-hosts {KNOWN}"

    def spark(self, workers: list[str], image: str, revision: str) -> tuple[float, int]:
        """As the program's graph runs the copies: with several workers, the first worker's
        step relays to them all, then every other worker's step (finding it there) at once; the
        image first, then the weights. The bytes are what the scripts say they sent."""
        leader, others = workers[0], workers[1:]
        relay = self.relay_chain(workers) if others else ""
        stages = [
            ("image", [(leader, self.image_script(leader, image, relay))]),
            ("image", [(w, self.image_script(w, image)) for w in others]),
            ("weights", [(leader, self.weights_script(leader, revision, relay))]),
            ("weights", [(w, self.weights_script(w, revision)) for w in others]),
        ]
        self.head("rm -f /root/bench/*.log")
        started = time.monotonic()
        for kind, stage in stages:
            if not stage:
                continue
            self.head(
                " ".join(f"( {script} ) >>/root/bench/{w}.log 2>&1 &" for w, script in stage)
                + " wait; "
                + " ".join(
                    f"grep -q '^spark-vllm-{kind}-sent' /root/bench/{w}.log || "
                    f"{{ cat /root/bench/{w}.log; exit 1; }};"
                    for w, _ in stage
                )
            )
        seconds = time.monotonic() - started
        sent = 0
        for worker in workers:
            log = (self.lab.node(HEAD).hostdir / f"root/bench/{worker}.log").read_text()
            sent += sum(int(m) for m in re.findall(SENT, log))
        return seconds, sent

    def seeds(self, workers: list[str], image: str) -> tuple[float, int]:
        """One worker after another, everything every time."""
        started = time.monotonic()
        for worker in workers:
            self.head(
                f"docker save {image} | {self.ssh(worker)} docker load >/dev/null && "
                f"tar -C {CACHE} -cf - hub/models--bench--snapshot | {self.ssh(worker)} "
                f"'mkdir -p {CACHE} && tar -C {CACHE} -xf -'"
            )
        seconds = time.monotonic() - started
        return seconds, len(workers) * self.payload_bytes(image)

    def payload_bytes(self, image: str) -> int:
        """What the seeds' method moves to one worker: the saved image and the model's tar."""
        image_bytes = self.head(f"docker save {image} | wc -c")
        model_bytes = self.head(f"tar -C {CACHE} -cf - hub/models--bench--snapshot | wc -c")
        return int(image_bytes) + int(model_bytes)

    def raw(self, worker: str) -> float:
        """One ssh stream of the payload's bytes, to /dev/null: what the link and the cipher
        allow (the file is made once, in make_workloads)."""
        started = time.monotonic()
        self.head(f"cat /root/bench/raw.bin | {self.ssh(worker)} 'cat >/dev/null'")
        return time.monotonic() - started

    # -- the cases -----------------------------------------------------------------------------

    def record(
        self, case: str, regime: str, workers: int, method: str, runs: list[tuple[float, int]]
    ) -> None:
        seconds = statistics.median(r[0] for r in runs)
        self.rows.append(Row(case, regime, workers, method, seconds, runs[0][1]))

    def first_copy(self, regime: str, rate_mbit: int | None) -> None:
        size = self.payload
        one_stream = [self.raw(self.workers[0]) for _ in range(self.sizes.repetitions)]
        for count in self.sizes.workers:
            workers = self.workers[:count]
            if rate_mbit:
                self.rows.append(
                    Row(
                        "image+weights",
                        regime,
                        count,
                        "floor (bytes / rate)",
                        count * size * 8 / (rate_mbit * MB),
                        count * size,
                    )
                )
            # One stream measured; N workers from one head link take N of them in a row.
            raws = [(count * seconds, count * size) for seconds in one_stream]
            seeds, sparks = [], []
            for _ in range(self.sizes.repetitions):
                self.reset_workers()
                seeds.append(self.seeds(workers, IMAGE))
                self.reset_workers()
                sparks.append(self.spark(workers, IMAGE, "main"))
            self.record("image+weights", regime, count, "raw ssh stream", raws)
            self.record("image+weights", regime, count, "seeds' method", seeds)
            self.record("image+weights", regime, count, "spark-vllm", sparks)
        # The workers now hold v1 and revision a: what changes of one layer or one file move.
        self.record(
            "nothing changed",
            regime,
            1,
            "spark-vllm",
            [self.spark(self.workers[:1], IMAGE, "main")],
        )
        self.record(
            "image update (one layer)",
            regime,
            1,
            "spark-vllm",
            [self.spark(self.workers[:1], IMAGE_UPDATE, "main")],
        )
        repo = self.lab.node(HEAD).hostdir / REPO_DIR.removeprefix("/")
        write_snapshot(repo, "b" * 40, self.revision_b, ref=False)
        self.record(
            "revision (one file)",
            regime,
            1,
            "spark-vllm",
            [self.spark(self.workers[:1], IMAGE_UPDATE, "b" * 40)],
        )
        # Gone again from the head: the next regime starts from the first revision alone.
        shutil.rmtree(repo / "snapshots" / ("b" * 40))
        changed = hashlib.sha256(self.revision_b["model-00001.safetensors"]).hexdigest()
        (repo / "blobs" / changed).unlink()

    def transport_choices(self, regime: str) -> None:
        """What the cipher and the compression cost or save, per regime: the payload's bytes
        (random, as weights are) over each cipher, and the saved image (about half
        compressible, as images are) with and without zstd -1. Ciphers only where the CPU is
        the limit: on the rate-limited link every cipher runs at the link's rate (the last run
        that measured them there: 26.1, 26.3 and 26.2 s)."""
        worker = self.workers[0]
        for cipher in CIPHERS if regime == "unlimited" else ():
            started = time.monotonic()
            self.head(f"cat /root/bench/raw.bin | {self.ssh(worker)} -c {cipher} 'cat >/dev/null'")
            self.rows.append(
                Row("ssh cipher", regime, 1, cipher, time.monotonic() - started, self.payload)
            )
        image_bytes = int(self.head(f"docker save {IMAGE} | wc -c"))
        for method, squeeze, unsqueeze in (
            ("no compression", "cat", "cat"),
            ("zstd -1 -T0", "zstd -1 -T0 -q", "zstd -d -q"),
        ):
            started = time.monotonic()
            self.head(
                f"docker save {IMAGE} | {squeeze} | {self.ssh(worker)} '{unsqueeze} >/dev/null'"
            )
            self.rows.append(
                Row(
                    "image stream compression",
                    regime,
                    1,
                    method,
                    time.monotonic() - started,
                    image_bytes,
                )
            )

    def resumed_copy(self, regime: str) -> None:
        """A weights copy and an image copy (uncompressed, so that bytes compare with bytes),
        each cut at about half, then retried: what the retry sends against what was missing
        when it started."""
        worker = self.workers[0]
        self.lab.sh(worker, f"rm -rf {REPO_DIR}")
        self.missing_after_cut = self.cut_and_resume(
            "resume after a cut",
            self.weights_script(worker, "main"),
            f"{REPO_DIR}/blobs",
            sum(self.sizes.blobs),
            regime,
        )
        self.reset_workers()
        image = self.image_script(worker, IMAGE, compress="none")
        self.image_missing_after_cut = self.cut_and_resume(
            "image resume after a cut",
            image,
            f"{STATE}/image-stage",
            int(self.head(f"docker save {IMAGE} | wc -c")),
            regime,
        )

    def cut_and_resume(
        self,
        case: str,
        script: str,
        landing: str,
        total: int,
        regime: str,
        worker: str | None = None,
        method: str = "spark-vllm",
    ) -> int:
        """Run `script` for `worker` (the first), cut it (the copy and its pipeline on the head)
        once `landing` there holds about half of `total`, run it again; a row with what the
        retry sent, and what was missing when it started."""
        worker = worker or self.workers[0]

        def landed() -> int:
            out = self.lab.sh(worker, f"du -sb --apparent-size {landing} 2>/dev/null | cut -f1")
            return int(out.stdout.strip() or 0)

        self.head(f"( {script} ) >/root/bench/cut.log 2>&1 &")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and landed() < total // 2:
            time.sleep(0.2)
        # The cut (nothing else on the head runs these): the worker sees its stream end early.
        self.head(
            "pkill -KILL -f '[w]eights-sync.sh|[i]mage-sync.sh'; pkill -KILL -x ssh; "
            "pkill -KILL -x tar; pkill -KILL -x dd; pkill -KILL -x docker; true"
        )
        time.sleep(1)
        missing = total - landed()
        started = time.monotonic()
        self.head(f"{script} > /root/bench/resume.log 2>&1")
        seconds = time.monotonic() - started
        log = (self.lab.node(HEAD).hostdir / "root/bench/resume.log").read_text()
        sent = int(re.findall(SENT, log)[-1])
        self.rows.append(Row(case, regime, 1, method, seconds, sent))
        return missing

    def image_copy(self, worker: str, image: str) -> tuple[float, int]:
        """The image alone to one worker, as its own step copies it: (seconds, bytes sent)."""
        started = time.monotonic()
        log = self.head(f"{self.image_script(worker, image)} 2>&1")
        return time.monotonic() - started, int(re.findall(SENT, log)[-1])

    def layers(self, host: str, image: str) -> str:
        """The image's layers (diff IDs: the same on every store), empty when `host` lacks it."""
        return self.lab.sh(
            host, f"docker image inspect --format '{{{{json .RootFS.Layers}}}}' {image} || true"
        ).stdout.strip()

    def image_side_by_side(self, worker: str, image: str) -> tuple[float, float]:
        """The image to a worker that holds none of it, twice, one method after the other on
        the same idle hosts: spark-vllm's copy engine as the program runs it (landing under the
        pinned name the program runs), then the seeds' `docker save | ssh | docker load`.
        (engine seconds, raw seconds); each copy must land the head's layers."""
        image_id = self.head(f"docker image inspect --format '{{{{.Id}}}}' {image}").strip()
        pinned = pinned_image(image_id)
        on_head = self.layers(HEAD, image)
        seconds = {}
        for method, landed in (("engine", pinned), ("raw", image)):
            self.lab.sh(worker, f"docker image rm -f {pinned} {image} >/dev/null 2>&1; "
                        "docker image prune -af >/dev/null")  # fmt: skip
            if self.layers(worker, image) or self.layers(worker, pinned):
                raise RuntimeError(f"{worker}: {image} still there before the {method} copy")
            script = (
                self.image_script(worker, image)
                if method == "engine"
                else f"docker save {image} | {self.ssh(worker)} docker load >/dev/null"
            )
            started = time.monotonic()
            self.head(script)
            seconds[method] = time.monotonic() - started
            if self.layers(worker, landed) != on_head:
                raise RuntimeError(f"{worker}: the {method} copy did not land {image}'s layers")
        return seconds["engine"], seconds["raw"]

    def containerd_store(self, regime: str) -> None:
        """The image's own cases against the containerd-store worker: a first copy, nothing
        changed, one layer changed, and a copy cut at about half (uncompressed) resumed."""
        worker = self.containerd_worker
        if worker is None:
            return
        self.reset_workers()
        self.record("image", regime, 1, CONTAINERD, [self.image_copy(worker, IMAGE)])
        self.record("nothing changed (image)", regime, 1, CONTAINERD,
                    [self.image_copy(worker, IMAGE)])  # fmt: skip
        self.record("image update (one layer)", regime, 1, CONTAINERD,
                    [self.image_copy(worker, IMAGE_UPDATE)])  # fmt: skip
        self.reset_workers()
        image = self.image_script(worker, IMAGE, compress="none")
        self.containerd_missing_after_cut = self.cut_and_resume(
            "image resume after a cut",
            image,
            f"{STATE}/image-stage",
            int(self.head(f"docker save {IMAGE} | wc -c")),
            regime,
            worker=worker,
            method=CONTAINERD,
        )

    def run(self) -> None:
        self.prepare()
        self.make_workloads()
        for regime, rate in (("rate-limited", self.sizes.rate_mbit), ("unlimited", None)):
            self.shape(rate)
            self.reset_workers()
            self.first_copy(regime, rate)
            self.transport_choices(regime)
            if rate:
                self.resumed_copy(regime)
                self.containerd_store(regime)
        self.shape(None)

    # -- the report ----------------------------------------------------------------------------

    def find(self, case: str, regime: str, workers: int, method: str) -> Row | None:
        return next(
            (
                r
                for r in self.rows
                if (r.case, r.regime, r.workers, r.method) == (case, regime, workers, method)
            ),
            None,
        )

    def goals(self) -> list[tuple[str, bool, str]]:
        limited, most = "rate-limited", max(self.sizes.workers)
        one = self.find("image+weights", limited, 1, "spark-vllm")
        floor = self.find("image+weights", limited, 1, "floor (bytes / rate)")
        many = self.find("image+weights", limited, most, "spark-vllm")
        seeds_many = self.find("image+weights", limited, most, "seeds' method")
        raw = self.find("image+weights", "unlimited", 1, "raw ssh stream")
        free = self.find("image+weights", "unlimited", 1, "spark-vllm")
        layer = self.find("image update (one layer)", limited, 1, "spark-vllm")
        revision = self.find("revision (one file)", limited, 1, "spark-vllm")
        resumed = self.find("resume after a cut", limited, 1, "spark-vllm")
        image_resumed = self.find("image resume after a cut", limited, 1, "spark-vllm")
        unchanged = self.find("nothing changed", limited, 1, "spark-vllm")
        assert one and floor and many and seeds_many and raw and free and layer and revision
        assert resumed and image_resumed and unchanged
        layer_bytes = self.sizes.image_layers[-1]
        return [
            (
                "rate-limited, 1 worker: within 1.15x of bytes / rate",
                one.seconds <= 1.15 * floor.seconds,
                f"{one.seconds / floor.seconds:.2f}x",
            ),
            (
                f"rate-limited, {most} workers: within 1.3x of 1 worker",
                many.seconds <= 1.3 * one.seconds,
                f"{many.seconds / one.seconds:.2f}x",
            ),
            (
                f"rate-limited, {most} workers: at least 2x faster than the seeds' method",
                seeds_many.seconds >= 2 * many.seconds,
                f"{seeds_many.seconds / many.seconds:.2f}x",
            ),
            (
                "unlimited: no slower than one raw ssh stream",
                free.seconds <= raw.seconds,
                f"{free.seconds / raw.seconds:.2f}x",
            ),
            (
                "image update of one layer: bytes <= 1.2x the layer",
                layer.bytes <= 1.2 * layer_bytes,
                f"{layer.bytes / layer_bytes:.3f}x",
            ),
            (
                "revision of one file: bytes <= 1.1x the file (and the image unchanged)",
                revision.bytes <= 1.1 * self.changed_file_bytes,
                f"{revision.bytes / self.changed_file_bytes:.3f}x",
            ),
            (
                "resume after a cut at ~50%: bytes <= 1.1x what was missing",
                resumed.bytes <= 1.1 * self.missing_after_cut,
                f"{resumed.bytes / max(self.missing_after_cut, 1):.3f}x",
            ),
            (
                "image resume after a cut at ~50%: bytes <= 1.1x what was missing",
                image_resumed.bytes <= 1.1 * self.image_missing_after_cut,
                f"{image_resumed.bytes / max(self.image_missing_after_cut, 1):.3f}x",
            ),
            ("nothing changed: 0 bytes", unchanged.bytes == 0, f"{unchanged.bytes} bytes"),
            *self.containerd_goals(),
        ]

    def containerd_goals(self) -> list[tuple[str, bool, str]]:
        """The image's byte goals on the containerd-store worker."""
        if self.containerd_worker is None:
            return []
        limited = "rate-limited"
        unchanged = self.find("nothing changed (image)", limited, 1, CONTAINERD)
        layer = self.find("image update (one layer)", limited, 1, CONTAINERD)
        resumed = self.find("image resume after a cut", limited, 1, CONTAINERD)
        assert unchanged and layer and resumed
        layer_bytes, missing = self.sizes.image_layers[-1], self.containerd_missing_after_cut
        return [
            (
                "containerd store, image update of one layer: bytes <= 1.2x the layer",
                layer.bytes <= 1.2 * layer_bytes,
                f"{layer.bytes / layer_bytes:.3f}x",
            ),
            (
                "containerd store, image resume after a cut at ~50%: bytes <= 1.1x the missing",
                resumed.bytes <= 1.1 * missing,
                f"{resumed.bytes / max(missing, 1):.3f}x",
            ),
            (
                "containerd store, nothing changed: 0 bytes",
                unchanged.bytes == 0,
                f"{unchanged.bytes} bytes",
            ),
        ]

    def choices(self) -> list[str]:
        """Per regime: the fastest cipher, and whether zstd pays for itself on an image."""
        said = []
        for regime in ("rate-limited", "unlimited"):
            ciphers = [r for r in self.rows if r.case == "ssh cipher" and r.regime == regime]
            squeeze = {
                r.method: r.seconds
                for r in self.rows
                if r.case == "image stream compression" and r.regime == regime
            }
            if len(squeeze) != 2:
                continue
            ratio = squeeze["zstd -1 -T0"] / squeeze["no compression"]
            fastest = "every cipher at the link's rate"
            if ciphers:
                best = min(ciphers, key=lambda r: r.seconds)
                fastest = (
                    f"fastest cipher {best.method} ("
                    + ", ".join(f"{r.method} {r.seconds:.1f} s" for r in ciphers)
                    + ")"
                )
            said.append(
                f"- {regime}: {fastest}; an image stream with zstd -1 takes {ratio:.2f}x "
                "the time without"
            )
        return said

    def report(self, out: Path, command: str) -> str:
        out.mkdir(parents=True, exist_ok=True)
        goals = self.goals()
        lines = [
            f"Regimes: rate-limited at {self.sizes.rate_mbit} Mbit/s per host (tc tbf on every "
            "fabric interface), and unlimited (veth: the CPU is the limit). Image "
            f"{sum(self.sizes.image_layers) // MB} MB in {len(self.sizes.image_layers)} layers, "
            f"snapshot {sum(self.sizes.blobs) // MB} MB in {len(self.sizes.blobs)} blobs, random "
            f"bytes; median of {self.sizes.repetitions}. `{command}`",
            "",
            "Raw ssh stream: one measured, times the workers (one head link carries them in turn).",
            "",
            "| case | regime | workers | method | seconds | MB moved |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.case} | {r.regime} | {r.workers} | {r.method} | {r.seconds:.1f} | "
            f"{r.bytes / MB:.1f} |"
            for r in self.rows
        ]
        lines += ["", "| goal | result | measured |", "|---|---|---|"]
        lines += [f"| {goal} | {'PASS' if ok else 'MISS'} | {value} |" for goal, ok, value in goals]
        lines += ["", *self.choices()]
        text = "\n".join(lines) + "\n"
        (out / "bench.md").write_text(text)
        (out / "bench.json").write_text(
            json.dumps(
                {
                    "sizes": asdict(self.sizes),
                    "rows": [asdict(r) for r in self.rows],
                    "goals": [{"goal": g, "pass": ok, "measured": v} for g, ok, v in goals],
                },
                indent=2,
            )
        )
        self.chart(out / "bench.png")
        return text

    def chart(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        methods = ["floor (bytes / rate)", "raw ssh stream", "seeds' method", "spark-vllm"]
        regimes = ["rate-limited", "unlimited"]
        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        for axis, regime in zip(axes, regimes, strict=True):
            width = 0.2
            for offset, method in enumerate(methods):
                values = [
                    (row.seconds if (row := self.find("image+weights", regime, n, method)) else 0)
                    for n in self.sizes.workers
                ]
                axis.bar(
                    [i + offset * width for i in range(len(values))], values, width, label=method
                )
            axis.set_xticks([i + 1.5 * width for i in range(len(self.sizes.workers))])
            axis.set_xticklabels([f"{n} worker(s)" for n in self.sizes.workers])
            axis.set_title(f"image + weights, {regime}")
            axis.set_ylabel("seconds")
        axes[0].legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(path, dpi=100)


def half_compressible(size: int) -> bytes:
    """Random 4 KiB blocks alternating with zeroed ones: about as compressible as an image's
    binaries and libraries (zstd -1 about halves it)."""
    block = 4096
    chunks = [os.urandom(block) if i % 2 else bytes(block) for i in range(size // block + 1)]
    return b"".join(chunks)[:size]


def image_tar(ref: str, layers: list[bytes]) -> bytes:
    """A `docker save` stream (the format `docker load` reads: manifest.json, a config naming
    each layer's diff ID, one tar per layer) of an image of these layers' bytes."""
    layer_tars = []
    for index, data in enumerate(layers):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as layer:
            info = tarfile.TarInfo(f"layer{index}.bin")
            info.size = len(data)
            layer.addfile(info, io.BytesIO(data))
        layer_tars.append(raw.getvalue())
    diff_ids = ["sha256:" + hashlib.sha256(t).hexdigest() for t in layer_tars]
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    config = json.dumps(
        {
            "architecture": arch,
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    members = {
        f"{d.removeprefix('sha256:')}/layer.tar": t
        for d, t in zip(diff_ids, layer_tars, strict=True)
    }
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": list(members)}]
    members |= {config_name: config, "manifest.json": json.dumps(manifest).encode()}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as saved:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            saved.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def write_snapshot(repo: Path, commit: str, files: dict[str, bytes], ref: bool = True) -> None:
    """huggingface_hub's cache layout: blobs by sha256, a snapshot of links, refs/main."""
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / name).symlink_to(f"../../blobs/{blob}")
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)


def bench_spec(state_dir: Path, prefix: str = "svb") -> LabSpec:
    """A 4-host lab of its own (head and 3 workers), on subnets a default lab does not use."""
    return LabSpec(
        hosts=4,
        topology="bastion",
        prefix=prefix,
        state_dir=state_dir,
        mgmt_subnet="10.246.1.0/24",
        fabric_subnet="10.247.0.0/24",
        outside_subnet="10.246.0.0/30",
        with_image=False,
        with_model=False,
        engines=BENCH_ENGINES,
    )


def run_bench(lab: Lab, short: bool, out: Path, command: str) -> tuple[str, Bench]:
    bench = Bench(lab, SHORT if short else FULL)
    bench.run()
    return bench.report(out, command), bench


def real_image_side_by_side(lab: Lab) -> str:
    """The real vLLM image (vLLM's CPU build, about 4 GB: lab/image.py) from the head to the
    worker, the copy engine and the seeds' method side by side, on a 2-host real lab."""
    bench = Bench(lab, SHORT)
    bench.prepare()
    size = int(bench.head(f"docker image inspect --format '{{{{.Size}}}}' {LAB_IMAGE}"))
    engine, raw = bench.image_side_by_side("spark2", LAB_IMAGE)
    return (
        f"real-size image copy (the real vLLM image, {size / 1e9:.2f} GB, head to one worker "
        f"over the fabric), side by side: spark-vllm's copy engine (zstd) {engine:.0f} s, "
        f"docker save | ssh | docker load {raw:.0f} s (engine/raw {engine / raw:.2f}x)"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab bench", description=__doc__)
    parser.add_argument("--short", action="store_true", help="small sizes, one repetition")
    parser.add_argument(
        "--real-image",
        action="store_true",
        help="only the real vLLM image (about 4 GB) to one worker: engine vs docker save|load",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--state-dir", type=Path, default=Path("/var/lib/spark-vllm-bench"))
    args = parser.parse_args(argv)
    if args.real_image:
        lab = Lab(replace(bench_spec(args.state_dir), hosts=2, engines=(), vllm="real",
                          with_image=True))  # fmt: skip
        lab.down()
        lab.up()
        try:
            print(real_image_side_by_side(lab))
        finally:
            lab.down()
        return 0
    lab = Lab(bench_spec(args.state_dir))
    lab.down()
    lab.up()
    try:
        text, _ = run_bench(
            lab, args.short, args.out, "python -m lab bench" + (" --short" if args.short else "")
        )
    finally:
        lab.down()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
