"""The firewall's gate and step scripts, run for real with bash: the gate starts its command only
on a fresh marker of this boot with these rules, and the step names the host, itself and the
guard's own reason when the rules cannot be applied. (The guard itself needs iptables in a
network namespace of its own: the lab runs it, tests/lab/test_day_two.py and test_e2e.py.)"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

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
