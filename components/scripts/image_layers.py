"""An image's identity on any store, which of its layers a worker holds, and a `docker save`
stream without them.

    image_layers.py identity                  < `docker image inspect` JSON   > one identity a line
    image_layers.py held LAYERS_JSON          < worker's `docker image inspect` RootFS.Layers lines
    image_layers.py index                     < docker save stream   > index JSON
    image_layers.py filter INDEX_FILE COUNT [NAMES_FILE]
                                              < docker save stream   > the same stream, its first
                                                COUNT layers emptied (and the members NAMES_FILE
                                                lists, one a line: what the worker has staged)
    image_layers.py to-send INDEX_FILE COUNT [NAMES_FILE]
                                              > the bytes that stream carries (the progress total)

`docker load` reads a layer's file only when the daemon lacks that layer's chain: moby
image/tarexport/load.go looks the chain ID up in the layer store first (`l.lss.Get(r.ChainID())`)
and calls loadLayer only when it is missing (checked with Docker 20.10's loader in the lab). So a
saved stream whose leading layers the worker already holds, as the same chain, can carry those
layers as empty files, and the worker still ends up with the whole image (the image ID, from the
config, is the same). A chain is the layer with every layer below it, so only a leading run of
layers can be left out: a layer the worker holds on another base is still sent.

The member that holds a layer is named by the stream's manifest.json (`Layers`, in rootfs
order), which `docker save` writes last: `index` reads one whole stream to find them (its
layers' bytes are read and dropped), so `filter` can empty them from the next stream as they go
by. Standard library only: it runs with the hosts' own python3.

An image's ID is not its identity across stores. On Docker's classic store it is the config's
digest; with the containerd image store (Docker 29's default) it is the digest of the manifest
the store holds, which depends on how the image arrived: the same image loaded from a Docker 20.10
stream and from a Docker 26 stream gets two IDs there, and neither is the head's (checked in the
lab, tests/program/fixtures/inspect). The config is what survives `save | load` on every store,
and Docker 26 does not show its digest there; `identity` hashes what `docker image inspect`
shows of it on every store alike: the OCI config fields, the platform, the creation time and
the layers' diff IDs. (Docker-only fields such as Hostname or AttachStdout are left out: the
containerd store shows them empty.)
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from collections.abc import Iterable
from typing import BinaryIO


def chain_ids(diff_ids: list[str]) -> list[str]:
    """Each layer's chain ID (image-spec: ChainID(L0) = DiffID(L0), ChainID(Ln) =
    sha256(ChainID(Ln-1) + " " + DiffID(Ln)))."""
    chains: list[str] = []
    for diff_id in diff_ids:
        if not chains:
            chains.append(diff_id)
        else:
            text = f"{chains[-1]} {diff_id}".encode()
            chains.append("sha256:" + hashlib.sha256(text).hexdigest())
    return chains


# The OCI image-spec's config fields (config.md, "config"): what the containerd store shows of
# an image's config; Docker's own extra fields are left out.
OCI_CONFIG_FIELDS = (
    "User",
    "ExposedPorts",
    "Env",
    "Entrypoint",
    "Cmd",
    "Volumes",
    "WorkingDir",
    "Labels",
    "StopSignal",
)


ZERO_TIME = "0001-01-01T00:00:00Z"


def identity(inspected: dict[str, object]) -> str:
    """The image's content identity from one `docker image inspect` entry: equal on every store
    for the same config (and so the same layers), different when anything in it differs."""
    config = inspected.get("Config") or {}
    assert isinstance(config, dict)
    created = inspected.get("Created")
    rootfs = inspected.get("RootFS") or {}
    assert isinstance(rootfs, dict)
    content = {
        "architecture": inspected.get("Architecture") or "",
        "os": inspected.get("Os") or "",
        "variant": inspected.get("Variant") or "",
        # A config without `created`: Docker 20.10 shows Go's zero time, the containerd store
        # leaves it out (tests/program/fixtures/inspect/no-created-*).
        "created": "" if created in (None, ZERO_TIME) else created,
        "diff_ids": list(rootfs.get("Layers") or []),
        # Empty and missing read alike: stores differ in which they show.
        "config": {key: config[key] for key in OCI_CONFIG_FIELDS if config.get(key)},
    }
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return "content:" + hashlib.sha256(text.encode()).hexdigest()


def held_count(image_layers: list[str], worker_images: Iterable[list[str]]) -> int:
    """How many of the image's leading layers a worker holds as the same chain."""
    held = {chain for layers in worker_images for chain in chain_ids(layers)}
    count = 0
    for chain in chain_ids(image_layers):
        if chain not in held:
            break
        count += 1
    return count


def index(stream: BinaryIO) -> dict[str, object]:
    """The members that hold the image's layers, in rootfs order, and every member's size."""
    sizes: dict[str, int] = {}
    manifest: list[dict[str, object]] = []
    with tarfile.open(fileobj=stream, mode="r|") as saved:
        for member in saved:
            sizes[member.name] = member.size
            if member.name == "manifest.json":
                handle = saved.extractfile(member)
                manifest = json.load(handle) if handle is not None else []
    if len(manifest) != 1:
        raise SystemExit(f"image_layers.py: expected one image in the stream, got {len(manifest)}")
    layers = manifest[0]["Layers"]
    assert isinstance(layers, list)
    return {"layers": layers, "sizes": sizes}


def emptied(index: dict[str, object], held: int, staged: set[str]) -> set[str]:
    """The members the worker does not need: its first `held` layers, and what it has staged."""
    layers = index["layers"]
    assert isinstance(layers, list)
    return set(layers[:held]) | staged


def bytes_to_send(index: dict[str, object], left_out: set[str]) -> int:
    """The saved stream's members but those left out: what `filter` leaves to send."""
    sizes = index["sizes"]
    assert isinstance(sizes, dict)
    return sum(size for name, size in sizes.items() if name not in left_out)


def filtered(stream: BinaryIO, out: BinaryIO, emptied: set[str]) -> int:
    """Copy the stream, the members in `emptied` as empty files; returns the bytes left out."""
    left_out = 0
    with (
        tarfile.open(fileobj=stream, mode="r|") as saved,
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as sent,
    ):
        for member in saved:
            if member.name in emptied and member.isfile():
                left_out += member.size
                member.size = 0
                sent.addfile(member, io.BytesIO(b""))
            else:
                sent.addfile(member, saved.extractfile(member) if member.isfile() else None)
    return left_out


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command == "identity" and len(argv) == 1:
        text = sys.stdin.read().strip()
        for entry in json.loads(text) if text else []:
            print(identity(entry))
        return 0
    if command == "held" and len(argv) == 2:
        worker = [json.loads(line) for line in sys.stdin if line.strip().startswith("[")]
        print(held_count(json.loads(argv[1]), worker))
        return 0
    if command == "index" and len(argv) == 1:
        print(json.dumps(index(sys.stdin.buffer)))
        return 0
    if command in ("to-send", "filter") and len(argv) in (3, 4):
        with open(argv[1]) as handle:
            saved_index = json.load(handle)
        staged: set[str] = set()
        if len(argv) == 4:
            with open(argv[3]) as handle:
                staged = {line.strip() for line in handle if line.strip()}
        left_out = emptied(saved_index, int(argv[2]), staged)
        if command == "to-send":
            print(bytes_to_send(saved_index, left_out))
            return 0
        count = filtered(sys.stdin.buffer, sys.stdout.buffer, left_out)
        print(f"image_layers.py: {count} bytes of held layers left out", file=sys.stderr)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
