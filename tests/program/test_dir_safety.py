"""dir_safety.py: whether another local user could change what is in a host's state leaf or
cache, decided as a table (facts in, problems out), then read on real directories through
facts.sh as the program sends it, and the program's refusal."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pulumi
import pytest

from components.bundle import facts_script
from components.facts import HostFacts, parse_facts, refuse_unsafe
from tests.program.scripting import load

ds = load("dir_safety")
ME, OTHER = 1000, 12345
DIR, LINK = 0o040000, 0o120000


def d(path: str, uid: int = 0, mode: int = 0o755) -> object:
    return ds.Entry(path, "dir", uid, DIR | mode)


STATE = ds.Target(*ds.STATE, path="/srv/s/spark-vllm.dev", leaf_owned=True)
CACHE = ds.Target(*ds.CACHE, path="/srv/hf", leaf_owned=False)
ROOTS = [d("/"), d("/srv")]


@pytest.mark.parametrize(
    ("target", "last", "parents", "expected"),
    [
        # Safe: root's parents, the user's own leaf; or a leaf not made yet.
        (STATE, d("/srv/s/spark-vllm.dev", ME, 0o700), [d("/srv/s", ME, 0o700)], []),
        (STATE, ds.Entry("/srv/s", "missing"), [], []),
        # The cache may be root's (an SSH user who is root), or a link's real directory.
        (CACHE, d("/srv/hf", 0), [], []),
        # A parent of another user's: they can rename ours away and put theirs in its place.
        (STATE, d("/srv/s/spark-vllm.dev", ME, 0o700), [d("/srv/s", OTHER)],
         ["/srv/s, a parent of the state directory /srv/s/spark-vllm.dev, belongs to another"]),
        # Group-writable counts, as in OpenSSH's StrictModes (mode & 022).
        (STATE, d("/srv/s/spark-vllm.dev", ME, 0o700), [d("/srv/s", ME, 0o775)],
         ["/srv/s, a parent of the state directory /srv/s/spark-vllm.dev, may be written by"]),
        # The sticky bit is no exception: whoever makes the name first owns it.
        (STATE, ds.Entry("/srv/s", "missing"), [d("/srv/s", 0, 0o1777)],
         ["/srv/s, a parent of the state directory /srv/s/spark-vllm.dev, may be written by"]),
        # The state leaf: a link, another user's, root's, open to others, not a directory.
        (STATE, ds.Entry("/srv/s/spark-vllm.dev", "link", OTHER, LINK | 0o777), [],
         ["the state directory /srv/s/spark-vllm.dev is a symbolic link"]),
        (STATE, d("/srv/s/spark-vllm.dev", OTHER, 0o700), [],
         ["the state directory /srv/s/spark-vllm.dev belongs to another user"]),
        (STATE, d("/srv/s/spark-vllm.dev", 0, 0o700), [],
         ["the state directory /srv/s/spark-vllm.dev belongs to another user"]),
        (STATE, d("/srv/s/spark-vllm.dev", ME, 0o777), [],
         ["the state directory /srv/s/spark-vllm.dev may be written by other users"]),
        (STATE, ds.Entry("/srv/s/spark-vllm.dev", "other", ME, 0o100600), [],
         ["the state directory /srv/s/spark-vllm.dev is not a directory"]),
        (CACHE, d("/srv/hf", OTHER), [], ["model.cacheDir /srv/hf belongs to another user"]),
    ],
)  # fmt: skip
def test_problems(target: object, last: object, parents: list[object], expected: list[str]) -> None:
    found = ds.problems(target, [*ROOTS, *parents, last], ME)
    assert len(found) == len(expected), found
    for line, start in zip(found, expected, strict=True):
        assert line.startswith(start), line
        assert "; fix: " in line, line  # every problem says what to do


def test_a_problem_names_owner_mode_and_fix() -> None:
    [line] = ds.problems(
        STATE, [*ROOTS, d("/srv/s", OTHER, 0o755), ds.Entry("/srv/s/x", "missing")], ME
    )
    assert "(owner uid 12345, mode drwxr-xr-x)" in line
    assert "fix: set hosts[].stateDir to a directory whose every parent only root or" in line
    assert "or as root: chown root /srv/s && chmod go-w /srv/s" in line
    # A sticky tree (/tmp) is shared on purpose: no chmod is suggested for it.
    [sticky] = ds.problems(STATE, [d("/"), d("/tmp", 0, 0o1777), ds.Entry("/tmp/s", "missing")], 0)
    assert "only root may write" in sticky and "chmod go-w /tmp" not in sticky


# --- on real directories, through facts.sh as the program sends it ------------------------------


def check(state_leaf: Path, cache: Path) -> list[str]:
    """facts.sh's `unsafe` lines for these directories (no receipt is read when there are any)."""
    done = subprocess.run(
        ["bash", "-s", "--", str(state_leaf), str(cache), ""],
        input=facts_script(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return parse_facts("spark1", done.stdout).unsafe


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def layout(base: Path) -> tuple[Path, Path]:
    """A stateDir with the leaf made and a receipt in it, and a cache, as a deployment left them."""
    leaf, cache = base / "state" / "spark-vllm.dev", base / "hf"
    (leaf / "receipts").mkdir(parents=True, mode=0o700)
    (leaf / "receipts" / "s-key").write_text("t1\n")
    cache.mkdir(mode=0o700)
    return leaf, cache


def test_safe_directories_pass_and_their_receipts_are_read(host_tmp: Path) -> None:
    leaf, cache = layout(host_tmp)
    assert check(leaf, cache) == []
    assert check(host_tmp / "not" / "made", host_tmp / "hf2") == []  # mkdir -p makes them later
    done = subprocess.run(["bash", "-s", "--", str(leaf), str(cache), ""], input=facts_script(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert parse_facts("spark1", done.stdout).holding == {"s-key": "t1"}


def test_a_symlinked_leaf_is_refused_and_no_receipt_read(host_tmp: Path) -> None:
    leaf, cache = layout(host_tmp)
    real = host_tmp / "elsewhere"
    leaf.rename(real)
    leaf.symlink_to(real)
    [line] = check(leaf, cache)
    assert line.startswith(f"the state directory {leaf} is a symbolic link"), line
    done = subprocess.run(["bash", "-s", "--", str(leaf), str(cache), ""], input=facts_script(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert parse_facts("spark1", done.stdout).holding == {}


def test_a_symlinked_ancestor_into_a_world_writable_tree_is_refused(host_tmp: Path) -> None:
    open_dir = host_tmp / "open"
    open_dir.mkdir()
    open_dir.chmod(0o1777)  # as /tmp
    (open_dir / "state").mkdir()
    (host_tmp / "state").symlink_to(open_dir / "state")  # stateDir itself leads into it
    found = check(host_tmp / "state" / "spark-vllm.dev", host_tmp / "hf")
    assert "leads through a symbolic link" in found[0], found
    assert [line.split(",")[0] for line in found[1:]] == [str(open_dir)], found
    assert "may be written by other users" in found[1] and "drwxrwxrwt" in found[1]


def test_a_cache_through_safe_links_passes_a_state_leaf_through_one_does_not(
    host_tmp: Path,
) -> None:
    """A cache on a bigger disk is fine; the state leaf must be reached without links, as the
    destroy's emptying (lib.sh `empty`) will refuse it otherwise: refused now, not then."""
    (host_tmp / "real" / "state").mkdir(parents=True)
    (host_tmp / "real" / "hf").mkdir()
    (host_tmp / "hf").symlink_to(host_tmp / "real" / "hf")
    assert check(host_tmp / "real" / "state" / "spark-vllm.dev", host_tmp / "hf") == []
    (host_tmp / "state").symlink_to("real/state")  # relative, as ln -s writes it
    [line] = check(host_tmp / "state" / "spark-vllm.dev", host_tmp / "hf")
    assert line.startswith(
        f"the state directory {host_tmp / 'state' / 'spark-vllm.dev'} leads through a symbolic "
        f"link ({host_tmp / 'state'} -> real/state)"
    ), line


def test_a_group_writable_ancestor_is_refused(host_tmp: Path) -> None:
    leaf, cache = layout(host_tmp)
    (host_tmp / "state").chmod(0o770)
    [line] = check(leaf, cache)
    assert line.startswith(f"{host_tmp / 'state'}, a parent of the state directory {leaf}, may")
    assert "drwxrwx---" in line and f"chmod go-w {host_tmp / 'state'}" in line


@needs_root
def test_a_leaf_or_ancestor_of_another_user_is_refused(host_tmp: Path) -> None:
    leaf, cache = layout(host_tmp)
    os.chown(leaf, 12345, 12345)
    [line] = check(leaf, cache)
    assert line.startswith(f"the state directory {leaf} belongs to another user (owner uid 12345")
    os.chown(leaf, os.getuid(), os.getgid())
    os.chown(host_tmp / "state", 12345, 12345)  # the other user made stateDir first
    os.chown(cache, 12345, 12345)
    found = check(leaf, cache)
    assert found[0].startswith(f"{host_tmp / 'state'}, a parent of the state directory {leaf}, ")
    assert "belongs to another user (owner uid 12345, mode drwx" in found[0]
    assert found[1].startswith(f"model.cacheDir {cache} belongs to another user"), found


def test_the_program_stops_naming_every_host_and_reason() -> None:
    facts = [
        HostFacts("spark1", {}, {}, unsafe=["/srv/s, a parent of ...; fix: a"]),
        HostFacts("spark2", {"x": "t"}, {}),
        HostFacts("spark3", {}, {}, unsafe=["model.cacheDir /hf belongs to ...; fix: b"]),
    ]
    with pytest.raises(pulumi.RunError) as raised:
        refuse_unsafe(facts)
    message = str(raised.value)
    assert message.startswith("spark-vllm: spark1: facts: another local user could change what")
    assert "\n  /srv/s, a parent of ...; fix: a\nspark-vllm: spark3: facts: " in message
    assert "spark2" not in message
    refuse_unsafe(facts[1:2])  # a safe host: nothing raised
    assert parse_facts("h", "spark-vllm-facts 1\nunsafe why; fix: x\n").unsafe == ["why; fix: x"]
