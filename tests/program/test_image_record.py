"""image-record.sh for real with bash and a stand-in docker: image.ref's record is the head's
`image-id` (the weights fetch runs it); an entry's own image writes its own record beside it."""

from __future__ import annotations

from pathlib import Path

from tests.program.scripting import fake_bin, run

IMAGE_ID = "sha256:" + "c" * 64
FAKE_DOCKER = f"""#!/usr/bin/env bash
case "$1 $2" in
  "image inspect") echo {IMAGE_ID} ;;
  "tag sha256:"*) exit 0 ;;
  *) exit 1 ;;
esac
"""


def record(tmp_path: Path, *extra: str) -> str:
    flags = ["--host", "spark1", "--state-dir", str(tmp_path / "state"), "--image-id", IMAGE_ID,
             "--ref", "vllm/vllm-openai:v0.34.0",
             "--pinned", "spark-vllm.invalid/image-i62e988a9:x"]  # fmt: skip
    done = run(
        "image-record.sh", "record", *flags, *extra, env=fake_bin(tmp_path, docker=FAKE_DOCKER)
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_entrys_own_image_leaves_image_refs_record_alone(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "image-id").write_text("sha256:base\n")
    assert record(tmp_path, "--record-file", "image-id-i62e988a9") == IMAGE_ID
    assert (tmp_path / "state" / "image-id").read_text() == "sha256:base\n"
    assert (tmp_path / "state" / "image-id-i62e988a9").read_text() == f"{IMAGE_ID}\n"


def test_image_refs_record_is_the_heads_image_id(tmp_path: Path) -> None:
    record(tmp_path)
    assert (tmp_path / "state" / "image-id").read_text() == f"{IMAGE_ID}\n"


REMOVE_DOCKER = """#!/usr/bin/env bash
case "$1 $2" in
  "image inspect") echo 2 ;;  # the pinned name and the pulled ref
  "ps -aq") [ -z "${FAKE_USERS:-}" ] || echo c0ffee ;;
  "image rm") echo "$@" >> "$LOG" ;;
  *) exit 1 ;;
esac
"""


def test_the_pinned_name_stays_while_another_stacks_container_uses_it(tmp_path: Path) -> None:
    """The delete takes the pinned name off, but not from under another stack on the head (the
    name is by content: every stack's), whose containers run by it."""
    flags = ["--host", "spark1", "--pinned", "spark-vllm.invalid/image:x", "--keep", "no"]
    for users, removed in (("1", False), ("", True)):
        env = {**fake_bin(tmp_path, docker=REMOVE_DOCKER), "LOG": str(tmp_path / "log"),
               "FAKE_USERS": users}  # fmt: skip
        done = run("image-record.sh", "remove", *flags, env=env)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "log").exists() == removed, users
        if not removed:
            assert "container(s) of another deployment use it" in done.stdout
