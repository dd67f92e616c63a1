"""host_rules.py's decisions as tables: Kexec HandOver, /dev/shm, logind's RemoveIPC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.program.scripting import load

rules = load("host_rules")

HWE = "7.0.0-1019-nvidia"


@pytest.mark.parametrize(
    ("release", "cmdline", "state", "refused"),
    [
        # The report: a 7.0 HWE kernel booted as installed (KHO on by default).
        (HWE, "BOOT_IMAGE=/vmlinuz root=UUID=x ro quiet splash", "unknown", True),
        # Any 7.0 release, not only the one reported first.
        ("7.0.0-1024-nvidia", "ro quiet", "unknown", True),
        ("7.0.3-generic", "ro", "unknown", True),
        # The fix, in each spelling kstrtobool takes.
        (HWE, "ro quiet kho=off", "unknown", False),
        (HWE, "kho=0 ro", "unknown", False),
        (HWE, "kho=n", "unknown", False),
        # The last kho= wins (early_param parses in order).
        (HWE, "kho=off kho=on", "unknown", True),
        (HWE, "kho=on kho=off", "unknown", False),
        # An unparseable value leaves the earlier one.
        (HWE, "kho=off kho=maybe", "unknown", False),
        # A word that only contains kho= is not it.
        (HWE, "xkho=off", "unknown", True),
        # KHO's interface present: on, whatever the command line says.
        (HWE, "kho=off", "on", True),
        # Other series: not this problem.
        ("6.17.0-1032-nvidia", "ro", "on", False),
        ("7.1.0-1001-nvidia", "ro", "unknown", False),
        ("", "", "unknown", False),
    ],
)  # fmt: skip
def test_kho_on_a_70_kernel_is_refused_unless_booted_with_kho_off(
    release: str, cmdline: str, state: str, refused: bool
) -> None:
    problem = rules.kho_problem(release, cmdline, state)
    assert (problem is not None) == refused
    if refused:
        assert problem.startswith(f"the kernel {release} runs Kexec HandOver")
        assert "ENOMEM" in problem


def test_kho_state_is_read_where_the_kernel_shows_it(tmp_path: Path) -> None:
    assert rules.kho_state(str(tmp_path)) == "unknown"
    (tmp_path / "sys/kernel/debug/kho/out").mkdir(parents=True)
    assert rules.kho_state(str(tmp_path)) == "on"


@pytest.mark.parametrize(
    ("size", "need", "refused"),
    [
        (64 << 20, 1 << 30, True),  # Docker's 64 MiB
        (1 << 30, 1 << 30, False),
        (60 << 30, 2 << 30, False),  # a Spark's stock /dev/shm: half its memory
    ],
)
def test_shm_smaller_than_the_need_is_refused(size: int, need: int, refused: bool) -> None:
    problem = rules.shm_problem(size, need)
    assert (problem is not None) == refused
    if problem:
        assert problem[0].startswith(f"/dev/shm holds {size >> 20} MiB, the servers on this node")
        assert "docker.shmSizeMb" in problem[1]


SPARK_MEMORY = 119 << 30  # a GB10's MemTotal, about


@pytest.mark.parametrize(
    ("use", "fraction", "refused"),
    [
        (5 << 30, 0.8, False),  # the defaults with Ray: 1 GiB and its 4 GiB object store
        (64 << 30, 0.8, True),  # the reports' 64 GB shm_size beside a server at 0.8
        (64 << 30, 0.4, False),  # what 0.4 leaves holds it
        (64 << 30, 0, False),  # auto or several servers: the fraction is decided later
        (int(SPARK_MEMORY * 0.2), 0.8, False),  # exactly what is left
    ],
)
def test_shm_beyond_what_the_servers_leave_of_unified_memory_is_refused(
    use: int, fraction: float, refused: bool
) -> None:
    problem = rules.shm_beside_servers_problem(use, SPARK_MEMORY, fraction)
    assert (problem is not None) == refused
    if problem:
        assert problem[0].startswith(f"the containers may put {use / 2**30:.1f} GiB in /dev/shm")
        assert f"take {fraction:g} of 119.0 GiB, which leaves 23.8 GiB" in problem[0]
        assert "docker.shmSizeMb" in problem[1] and "ray.objectStoreMemoryBytes" in problem[1]


def test_mem_total_is_read_from_meminfo() -> None:
    meminfo = "MemTotal:       124759712 kB\nMemFree:         1000 kB\n"
    assert rules.mem_total_bytes(meminfo) == 124759712 * 1024
    with pytest.raises(ValueError):
        rules.mem_total_bytes("MemFree: 1 kB\n")


@pytest.mark.parametrize(
    ("texts", "removes"),
    [
        ([], True),  # systemd's default
        (["[Login]\n#RemoveIPC=no\n"], True),  # Debian's commented default
        (["[Login]\nRemoveIPC=no\n"], False),
        (["[Login]\nRemoveIPC=no\n", "[Login]\nRemoveIPC=yes\n"], True),  # a drop-in wins
        (["[Other]\nRemoveIPC=no\n"], True),  # not logind's section
        (["[Login]\nRemoveIPC = off\n"], False),
    ],
)  # fmt: skip
def test_remove_ipc_follows_logind_conf_and_its_drop_ins(texts: list[str], removes: bool) -> None:
    assert rules.remove_ipc(texts) is removes


def test_logind_files_are_read_in_logind_order(tmp_path: Path) -> None:
    for path in (
        "etc/systemd/logind.conf",
        "etc/systemd/logind.conf.d/50-a.conf",
        "usr/lib/systemd/logind.conf.d/10-b.conf",
        "usr/lib/systemd/logind.conf.d/50-a.conf",
        "run/systemd/logind.conf.d/20-c.conf",
    ):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    found = [str(Path(p).relative_to(tmp_path)) for p in rules.logind_files(str(tmp_path))]
    assert found == [
        "etc/systemd/logind.conf",
        "usr/lib/systemd/logind.conf.d/10-b.conf",
        "run/systemd/logind.conf.d/20-c.conf",
        "etc/systemd/logind.conf.d/50-a.conf",  # /etc hides /usr/lib's file of the same name
    ]


def test_sys_uid_max_from_login_defs() -> None:
    assert rules.sys_uid_max("") == 999
    assert rules.sys_uid_max("# SYS_UID_MAX 100\nSYS_UID_MAX\t\t499\n") == 499


BASE: dict[str, Any] = {
    "user": "aurora", "user_uid": 1000, "owner_uid": 1000, "system_uid_max": 999,
    "removes_ipc": True, "lingers": False, "rootless": False, "enable_linger": True,
}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "action"),
    [
        # The report: the servers' segments are the SSH user's, RemoveIPC=yes, no linger.
        ({}, "linger"),
        ({"enable_linger": False}, "refuse"),
        # Already lingering, or logind keeps IPC: nothing to do.
        ({"lingers": True}, "ok"),
        ({"removes_ipc": False}, "ok"),
        # The usual image runs as root: the SSH user's logout does not touch root's segments.
        ({"owner_uid": 0}, "ok"),
        # A system user (or root) over SSH: RemoveIPC never applies.
        ({"user_uid": 998, "owner_uid": 998}, "ok"),
        ({"user": "root", "user_uid": 0, "owner_uid": 0}, "ok"),
        # Rootless Docker: its daemon is the user's service, stopped at logout without linger.
        ({"rootless": True, "removes_ipc": False, "owner_uid": 1000}, "linger"),
        ({"rootless": True, "lingers": True}, "ok"),
        ({"rootless": True, "enable_linger": False}, "refuse"),
    ],
)  # fmt: skip
def test_remove_ipc_matters_only_for_the_ssh_users_own_segments(
    change: dict[str, Any], action: str
) -> None:
    assert rules.ipc_decision(**{**BASE, **change})[0] == action


@pytest.mark.parametrize(
    ("image_uid", "rootless", "owner"),
    [(0, False, 0), (1000, False, 1000), (0, True, 1000), (1001, True, 1001)],
)
def test_segments_owner_maps_rootless_dockers_root_to_the_user(
    image_uid: int, rootless: bool, owner: int
) -> None:
    assert rules.segments_owner(image_uid, rootless, 1000) == owner
