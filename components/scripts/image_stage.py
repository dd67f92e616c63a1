"""An image copy that a cut does not start again from nothing: the worker keeps what arrived.

    image_stage.py receive STAGE_DIR     < the saved stream   > the same stream, for docker load
    image_stage.py tail NAME OFFSET      < docker save stream > member NAME from byte OFFSET on

`docker load` keeps nothing of a stream that ends early: it unpacks the whole stream before it
reads its manifest.json, and the layers it registered are released when the load fails. So on
the worker, `receive` writes every member of the stream into a staging directory as it passes
it on to `docker load`; a copy cut midway leaves there the members that arrived whole and the
one that was arriving, in part. The next copy asks what is staged and plans against the index
of the head's saved stream (copy_plan.py image-copy): a member staged whole is sent as an empty
file, which `receive` fills from the stage; a member staged in part is first completed with its
missing tail (`tail`, appended there). Once `docker load` succeeds, the stage is removed
(image-load.sh).
Standard library only: it runs with the hosts' own python3.
"""

from __future__ import annotations

import shutil
import sys
import tarfile
from pathlib import Path
from typing import BinaryIO


class Tee:
    """A reader that writes what is read from it to `copy` too."""

    def __init__(self, source: BinaryIO, copy: BinaryIO) -> None:
        self.source, self.copy = source, copy

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.copy.write(data)
        return data


def staged_path(stage: Path, name: str) -> Path:
    """Where member `name` is staged; a name that would leave the stage is refused."""
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts:
        raise SystemExit(f"image_stage.py: refusing member name {name!r}")
    return stage.joinpath(*parts)


def receive(stream: BinaryIO, out: BinaryIO, stage: Path) -> None:
    """Pass the stream on as it arrives, every file member staged too; an empty member that is
    staged (the head left it out because the worker has it there) goes on with the staged
    bytes. Other images' stages in the same parent are removed: one image is staged at a time."""
    stage.mkdir(parents=True, exist_ok=True)
    for other in stage.parent.iterdir():
        if other != stage:
            shutil.rmtree(other, ignore_errors=True)
    with (
        tarfile.open(fileobj=stream, mode="r|") as saved,
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as loaded,
    ):
        for member in saved:
            if not member.isfile():
                loaded.addfile(member)
                continue
            path = staged_path(stage, member.name)
            if member.size == 0 and path.is_file() and path.stat().st_size > 0:
                member.size = path.stat().st_size
                with path.open("rb") as staged:
                    loaded.addfile(member, staged)
                continue
            source = saved.extractfile(member)
            assert source is not None
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as copy:
                loaded.addfile(member, Tee(source, copy))  # type: ignore[arg-type]


def tail(stream: BinaryIO, out: BinaryIO, name: str, offset: int) -> bool:
    """Member `name` of the stream from byte `offset` on; stops reading once it is out."""
    with tarfile.open(fileobj=stream, mode="r|") as saved:
        for member in saved:
            if member.name == name and member.isfile():
                source = saved.extractfile(member)
                assert source is not None
                skip = offset  # the stream does not seek: read past what the worker has
                while skip > 0:
                    chunk = source.read(min(skip, 1024 * 1024))
                    if not chunk:
                        break
                    skip -= len(chunk)
                shutil.copyfileobj(source, out, 1024 * 1024)
                return True
    return False


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command == "receive" and len(argv) == 2:
        receive(sys.stdin.buffer, sys.stdout.buffer, Path(argv[1]))
        return 0
    if command == "tail" and len(argv) == 3:
        return 0 if tail(sys.stdin.buffer, sys.stdout.buffer, argv[1], int(argv[2])) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
