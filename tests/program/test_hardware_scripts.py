"""fabric-link.sh and memory-check.sh run for real with bash: the link test over loopback (a
stand-in `ssh` runs the worker's side here), the memory check against this machine's own
/proc/meminfo, with a stand-in docker CLI for this deployment's containers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.program.scripting import SCRIPTS, fake_bin, load, run

GIB = 1 << 30
link_probe = load("link_probe")

# `ssh [options] DEST COMMAND`: the command, run here (the worker is this machine).
FAKE_SSH = """#!/usr/bin/env bash
exec bash -c "${@: -1}"
"""


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


@pytest.mark.parametrize(
    ("gbps", "floor", "below"),
    [
        (150.2, 100, False),  # a healthy link
        (100.0, 100, False),  # at the floor: it passes
        (99.999, 100, True),  # under it, however little
        (0.0, 0.01, True),  # nothing moved
    ],
)
def test_a_link_fails_its_floor_only_below_it(gbps: float, floor: float, below: bool) -> None:
    assert link_probe.below_floor(gbps, floor) is below


# --- memory ------------------------------------------------------------------------------------

# docker: our server runs at --gpu-memory-utilization 0.5 and its container holds 1 GiB.
FAKE_DOCKER = """#!/usr/bin/env bash
case "$1" in
  inspect)
    case "$*" in
      *State.Status*json\\ .Args*)  # the server's state and arguments at once (memory-check.sh)
        [ "${@: -1}" = spark-vllm-vllm ] || exit 1
        echo 'running ["--expect-ips","10.0.0.1,127.0.0.1","--gpu-memory-utilization","0.5"]' ;;
      *State.Status*) [ "${@: -1}" = spark-vllm-vllm ] && echo running || exit 1 ;;
      *json\\ .Args*)
        echo '["--expect-ips","10.0.0.1,127.0.0.1","--gpu-memory-utilization","0.5"]' ;;
      *) exit 1 ;;
    esac ;;
  stats) echo "1GiB / 100GiB" ;;
  *) exit 1 ;;
esac
"""


# A node with 100 GiB, 40 GiB of it available (30 GiB free, the rest page cache).
MEMINFO = "MemTotal: 104857600 kB\nMemFree: 31457280 kB\nMemAvailable: 41943040 kB\n"
TOTAL, AVAILABLE = 100 * GIB, 40 * GIB


def memory(
    tmp_path: Path,
    utilization: str,
    docker: str | None = None,
    fabric_ip: str = "127.0.0.1",
    bin_dir: Path = SCRIPTS,
    kv_cache: dict[str, str] | None = None,
    shares: list[str] | None = None,
) -> tuple[int, str, str]:
    if shares is not None:  # the fleet's shares beside the scripts: a header, a server a line
        bin_dir = tmp_path / "state" / "bin"
        shutil.copytree(SCRIPTS, bin_dir, dirs_exist_ok=True)
        (tmp_path / "state" / "front").mkdir(exist_ok=True)
        lines = ["spark-vllm-shares 0.05 0.05", *shares]
        (tmp_path / "state" / "front" / "shares").write_text("".join(f"{x}\n" for x in lines))
    nodes = f"spark1|-|{bin_dir}|spark-vllm-ray-head,spark-vllm-vllm|{fabric_ip}"
    flags = {
        "nodes": nodes, "image": "sha256:" + "a" * 64, "gpus": "no", "drop-page-cache": "no",
        "utilization": utilization, "margin-fraction": "0.05", "min-margin-bytes": str(1 << 30),
        "server-container": "spark-vllm-vllm", **(kv_cache or {}),
    }  # fmt: skip
    args = [word for key, value in flags.items() for word in (f"--{key}", value)]
    env = fake_bin(tmp_path, docker=docker or "#!/usr/bin/env bash\nexit 1\n")
    (tmp_path / "meminfo").write_text(MEMINFO)
    env["SPARK_VLLM_MEMINFO"] = str(tmp_path / "meminfo")
    done = subprocess.run(
        ["bash", str(bin_dir / "memory-check.sh"), "--host", "spark1", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def sizing(out: str) -> dict[str, object]:
    return dict(json.loads(out.strip().splitlines()[-1].removeprefix("spark-vllm-memory-sizing ")))


def test_auto_derives_the_fraction_from_what_is_free_less_the_margin(tmp_path: Path) -> None:
    status, out, err = memory(tmp_path, "auto")
    assert status == 0, err
    # 40 GiB available of 100, less the margin (5% of 100 GiB): 0.35.
    assert sizing(out) == {
        "gpuMemoryUtilization": "0.35",
        "mode": "auto",
        "kept": False,
        "nodes": {"spark1": {"totalGib": 100.0, "freeGib": 40.0, "fits": 0.4, "basis": "meminfo"}},
    }
    assert "memory on spark1: 40.0 GiB free of 100.0 GiB (meminfo; MemFree 30.0 GiB, " in err


def test_a_fraction_that_does_not_fit_names_the_highest_that_does(tmp_path: Path) -> None:
    status, _, err = memory(tmp_path, "0.5")
    assert status == 1
    first, second = err.strip().splitlines()[-2:]
    assert first == (
        "spark-vllm: spark1: memory-check: vllm.gpuMemoryUtilization 0.5 does not fit: spark1: "
        "0.50 x 100.0 GiB = 50.0 GiB asked, 40.0 GiB free (meminfo); the highest value that fits "
        "every node is 0.40 (auto would choose 0.35, with its safety margin)"
    )
    assert "lower vllm.gpuMemoryUtilization or set it to auto" in second
    assert memory(tmp_path, "0.4")[0] == 0


def test_a_running_server_gives_back_what_it_asked_for(tmp_path: Path) -> None:
    """Our own server at 0.5 holds half the memory (GPU allocations need not show in its
    cgroup): a restart gives it back there, on the nodes it runs on only (its --expect-ips),
    besides the 1 GiB its containers' cgroups hold (the stand-in docker says so)."""
    status, out, err = memory(tmp_path, "0.9", docker=FAKE_DOCKER)
    assert status == 0, err
    assert sizing(out)["nodes"]["spark1"]["freeGib"] == 90.0  # type: ignore[index]
    status, out, err = memory(tmp_path, "0.05", docker=FAKE_DOCKER, fabric_ip="10.0.0.9")
    assert status == 0, err
    assert sizing(out)["nodes"]["spark1"]["freeGib"] == 41.0  # type: ignore[index]


def test_auto_keeps_a_running_servers_fraction_while_it_fits(tmp_path: Path) -> None:
    """A re-run of the check on a serving stack must not resize the server by a hundredth."""
    status, out, err = memory(tmp_path, "auto", docker=FAKE_DOCKER)
    assert status == 0, err
    result = sizing(out)
    assert (result["gpuMemoryUtilization"], result["kept"]) == ("0.5", True)
    assert "the running server's 0.5 still fits every node (auto allows 0.85): kept" in err


def test_a_node_whose_state_dir_holds_a_space_and_a_quote_is_measured(tmp_path: Path) -> None:
    bin_dir = tmp_path / "state dir's" / "bin"
    shutil.copytree(SCRIPTS, bin_dir)
    status, out, err = memory(tmp_path, "auto", bin_dir=bin_dir)
    assert status == 0, err
    assert sizing(out)["gpuMemoryUtilization"] == "0.35"


def kv_snapshot(tmp_path: Path, weights_gib: int) -> Path:
    """A snapshot of a 16-layer model (2 KV heads of 128, bf16: 8 KiB a token on each of two
    GPUs) with `weights_gib` of (sparse) weights."""
    snap = tmp_path / "snapshot"
    snap.mkdir()
    config = {
        "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 128, "hidden_size": 2048, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (snap / "config.json").write_text(json.dumps(config))
    with (snap / "model.safetensors").open("wb") as handle:
        handle.truncate(weights_gib * GIB)
    return snap


def kv_flags(snap: Path, kv_cache: str) -> dict[str, str]:
    return {
        "kv-cache": kv_cache, "snapshot": str(snap), "tensor-parallel": "2",
        "pipeline-parallel": "1", "max-model-len": "32768", "kv-cache-dtype": "auto",
        "reserve-bytes": str(2 * GIB),
    }  # fmt: skip


def test_kv_cache_auto_takes_what_the_chosen_fraction_leaves_beside_the_weights(
    tmp_path: Path,
) -> None:
    """auto: 0.35 of 100 GiB is the budget; 10 GiB of weights over two GPUs and the 2 GiB
    reserve leave 28 GiB for the cache: the sizing carries it, and says what it holds."""
    status, out, err = memory(
        tmp_path, "auto", kv_cache=kv_flags(kv_snapshot(tmp_path, 10), "auto")
    )
    assert status == 0, err
    kv_cache = sizing(out)["kvCache"]
    assert isinstance(kv_cache, dict)
    assert kv_cache["kvCacheBytes"] == 35 * GIB - 5 * GIB - 2 * GIB
    assert kv_cache["bytesPerToken"] == 16 * 2 * 2 * 128 * 2
    assert "KV cache 28.0 GiB per GPU (auto): " in err


def test_kv_cache_bytes_that_do_not_fit_beside_the_weights_are_refused(tmp_path: Path) -> None:
    snap = kv_snapshot(tmp_path, 10)
    status, _, err = memory(tmp_path, "0.4", kv_cache=kv_flags(snap, str(40 * GIB)))
    assert status == 1
    first, second = err.strip().splitlines()[-2:]
    assert first == (
        "spark-vllm: spark1: memory-check: vllm.kvCache 40.0 GiB does not fit: 40.0 GiB for the "
        "server per node, less 5.0 GiB of weights per GPU and 2.0 GiB for activations and CUDA "
        "graphs leaves 33.0 GiB"
    )
    assert "lower vllm.kvCache or set it to auto" in second
    assert memory(tmp_path, "0.4", kv_cache=kv_flags(snap, str(30 * GIB)))[0] == 0


def test_kv_cache_sizes_the_weights_the_patterns_keep_and_refuses_what_the_head_would_add(
    tmp_path: Path,
) -> None:
    """memory-check.sh passes the model's patterns to the sizing: a shard left in the head's
    cache that `exclude` now names is one vLLM still loads there, the workers lack: refused,
    naming it; what vLLM never loads (original/) changes nothing."""
    snap = kv_snapshot(tmp_path, 10)
    with (snap / "model-extra.safetensors").open("wb") as handle:
        handle.truncate(4 * GIB)
    (snap / "original").mkdir()
    with (snap / "original" / "consolidated.safetensors").open("wb") as handle:
        handle.truncate(10 * GIB)
    flags = {**kv_flags(snap, "auto"), "exclude": '["model-extra.safetensors", "original/*"]'}
    status, _, err = memory(tmp_path, "auto", kv_cache=flags)
    assert status == 1
    assert "vLLM would load model-extra.safetensors from the head's snapshot" in err
    (snap / "model-extra.safetensors").unlink()
    status, out, err = memory(tmp_path, "auto", kv_cache=flags)
    assert status == 0, err
    kv_cache = sizing(out)["kvCache"]
    assert isinstance(kv_cache, dict)
    assert kv_cache["kvCacheBytes"] == 35 * GIB - 5 * GIB - 2 * GIB


# --- memory: an `auto` server before others on its nodes --------------------------------------


def later_docker(running: dict[str, str]) -> str:
    """docker: the later servers named in `running` run at that --gpu-memory-utilization; no
    other container of ours runs."""
    cases = "".join(
        f"""      *{name}) echo 'running ["--gpu-memory-utilization","{share}"]' ;;\n"""
        for name, share in running.items()
    )
    return f"""#!/usr/bin/env bash
[ "$1" = inspect ] || exit 1
case "$*" in
{cases}      *) exit 1 ;;
esac
"""


OWN_SHARE = "chat-a|spark-vllm-vllm|-|auto|spark1"


def later(name: str, share: str, slot: int = 1, nodes: str = "spark1,spark2") -> str:
    return f"{name}|spark-vllm-vllm-s{slot}|-|{share}|{nodes}"


def test_auto_leaves_a_later_fixed_share_free_on_its_nodes(tmp_path: Path) -> None:
    """40 GiB available of 100: the margin (5), and 0.2 + 0.05 beside it for the model that
    starts after this one, leave 0.10; a later model on another node leaves this one all."""
    status, out, err = memory(tmp_path, "auto", shares=[OWN_SHARE, later("chat-b", "0.2")])
    assert status == 0, err
    assert sizing(out)["gpuMemoryUtilization"] == "0.10"
    assert "memory: chat-b (0.2) comes after this server on spark1: not running yet" in err
    status, out, err = memory(
        tmp_path, "auto", shares=[OWN_SHARE, later("chat-b", "0.2", nodes="spark2")]
    )
    assert (status, sizing(out)["gpuMemoryUtilization"]) == (0, "0.35"), err
    # A server before this one in the fleet's order started first: what it holds is not free.
    earlier = later("chat-0", "0.2", slot=3)
    status, out, err = memory(tmp_path, "auto", shares=[earlier, OWN_SHARE])
    assert (status, sizing(out)["gpuMemoryUtilization"]) == (0, "0.35"), err


def test_a_fixed_fraction_leaves_room_for_the_later_models_too(tmp_path: Path) -> None:
    """A fixed server before others is refused when the later ones could not start beside it
    (before anything of it starts), naming them; shares that do not list this server (a
    stack going back to one model) leave nothing."""
    status, _, err = memory(tmp_path, "0.3", shares=[OWN_SHARE, later("chat-b", "0.1")])
    assert status == 1
    assert (
        "spark1: 0.30 x 100.0 GiB = 30.0 GiB asked, 40.0 GiB free (meminfo), 15.0 GiB kept for "
        "chat-b (0.1, not running yet); the highest value that fits every node is 0.25"
    ) in err
    assert memory(tmp_path, "0.25", shares=[OWN_SHARE, later("chat-b", "0.1")])[0] == 0
    assert memory(tmp_path, "0.4", shares=[later("chat-b", "0.1")])[0] == 0


def test_autos_split_what_is_left_in_the_fleets_order(tmp_path: Path) -> None:
    """Two later models: a fixed 0.1 (and its 0.05) and an `auto` one (its 0.05 beside it) keep
    20 GiB; this server and the later `auto` one share the 15 GiB left past the margin."""
    status, out, err = memory(
        tmp_path,
        "auto",
        shares=[OWN_SHARE, later("chat-b", "0.1"), later("chat-c", "auto", slot=2)],
    )
    assert status == 0, err
    assert sizing(out)["gpuMemoryUtilization"] == "0.07"


def test_a_later_server_that_runs_is_not_counted_twice(tmp_path: Path) -> None:
    """A re-run (this server's flags changed): the later server's 0.2 is already out of what is
    free, so nothing more is kept for it; a fraction raised since (0.3 from 0.2) keeps only the
    difference; a running later `auto` one keeps its own and shares nothing."""
    docker = later_docker({"spark-vllm-vllm-s1": "0.2", "spark-vllm-vllm-s2": "0.3"})
    status, out, err = memory(
        tmp_path, "auto", docker=docker, shares=[OWN_SHARE, later("chat-b", "0.2")]
    )
    assert (status, sizing(out)["gpuMemoryUtilization"]) == (0, "0.35"), err
    assert "memory: chat-b (0.2) comes after this server on spark1: running at 0.2" in err
    status, out, err = memory(
        tmp_path, "auto", docker=docker, shares=[OWN_SHARE, later("chat-b", "0.3")]
    )
    assert (status, sizing(out)["gpuMemoryUtilization"]) == (0, "0.25"), err
    status, out, err = memory(
        tmp_path, "auto", docker=docker, shares=[OWN_SHARE, later("chat-c", "auto", slot=2)]
    )
    assert (status, sizing(out)["gpuMemoryUtilization"]) == (0, "0.35"), err


def test_auto_with_no_room_beside_the_later_models_names_them(tmp_path: Path) -> None:
    status, _, err = memory(tmp_path, "auto", shares=[OWN_SHARE, later("chat-b", "0.32")])
    assert status == 1
    first, second = err.strip().splitlines()[-2:]
    assert first == (
        "spark-vllm: spark1: memory-check: vllm.gpuMemoryUtilization auto: too little memory "
        "free for the server: spark1: 40.0 GiB free of 100.0 GiB (margin 5.0 GiB, 37.0 GiB "
        "kept for chat-b (0.32, not running yet))"
    )
    assert "other processes or containers hold the memory" in second
