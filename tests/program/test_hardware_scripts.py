"""fabric-link.sh and memory-check.sh run for real with bash: the link test over loopback (a
stand-in `ssh` runs the worker's side here), the memory check against this machine's own
/proc/meminfo, with a stand-in docker CLI for this deployment's containers."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.program.test_scripts import SCRIPTS, run

# `ssh [options] DEST COMMAND`: the command, run here (the worker is this machine).
FAKE_SSH = """#!/usr/bin/env bash
exec bash -c "${@: -1}"
"""


def fake_bin(tmp_path: Path, **tools: str) -> dict[str, str]:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def link(tmp_path: Path, **overrides: str) -> tuple[int, str, str]:
    flags = {
        "worker": "spark2", "target": "ssh://root@127.0.0.1:22", "interface": "lo",
        "worker-interface": "lo", "worker-ip": "127.0.0.1", "worker-bin": str(SCRIPTS),
        "mtu": "any", "min-gbps": "0.01", "seconds": "1",
    }  # fmt: skip
    flags.update(overrides)
    args = [word for key, value in flags.items() for word in (f"--{key}", value)]
    done = run("fabric-link.sh", "--host", "spark1", *args, env=fake_bin(tmp_path, ssh=FAKE_SSH))
    return done.returncode, done.stdout, done.stderr


def test_the_link_test_measures_the_fabric(tmp_path: Path) -> None:
    status, out, err = link(tmp_path)
    assert status == 0, err
    figures = json.loads(out.strip().splitlines()[-1].removeprefix("spark-vllm-fabric-link "))
    assert figures["worker"] == "spark2" and figures["gbps"] > 0.01
    assert figures["mtu"] == int(Path("/sys/class/net/lo/mtu").read_text())


def test_a_link_below_the_floor_is_refused_with_the_measured_figure(tmp_path: Path) -> None:
    status, _, err = link(tmp_path, **{"min-gbps": "100000"})
    assert status == 1
    first, second = err.strip().splitlines()[-2:]
    assert re.match(
        r"spark-vllm: spark1: fabric-link: the fabric from spark1 to spark2 measured [\d.]+ "
        r"Gbit/s \(4 TCP streams, 1 s\), below fabric.minLinkGbps 100000 \(negotiated speed: ",
        first,
    ), first
    assert "a degraded cable or port" in second and "an MTU mismatch" in second


def test_an_unexpected_mtu_is_refused_naming_both_ends(tmp_path: Path) -> None:
    mtu = Path("/sys/class/net/lo/mtu").read_text().strip()
    status, _, err = link(tmp_path, mtu="9000")
    assert status == 1
    assert (
        f"the fabric's MTU is {mtu} on spark1 lo and spark2 lo, fabric.mtu expects 9000" in err
    ), err


def test_without_a_floor_only_the_mtu_is_checked(tmp_path: Path) -> None:
    status, out, err = link(tmp_path, **{"min-gbps": "0"})
    assert status == 0, err
    assert '"gbps":null' in out


# --- memory ------------------------------------------------------------------------------------

# docker: our server runs at --gpu-memory-utilization 0.5 and its container holds 1 GiB.
FAKE_DOCKER = """#!/usr/bin/env bash
case "$1" in
  inspect)
    case "$*" in
      *State.Status*) [ "${@: -1}" = spark-vllm-vllm ] && echo running || exit 1 ;;
      *json\\ .Args*)
        echo '["--expect-ips","10.0.0.1,127.0.0.1","--gpu-memory-utilization","0.5"]' ;;
      *) exit 1 ;;
    esac ;;
  stats) echo "1GiB / 100GiB" ;;
  *) exit 1 ;;
esac
"""


def meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":")
        if name == key:
            return int(value.split()[0]) * 1024
    raise KeyError(key)


def memory(
    tmp_path: Path, utilization: str, docker: str | None = None, fabric_ip: str = "127.0.0.1"
) -> tuple[int, str, str]:
    nodes = f"spark1|-|{SCRIPTS}|spark-vllm-ray-head,spark-vllm-vllm|{fabric_ip}"
    flags = {
        "nodes": nodes, "image-id": "sha256:" + "a" * 64, "gpus": "no", "drop-page-cache": "no",
        "utilization": utilization, "margin-fraction": "0.05", "min-margin-bytes": str(1 << 30),
        "server-container": "spark-vllm-vllm",
    }  # fmt: skip
    args = [word for key, value in flags.items() for word in (f"--{key}", value)]
    env = fake_bin(tmp_path, docker=docker or "#!/usr/bin/env bash\nexit 1\n")
    done = run("memory-check.sh", "--host", "spark1", *args, env=env)
    return done.returncode, done.stdout, done.stderr


def sizing(out: str) -> dict[str, object]:
    return dict(json.loads(out.strip().splitlines()[-1].removeprefix("spark-vllm-memory-sizing ")))


def test_auto_derives_the_fraction_from_what_is_free_less_the_margin(tmp_path: Path) -> None:
    status, out, err = memory(tmp_path, "auto")
    assert status == 0, err
    result = sizing(out)
    total, free = meminfo("MemTotal"), meminfo("MemAvailable")
    margin = max(0.05 * total, 1 << 30)
    chosen = float(str(result["gpuMemoryUtilization"]))
    # Within a hundredth (free memory moves between the script's read and ours).
    assert abs(chosen - int((free - margin) / total * 100) / 100) <= 0.02
    assert result["mode"] == "auto"
    assert result["nodes"] == {"spark1": result["nodes"]["spark1"]}  # type: ignore[index]
    assert "memory on spark1: " in err and "(meminfo; MemFree" in err


def test_a_fraction_that_does_not_fit_names_the_highest_that_does(tmp_path: Path) -> None:
    status, _, err = memory(tmp_path, "0.98")
    total, free = meminfo("MemTotal"), meminfo("MemAvailable")
    if free >= 0.98 * total:
        pytest.skip("this machine has 98% of its memory free")
    assert status == 1
    first, second = err.strip().splitlines()[-2:]
    found = re.search(
        r"memory-check: vllm.gpuMemoryUtilization 0.98 does not fit: spark1: 0.98 x [\d.]+ GiB = "
        r"[\d.]+ GiB asked, [\d.]+ GiB free \(meminfo\); the highest value that fits every node "
        r"is ([\d.]+) \(auto would choose ([\d.]+), with its safety margin\)",
        first,
    )
    assert found, first
    fits, auto = float(found.group(1)), float(found.group(2))
    assert abs(fits - free / total) <= 0.02 and auto < fits
    assert "lower vllm.gpuMemoryUtilization or set it to auto" in second


def test_a_running_server_gives_back_what_it_asked_for(tmp_path: Path) -> None:
    """Our own server at 0.5 holds half the memory (GPU allocations need not show in its
    cgroup): a restart gives it back, so 0.5 more is counted as free."""
    status, out, err = memory(tmp_path, "auto", docker=FAKE_DOCKER)
    assert status == 0, err
    alone = sizing(memory(tmp_path, "auto")[1])
    with_server = sizing(out)
    gained = float(str(with_server["gpuMemoryUtilization"])) - float(
        str(alone["gpuMemoryUtilization"])
    )
    capped = 1 - 0.05 - float(str(alone["gpuMemoryUtilization"]))
    assert abs(gained - min(0.5, capped)) <= 0.03, (alone, with_server)
    # A node the running server does not run on (a host being added) gets back only what our
    # containers' cgroups hold there (the stand-in docker says 1 GiB).
    elsewhere = sizing(memory(tmp_path, "auto", docker=FAKE_DOCKER, fabric_ip="10.0.0.9")[1])
    gained = float(str(elsewhere["gpuMemoryUtilization"])) - float(
        str(alone["gpuMemoryUtilization"])
    )
    assert abs(gained - (1 << 30) / meminfo("MemTotal")) <= 0.02, (alone, elsewhere)
