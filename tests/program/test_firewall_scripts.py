"""The firewall's gate and step scripts, run for real with bash: the gate starts its command only
on a fresh marker of this boot with these rules, and the step names the host, itself and the
guard's own reason when the rules cannot be applied. (The guard itself needs iptables in a
network namespace of its own: the lab runs it, tests/lab/test_day_two.py and test_e2e.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "components" / "scripts"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def gate(marker: Path, digest: str, fresh: int = 60, wait: int = 1) -> subprocess.CompletedProcess:
    """firewall-gate.sh as the containers run it (`bash -c <text> firewall-gate ...`)."""
    text = (SCRIPTS / "firewall-gate.sh").read_text()
    argv = ["bash", "-c", text, "firewall-gate", str(marker), digest, str(fresh), str(wait)]
    return subprocess.run(
        [*argv, "--", "echo", "started"], capture_output=True, text=True, timeout=30
    )


def test_the_gate_starts_on_this_boots_marker_for_these_rules(tmp_path: Path) -> None:
    marker = tmp_path / "applied"
    marker.write_text(f"{BOOT_ID} abc123\n")
    done = gate(marker, "abc123")
    assert done.returncode == 0 and done.stdout.strip() == "started", done.stderr


def test_the_gate_refuses_other_rules_another_boot_a_stale_or_no_marker(tmp_path: Path) -> None:
    marker = tmp_path / "applied"
    (tmp_path / "error").write_text("the host has no ip6tables: install iptables\n")
    stale = time.time() - 600
    cases = {
        "no marker": None,
        "other rules": f"{BOOT_ID} other",
        "another boot": "00000000-0000-0000-0000-000000000000 abc123",
        "stale": f"{BOOT_ID} abc123",
    }
    for case, content in cases.items():
        marker.unlink(missing_ok=True)
        if content is not None:
            marker.write_text(content + "\n")
        if case == "stale":
            os.utime(marker, (stale, stale))
        done = gate(marker, "abc123")
        assert done.returncode == 1 and "started" not in done.stdout, case
        assert "not starting anything that listens" in done.stderr, case
        assert "the host has no ip6tables" in done.stderr, case  # the guard's own reason


def test_the_step_names_the_host_the_step_and_the_guards_reason(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text(
        '#!/bin/sh\ncase "$1" in\n'
        "  inspect) echo running ;;\n"
        "  logs) echo 'spark-vllm firewall: the host has no ip6tables: install iptables' ;;\n"
        "esac\n"
    )
    (fake / "docker").chmod(0o755)
    state = tmp_path / "firewall"
    state.mkdir()
    (state / "error").write_text("the host has no ip6tables: install iptables\n")
    done = subprocess.run(
        ["bash", str(SCRIPTS / "firewall-step.sh"), "wait", "--host", "spark2",
         "--container", "spark-vllm-firewall", "--dir", str(state), "--digest", "abc123",
         "--timeout-seconds", "5"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.count("spark-vllm: spark2: firewall-step: the firewall rules are not in "
                             "place") == 1, done.stderr  # fmt: skip
    assert "the host has no ip6tables" in done.stderr
    assert "likely cause: the host's iptables" in done.stderr
    # With the marker of this boot and these rules, it passes and says what holds.
    (state / "error").unlink()
    (state / "applied").write_text(f"{BOOT_ID} abc123\n")
    done = subprocess.run(
        ["bash", str(SCRIPTS / "firewall-step.sh"), "wait", "--host", "spark2",
         "--container", "spark-vllm-firewall", "--dir", str(state), "--digest", "abc123",
         "--timeout-seconds", "5"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


# A stand-in for `chroot ROOT env VAR=... iptables ...` as the guard runs it: the host's tables
# in a JSON file. At the first `iptables-restore` (the guard writing its chain), it plays a delete
# that runs then (firewall.sh remove: the mark, then the chain down), once.
FAKE_CHROOT = r"""#!/usr/bin/env python3
import json, os, sys
from pathlib import Path

import pytest
args = sys.argv[2:]
if args[0] == "env":
    args = args[1:]
    while "=" in args[0]:
        args = args[1:]
if args[0] in ("sh", "ip"):
    sys.exit(0)
cmd, rest = args[0], [a for a in args[1:]]
if rest[:2] == ["-w", "10"]:
    rest = rest[2:]
path = Path(os.environ["FAKE_TABLES"])
tables = json.loads(path.read_text()) if path.exists() else {}
restore = cmd.endswith("-restore")
cmd = cmd.removesuffix("-restore")
table = tables.setdefault(cmd, {"INPUT": []})
if restore:  # iptables-restore --noflush: the chains it declares, then its rules
    race = Path(os.environ["FAKE_RACE"])
    lines = [line.split() for line in sys.stdin.read().splitlines()]
    if race.exists():
        race.unlink()
        Path(os.environ["FAKE_REMOVED"]).touch()
        for t in tables.values():
            for name in [n for n in t if n.startswith("SPARK-VLLM-")]:
                t.pop(name)
            t["SPARK-VLLM"] = []
    new = json.loads(json.dumps(table))
    for words in lines:
        if words[0].startswith(":"):
            new[words[0][1:]] = []
        elif words[0] == "-A":
            new[words[1]].append(" ".join(words[2:]))
        elif words[0] == "-D":
            if " ".join(words[2:]) not in new[words[1]]:
                sys.exit(1)
            new[words[1]].remove(" ".join(words[2:]))
        elif words[0] == "-I":
            new[words[1]].insert(0, " ".join(words[3:]))
        elif words[0] == "-X":
            if new.get(words[1]):
                sys.exit(1)
            new.pop(words[1], None)
    tables[cmd] = new
    Path(f"{path}.tmp").write_text(json.dumps(tables))
    os.replace(f"{path}.tmp", path)
    sys.exit(0)
op, chain, rule = rest[0], rest[1], " ".join(rest[2:])
status = 0
if op == "-S":
    if chain not in table:
        status = 1
    else:
        print("-P INPUT ACCEPT" if chain == "INPUT" else "-N " + chain)
        for r in table[chain]:
            print(f"-A {chain} {r}")
elif op == "-C":
    status = 0 if rule in table.get(chain, []) else 1
elif op == "-N":
    status = 1 if chain in table else 0
    table.setdefault(chain, [])
elif op == "-F":
    status = 0 if chain in table else 1
    if chain in table:
        table[chain] = []
elif op == "-A":
    status = 0 if chain in table else 1
    table.get(chain, []).append(rule)
elif op == "-D":
    status = 0 if rule in table.get(chain, []) else 1
    if status == 0:
        table[chain].remove(rule)
elif op == "-I":
    table[chain].insert(0, " ".join(rest[3:]))
elif op == "-X":
    status = 0 if table.pop(chain, None) is not None else 1
Path(f"{path}.tmp").write_text(json.dumps(tables))
os.replace(f"{path}.tmp", path)  # whole, for the test reading it meanwhile
sys.exit(status)
"""


def test_a_delete_while_the_guard_applies_leaves_no_chain(tmp_path: Path) -> None:
    """The guard checks for the delete's mark, then applies; a delete that marks and removes in
    between would see the chain come back, and stay once the guard is gone (a destroy in CI
    left it so). The guard looks for the mark again after applying, and takes it down."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "chroot").write_text(FAKE_CHROOT)
    (fake / "chroot").chmod(0o755)
    state, tables = tmp_path / "firewall", tmp_path / "tables.json"
    (tmp_path / "race").touch()
    env = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "FAKE_TABLES": str(tables),
        "FAKE_RACE": str(tmp_path / "race"),
        "FAKE_REMOVED": str(state / "removed"),
    }
    guard = subprocess.Popen(
        ["bash", str(SCRIPTS / "firewall.sh"), "guard", "--chain", "SPARK-VLLM-TEST",
         "--fabric-interface", "fab0", "--tcp-ports", "6379", "--digest", "abc123",
         "--root", "/", "--dir", str(state), "--interval", "1"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90  # generous: each iptables call is a python start here
        while (tmp_path / "race").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        # The pass that raced ends by taking the chain down (without the second look, the
        # chain stays for good: this waits out its deadline and fails).
        while "SPARK-VLLM-TEST" in tables.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        guard.terminate()
        _, err = guard.communicate(timeout=10)
    assert not (tmp_path / "race").exists(), err
    left = tables.read_text()
    assert "SPARK-VLLM-TEST" not in left, (left, err)
    assert not (state / "applied").exists()


def test_the_guard_keeps_a_marker_per_server_and_takes_them_all_down(tmp_path: Path) -> None:
    """With several servers each one's gate reads its own marker (--markers name=digest): all
    are written while the rules hold, and all go when the guard stops."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "chroot").write_text(FAKE_CHROOT)
    (fake / "chroot").chmod(0o755)
    state = tmp_path / "firewall"
    env = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "FAKE_TABLES": str(tmp_path / "tables.json"),
        "FAKE_RACE": str(tmp_path / "no-race"),
        "FAKE_REMOVED": str(state / "removed"),
    }
    guard = subprocess.Popen(
        ["bash", str(SCRIPTS / "firewall.sh"), "guard", "--chain", "SPARK-VLLM-TEST",
         "--fabric-interface", "fab0", "--tcp-ports", "29501,29534", "--digest", "d0",
         "--markers", "applied-s1=d1,applied-s2=d2",
         "--root", "/", "--dir", str(state), "--interval", "1"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    markers = {name: state / name for name in ("applied", "applied-s1", "applied-s2")}
    try:
        deadline = time.monotonic() + 90
        while not all(m.exists() for m in markers.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        held = {name: m.read_text().split() for name, m in markers.items() if m.exists()}
    finally:
        guard.terminate()
        _, err = guard.communicate(timeout=10)
    assert {name: words[1] for name, words in held.items()} == {
        "applied": "d0",
        "applied-s1": "d1",
        "applied-s2": "d2",
    }, err
    assert all(words[0] == BOOT_ID for words in held.values())
    assert not any(m.exists() for m in markers.values())


def exporter_gate(shell: list[str], marker: Path, fresh: int = 60) -> subprocess.CompletedProcess:
    """exporter-gate.sh as node_exporter's container runs it (`sh -c <text> exporter-gate ...`)."""
    text = (SCRIPTS / "exporter-gate.sh").read_text()
    argv = [*shell, "-c", text, "exporter-gate", str(marker), str(fresh), "1"]
    return subprocess.run(
        [*argv, "--", "echo", "started"], capture_output=True, text=True, timeout=30
    )


SHELLS = [["dash"], ["busybox", "sh"]]  # Debian's sh; node_exporter's image's (busybox)


@pytest.mark.parametrize("shell", SHELLS, ids=["dash", "busybox"])
def test_the_exporter_gate_waits_for_any_rules_of_this_boot_in_plain_sh(
    tmp_path: Path, shell: list[str]
) -> None:
    """node_exporter's image has no bash: its gate is POSIX sh, and starts it on any marker of
    this boot (every version of the rules drops the fabric's addresses off the management
    network), never on another boot's, a stale one, or none."""
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed (lab/install-deps.sh installs busybox-static)")
    marker = tmp_path / "applied"
    marker.write_text(f"{BOOT_ID} any-digest\n")
    done = exporter_gate(shell, marker)
    assert done.returncode == 0 and done.stdout.strip() == "started", done.stderr
    stale = time.time() - 600
    for content in (None, "00000000-0000-0000-0000-000000000000 d", f"{BOOT_ID} d"):
        marker.unlink(missing_ok=True)
        if content is not None:
            marker.write_text(content + "\n")
            if content.startswith(BOOT_ID):
                os.utime(marker, (stale, stale))
        done = exporter_gate(shell, marker)
        assert done.returncode == 1 and "started" not in done.stdout, content
        assert "firewall rules are not in place after 1s" in done.stderr, content
