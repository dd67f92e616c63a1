"""The step scripts that run on hosts, exercised for real with bash on this machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from components.bundle import facts_script
from components.facts import parse_facts
from stacks.plan.known_bad import SHIPPED, entries_flag
from tests.program.scripting import SCRIPTS, fake_bin, fake_docker_path, load, run

COMMIT = "a" * 40


def test_the_repositorys_own_shell_is_shellcheck_clean() -> None:
    """The set-up and build scripts, and the lab plugins' launchers (tests/lab/plugins/bin)."""
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("shellcheck is not installed (.ci/run installs it)")
        pytest.skip("shellcheck is not installed")
    repo = SCRIPTS.parents[1]
    files = [
        *sorted((repo / "scripts").glob("*.sh")),
        *sorted((repo / "tests/lab/plugins/bin").iterdir()),
    ]
    done = subprocess.run(["shellcheck", "-s", "bash", *map(str, files)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert len(files) >= 5 and done.returncode == 0, done.stdout


def test_scripts_are_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("shellcheck is not installed (.ci/run installs it)")
        pytest.skip("shellcheck is not installed")
    scripts = sorted(str(p) for p in SCRIPTS.glob("*.sh"))
    done = subprocess.run(["shellcheck", "-x", "-s", "bash", *scripts], cwd=SCRIPTS,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout


# --- hostlib: what the Python host scripts share with lib.sh ---------------------------------


def lib_sh(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`body` run by a step script that sources lib.sh, named `some-step`, with `args`."""
    script = tmp_path / "some-step.sh"
    script.write_text(f". {SCRIPTS / 'lib.sh'}\n{body}\n")
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        # Spaced and `=` forms, a value with a space, a `|` and a leading `--`.
        ["--image-id", "sha256:1", "--relay=a|b|c", "--worker-bin", "/x y", "--x", "--y"],
        # The last of a repeated flag wins; an empty value is a value.
        ["--host", "a", "--host", "b", "--empty", ""],
    ],
)
def test_hostlib_reads_flags_as_lib_sh_does(tmp_path: Path, argv: list[str]) -> None:
    flags = load("hostlib").parse_flags(argv)
    names = " ".join(f"ARG_{key.upper()}" for key in flags)
    shown = lib_sh(tmp_path, f'parse_flags "$@"; for v in {names}; do echo "${{!v}}"; done', *argv)
    assert shown.stdout.splitlines() == list(flags.values()), shown.stderr


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["--dangling"], "flag --dangling has no value"),
        (["stray"], "unexpected argument 'stray'"),
    ],
)
def test_hostlib_refuses_what_lib_sh_refuses_in_its_words(
    tmp_path: Path, argv: list[str], what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hostlib = load("hostlib")
    with pytest.raises(hostlib.StepFailed) as refused:
        hostlib.parse_flags(argv)
    hostlib.fail("spark1", "some-step", refused.value)
    in_python = capsys.readouterr().err
    in_bash = lib_sh(tmp_path, 'ARG_HOST=spark1 parse_flags "$@"', *argv).stderr
    assert (
        in_python
        == in_bash
        == (f"spark-vllm: spark1: some-step: {what}\n  likely cause: {hostlib.BUG}\n")
    )


def test_hostlib_runs_a_step_to_one_failure_message(capsys: pytest.CaptureFixture[str]) -> None:
    hostlib = load("hostlib")

    def broken(flags: dict[str, str]) -> None:
        hostlib.require(flags, "host", "target")

    assert hostlib.run_step("some-step", ["--host", "spark1"], broken) == 1
    assert capsys.readouterr().err == (
        f"spark-vllm: spark1: some-step: missing --target\n  likely cause: {hostlib.BUG}\n"
    )

    def crashing(flags: dict[str, str]) -> None:
        raise KeyError("x")

    assert hostlib.run_step("some-step", ["--host", "spark1"], crashing) == 1
    said = capsys.readouterr().err
    assert (
        said.startswith("spark-vllm: spark1: some-step: KeyError: 'x'\n")
        and "Traceback" not in said
    )


# --- hf-manifest ------------------------------------------------------------------------------


def make_snapshot(cache: Path, files: dict[str, bytes], model: str = "org/tiny") -> Path:
    repo = cache / "hub" / f"models--{model.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for index, (name, data) in enumerate(files.items()):
        blob = repo / "blobs" / f"blob{index}"
        blob.write_bytes(data)
        (snapshot / name).symlink_to(f"../../blobs/blob{index}")
    return snapshot


def manifest(cache: Path, revision: str = "main") -> subprocess.CompletedProcess[str]:
    return run("hf-manifest.sh", "--host", "node1", "--cache-dir", str(cache),
               "--model", "org/tiny", "--revision", revision)  # fmt: skip


def test_manifest_counts_files_and_bytes_through_symlinks(tmp_path: Path) -> None:
    make_snapshot(tmp_path, {"config.json": b"{}", "model.safetensors": b"x" * 1000})
    done = manifest(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{COMMIT} 2 1002"
    assert manifest(tmp_path, COMMIT).stdout == done.stdout


def test_manifest_rejects_dangling_links(tmp_path: Path) -> None:
    snapshot = make_snapshot(tmp_path, {"config.json": b"{}", "model.safetensors": b"x"})
    (snapshot.parents[1] / "blobs" / "blob1").unlink()
    done = manifest(tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith(f"spark-vllm: node1: hf-manifest: snapshot {COMMIT} of org/tiny")
    assert "dangling links" in done.stderr and "likely cause: an interrupted" in done.stderr


@pytest.mark.parametrize("planted", ["../../../elsewhere", f"{COMMIT}/../x", COMMIT.upper(), ""])
def test_manifest_refuses_a_refs_file_that_is_no_commit(tmp_path: Path, planted: str) -> None:
    """refs/<revision> would be joined to snapshots/ as is: a planted `../..` names another
    directory, which would then be counted, recorded and copied as the model's snapshot."""
    snapshot = make_snapshot(tmp_path, {"config.json": b"{}", "model.safetensors": b"x"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.safetensors").write_bytes(b"not the model")
    ref = snapshot.parents[1] / "refs" / "main"
    ref.write_text(planted)
    done = manifest(tmp_path)
    assert done.returncode == 1
    assert f"hf-manifest: {ref} holds '{planted}', not a commit" in done.stderr
    assert "likely cause: something other than the hub client wrote the refs file" in done.stderr


def test_manifest_names_a_missing_snapshot(tmp_path: Path) -> None:
    done = manifest(tmp_path)
    assert done.returncode == 1
    assert "no snapshot of org/tiny@main" in done.stderr
    assert "likely cause: the weights were never fetched or copied to this host" in done.stderr


# --- fabric trust -----------------------------------------------------------------------------

MARKER = "spark-vllm-fabric:spark-vllm/dev:spark1"
HEAD_KEY = f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHeadKey {MARKER}"


def test_authorizing_the_head_key_is_idempotent_and_reversible(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    auth = tmp_path / ".ssh" / "authorized_keys"
    auth.parent.mkdir()
    auth.write_text("ssh-ed25519 AAAAoperator operator@laptop\n")
    for _ in range(2):
        run("authorize-key.sh", "add", "--host", "w", "--marker", MARKER, "--from", "10.0.0.1",
            stdin=HEAD_KEY + "\n", env=env, check=True)  # fmt: skip
    assert auth.read_text() == (
        f'ssh-ed25519 AAAAoperator operator@laptop\nfrom="10.0.0.1" {HEAD_KEY}\n'
    )
    assert oct(auth.stat().st_mode & 0o777) == "0o600"
    run("authorize-key.sh", "remove", "--host", "w", "--marker", MARKER, env=env, check=True)
    assert auth.read_text() == "ssh-ed25519 AAAAoperator operator@laptop\n"


def test_pinning_replaces_the_entry_for_that_address_only(tmp_path: Path) -> None:
    known = tmp_path / "fabric_known_hosts"
    known.write_text("10.0.0.9 ssh-ed25519 AAAAother\n10.0.0.2 ssh-rsa AAAAold\n")
    flags = ["--host", "h", "--state-dir", str(tmp_path), "--address", "10.0.0.2"]
    run("pin-host-key.sh", "add", *flags, "--key", "ssh-ed25519 AAAAnew", check=True)
    assert known.read_text() == "10.0.0.9 ssh-ed25519 AAAAother\n10.0.0.2 ssh-ed25519 AAAAnew\n"
    run("pin-host-key.sh", "add", *flags, stdin="ssh-ed25519 AAAAfromstdin root@w\n", check=True)
    assert known.read_text().endswith("10.0.0.2 ssh-ed25519 AAAAfromstdin\n")
    run("pin-host-key.sh", "remove", *flags, check=True)
    assert known.read_text() == "10.0.0.9 ssh-ed25519 AAAAother\n"


def test_pinning_without_any_key_fails_clearly(tmp_path: Path) -> None:
    done = run("pin-host-key.sh", "add", "--host", "h", "--state-dir", str(tmp_path),
               "--address", "10.0.0.2")  # fmt: skip
    assert done.returncode == 1 and "no host key to pin for 10.0.0.2" in done.stderr


def test_the_api_key_file_is_private_and_never_echoed(tmp_path: Path) -> None:
    target = tmp_path / "state" / "api-key"
    done = run("api-key-file.sh", "write", "--host", "h", "--file", str(target),
               stdin="sk-secret\n", check=True)  # fmt: skip
    assert target.read_text() == "sk-secret"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert "sk-secret" not in done.stdout + done.stderr
    run("api-key-file.sh", "remove", "--host", "h", "--file", str(target), check=True)
    assert not target.exists()


def test_the_fronts_pattern_file_is_not_beside_the_servers_key(tmp_path: Path) -> None:
    """The server's container mounts the key's directory: the front's `bearer` goes to the
    front's own, and what earlier versions left beside the key (the bearer, the named keys'
    maps, Grafana's password derived from the key) is removed."""
    target = tmp_path / "state" / "secrets" / "api-key"
    bearer = tmp_path / "state" / "front-secrets" / "bearer"
    target.parent.mkdir(parents=True)
    for left in ("bearer", "keys.map", "upstream.map", "grafana-admin"):
        (target.parent / left).write_text("left by an earlier version\n")
    flags = ["--host", "h", "--file", str(target), "--bearer", str(bearer)]
    run("api-key-file.sh", "write", *flags, stdin="sk-secret\n", check=True)
    assert sorted(p.name for p in target.parent.iterdir()) == ["api-key"]
    assert bearer.read_text() == "Bearer sk-secret\n"
    assert oct(bearer.stat().st_mode & 0o777) == "0o600"
    assert oct(bearer.parent.stat().st_mode & 0o777) == "0o700"
    run("api-key-file.sh", "remove", *flags, check=True)
    assert not target.parent.exists() and not bearer.parent.exists()


# --- preflight, with a stand-in docker CLI (the lab runs it against a real daemon) ---------------

FAKE_DOCKER = """#!/usr/bin/env bash
case "$1" in
  version) echo 28.2.2 ;;
  info) echo "runc nvidia " ;;
  inspect) [ -n "${FAKE_STALE:-}" ] && [ "${@: -1}" = "$FAKE_STALE" ] && { echo ""; exit 0; }
           exit 1 ;;
  stats) echo "embeddings 60GiB / 119GiB" ;;
  *) exit 1 ;;
esac
"""


def preflight(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": fake_docker_path(tmp_path, FAKE_DOCKER)}
    env.update({k: v for k, v in overrides.items() if k.isupper()})
    flags = {
        "role": "head", "fabric-interface": "lo", "fabric-ip": "127.0.0.1",
        "head-fabric-ip": "127.0.0.1", "ports": "", "min-free-memory-bytes": "1",
        "memory-fraction": "0", "min-free-disk-bytes": "1", "disk-paths": str(tmp_path),
        "require-gpus": "0", "require-nvidia-runtime": "yes",
        "container-names": "spark-vllm-ray-head,spark-vllm-vllm", "deployment": "spark-vllm/dev",
        "rdma-hcas": "", "known-bad": entries_flag(SHIPPED),
        "allow-known-bad": "no", "guarded": "", "cluster-fabric-ips": "127.0.0.1",
        "shared-fabric": "no", "min-shm-bytes": "1", "shm-use-bytes": "1",
    }  # fmt: skip
    flags.update({k: v for k, v in overrides.items() if not k.isupper()})
    args = [word for key, value in flags.items() for word in (f"--{key}", value)]
    return run("preflight.sh", "--host", "spark1", *args, env=env)


def test_preflight_refuses_shared_memory_beyond_what_the_servers_leave(tmp_path: Path) -> None:
    """On unified memory, /dev/shm is the GPU's memory too: what the containers may put there
    is held to what the servers' fraction leaves of this machine's MemTotal."""
    total = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    fits = preflight(tmp_path, **{"memory-fraction": "0.05", "shm-use-bytes": str(total // 2)})
    assert fits.returncode == 0, fits.stderr
    done = preflight(tmp_path, **{"memory-fraction": "0.05", "shm-use-bytes": str(total)})
    assert done.returncode != 0
    assert "preflight: the containers may put" in done.stderr
    assert "servers take 0.05 of" in done.stderr and "docker.shmSizeMb" in done.stderr


LISTENER = """
import ctypes, socket, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)  # PR_SET_NAME: what ss shows
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


@pytest.fixture
def listener() -> Iterator[Callable[[str], int]]:
    """listener(NAME): a process named NAME listening on a free port of loopback; its port."""
    started: list[subprocess.Popen[str]] = []

    def start(name: str) -> int:
        process = subprocess.Popen(["python3", "-c", LISTENER, name], stdout=subprocess.PIPE,
                                   text=True)  # fmt: skip
        started.append(process)
        assert process.stdout is not None
        return int(process.stdout.readline())

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_preflight_refuses_a_guarded_range_over_a_port_in_use(
    tmp_path: Path, listener: Callable[[str], int]
) -> None:
    """The firewall would cut whatever listens in its ranges off the management network: a
    port in use there (not by this stack's containers) is refused, naming who holds it."""
    port = listener("someservice")
    done = preflight(tmp_path, guarded=f"6379,{port - 5}:{port + 5}")
    assert done.returncode == 1
    assert f"port {port} is already in use by someservice (pid " in done.stderr, done.stderr
    assert "a range in the config covers a port in use" in done.stderr
    assert preflight(tmp_path, guarded=f"{port + 1}:{port + 9}").returncode == 0


def test_preflight_refuses_a_guarded_range_over_sshd_or_this_session(
    tmp_path: Path, listener: Callable[[str], int]
) -> None:
    """The last line before a lock-out: an sshd the config did not know of (a second port, a
    console's), or the port this very session came in on, inside what the guard drops."""
    port = listener("sshd")
    done = preflight(tmp_path, guarded=f"{port - 1}:{port + 1}")
    assert done.returncode == 1
    assert f"sshd listens on port {port}, which the firewall would drop" in done.stderr
    assert "the firewall would cut SSH for good" in done.stderr
    session = "10.0.0.5 50000 10.0.0.1 2222"
    done = preflight(tmp_path, guarded="2000:3000", SSH_CONNECTION=session)
    assert done.returncode == 1
    assert "this SSH session arrived on port 2222, which the firewall would drop" in done.stderr


def test_preflight_refuses_ssh_from_outside_the_cluster_through_the_fabric(tmp_path: Path) -> None:
    """SSH from a machine that is not a cluster node arriving through the fabric interface: the
    fabric is the management network, and the firewall admits all of it."""
    outsider = {"SSH_CONNECTION": "127.0.0.5 50000 127.0.0.1 22"}
    done = preflight(tmp_path, **outsider)
    assert done.returncode == 1
    assert "this SSH session (from 127.0.0.5) reaches the host through its fabric interface lo" in (
        done.stderr
    )
    assert "fabric.sharedWithManagement: true" in done.stderr
    assert preflight(tmp_path, **outsider, **{"shared-fabric": "yes"}).returncode == 0
    # A cluster node (the jump topology's head) on the fabric is no outsider.
    member = {"cluster-fabric-ips": "127.0.0.1,127.0.0.5"}
    assert preflight(tmp_path, **outsider, **member).returncode == 0


def test_preflight_reports_facts_when_the_host_is_ready(tmp_path: Path) -> None:
    done = preflight(tmp_path)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["host"] == "spark1" and facts["docker"] == "28.2.2"
    assert facts["memAvailableBytes"] > 0 and facts["diskFreeBytes"] > 0


@pytest.mark.parametrize(
    ("overrides", "message", "cause"),
    [
        ({"fabric-ip": "10.9.9.9"}, "the fabric interface lo has 127.0.0.1, not 10.9.9.9",
         "hosts[].fabricIp is wrong for this host"),
        ({"fabric-interface": "enp9s9"}, "the fabric interface enp9s9 does not exist",
         "hosts[].fabricInterface is wrong"),
        ({"memory-fraction": "2"}, "MiB of memory free", "an embeddings server?"),
        ({"min-free-disk-bytes": str(1 << 60)}, "GiB free under", "the disk is full"),
        ({"FAKE_STALE": "spark-vllm-vllm"},
         "a container named spark-vllm-vllm already exists", "docker rm -f spark-vllm-vllm"),
        ({"require-gpus": "1", "PATH_HIDE_NVIDIA": "1"}, "nvidia-smi is not installed",
         "the NVIDIA driver is missing"),
    ],
)  # fmt: skip
def test_preflight_names_the_failed_requirement(
    tmp_path: Path, overrides: dict[str, str], message: str, cause: str
) -> None:
    overrides = {k: v for k, v in overrides.items() if k != "PATH_HIDE_NVIDIA"}
    done = preflight(tmp_path, **overrides)
    assert done.returncode == 1
    first, second = done.stderr.strip().splitlines()[-2:]
    assert first.startswith("spark-vllm: spark1: preflight: ") and message in first
    assert second.startswith("  likely cause: ") and cause in second


KERNEL = Path("/proc/sys/kernel/osrelease").read_text().strip()


def test_preflight_reads_the_kernel_and_the_fabric_mtu(tmp_path: Path) -> None:
    facts = json.loads(preflight(tmp_path).stdout)
    assert facts["kernel"] == KERNEL and facts["knownBad"] == ""
    assert facts["fabricMtu"] == int(Path("/sys/class/net/lo/mtu").read_text())


@pytest.mark.parametrize("pattern", [KERNEL, KERNEL.split("-")[0] + "*"])
def test_preflight_refuses_a_known_bad_kernel(tmp_path: Path, pattern: str) -> None:
    entry = f"driver|999.1|not this one|;kernel|{pattern}|NCCL ENOMEM at init|example/repo#1"
    done = preflight(tmp_path, **{"known-bad": entry})
    assert done.returncode == 1
    first, second = done.stderr.strip().splitlines()[-2:]
    assert first == (
        f"spark-vllm: spark1: preflight: the kernel {KERNEL} is known to break this workload: "
        "NCCL ENOMEM at init (example/repo#1)"
    )
    assert "boot a kernel release not on the list" in second
    assert "preflight.allowKnownBad: true" in second


def test_an_allowed_known_bad_kernel_is_reported_in_the_facts(tmp_path: Path) -> None:
    done = preflight(tmp_path, **{"known-bad": f"kernel|{KERNEL}|bad|", "allow-known-bad": "yes"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["knownBad"] == (
        f"the kernel {KERNEL} is known to break this workload: bad"
    )


def fake_kernel(root: Path, release: str, cmdline: str, kho: bool = False) -> dict[str, str]:
    """A /proc (and /sys) with `release` booted with `cmdline`; KHO's debugfs when `kho`."""
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(f"{release}\n")
    (root / "proc/cmdline").write_text(f"{cmdline}\n")
    if kho:
        (root / "sys/kernel/debug/kho/out").mkdir(parents=True)
    return {"SPARK_VLLM_ROOT": str(root)}


@pytest.mark.parametrize(
    ("release", "cmdline", "kho", "refused"),
    [
        ("7.0.0-1019-nvidia", "BOOT_IMAGE=/vmlinuz ro quiet splash", False, True),
        ("7.0.0-1031-nvidia", "ro quiet splash", False, True),  # any 7.0 release
        ("7.0.0-1031-nvidia", "ro quiet splash kho=off", False, False),
        ("7.0.0-1031-nvidia", "ro kho=off", True, True),  # KHO's interface says it is on
        ("6.17.0-1032-nvidia", "ro quiet splash", False, False),
    ],
)  # fmt: skip
def test_preflight_refuses_kexec_handover_on_a_70_kernel(
    tmp_path: Path, release: str, cmdline: str, kho: bool, refused: bool
) -> None:
    done = preflight(tmp_path, **fake_kernel(tmp_path / "root", release, cmdline, kho))
    assert done.returncode == (1 if refused else 0), done.stderr
    if refused:
        first, second = done.stderr.strip().splitlines()[-2:]
        assert first.startswith(
            f"spark-vllm: spark1: preflight: the kernel {release} runs Kexec HandOver"
        )
        assert "add kho=off to GRUB_CMDLINE_LINUX_DEFAULT" in second and "update-grub" in second
    else:
        assert json.loads(done.stdout)["kernel"] == release


def test_an_allowed_kexec_handover_is_reported_in_the_facts(tmp_path: Path) -> None:
    fake = fake_kernel(tmp_path / "root", "7.0.0-1019-nvidia", "ro quiet")
    done = preflight(tmp_path, **fake, **{"allow-known-bad": "yes"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["knownBad"].startswith(
        "the kernel 7.0.0-1019-nvidia runs Kexec HandOver (booted without kho=off)"
    )


def test_preflight_refuses_a_dev_shm_smaller_than_the_containers_need(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    done = preflight(tmp_path, SPARK_VLLM_SHM=str(shm), **{"min-shm-bytes": str(1 << 60)})
    assert done.returncode == 1
    first, second = done.stderr.strip().splitlines()[-2:]
    assert first.startswith("spark-vllm: spark1: preflight: /dev/shm holds ")
    assert "the servers on this node need 1099511627776 MiB" in first and "--ipc=host" in first
    assert "docker.shmSizeMb" in second
    assert preflight(tmp_path, SPARK_VLLM_SHM=str(shm)).returncode == 0


def fake_hca(root: Path, name: str, *states: str) -> None:
    for port, state in enumerate(states, start=1):
        port_dir = root / "class" / "infiniband" / name / "ports" / str(port)
        port_dir.mkdir(parents=True)
        (port_dir / "state").write_text(f"{state}\n")


@pytest.mark.parametrize(
    ("hcas", "message", "cause"),
    [
        ("rocep9s0", "the RDMA device rocep9s0 does not exist (devices: roceP2p1s0f1 rocep1s0f1)",
         "hosts[].rdmaHcas is wrong for this host"),
        ("rocep1s0f1,roceP2p1s0f1", "the RDMA device roceP2p1s0f1 has no active port (1: DOWN)",
         "the RoCE link is down"),
    ],
)  # fmt: skip
def test_preflight_checks_each_rdma_device_and_its_port(
    tmp_path: Path, hcas: str, message: str, cause: str
) -> None:
    sysfs = tmp_path / "sys"
    fake_hca(sysfs, "rocep1s0f1", "1: DOWN", "4: ACTIVE")
    fake_hca(sysfs, "roceP2p1s0f1", "1: DOWN")
    done = preflight(tmp_path, **{"rdma-hcas": hcas, "SPARK_VLLM_SYSFS": str(sysfs)})
    assert done.returncode == 1
    first, second = done.stderr.strip().splitlines()[-2:]
    assert first == f"spark-vllm: spark1: preflight: {message}"
    assert cause in second
    healthy = preflight(tmp_path, **{"rdma-hcas": "rocep1s0f1", "SPARK_VLLM_SYSFS": str(sysfs)})
    assert healthy.returncode == 0, healthy.stderr


def test_preflight_finds_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = preflight(tmp_path, ports=str(port))
    assert done.returncode == 1
    assert f"port {port} is already in use" in done.stderr


# --- probes -----------------------------------------------------------------------------------


def test_ray_verdicts() -> None:
    verdict = load("ray_probe").verdict
    expected = {"10.0.0.1", "10.0.0.2"}
    assert verdict({"10.0.0.1": 1, "10.0.0.2": 1}, expected, 2).startswith("ready")
    assert verdict({"10.0.0.1": 1}, expected, 2) == "waiting missing=10.0.0.2 gpus=1/2"
    assert verdict({"10.0.0.1": 1, "192.168.1.5": 1}, expected, 2) == "stray 192.168.1.5"
    # Every configured node is there: the extra one is a host removed from the stack.
    assert verdict({"10.0.0.1": 1, "10.0.0.2": 1, "10.0.0.3": 1}, expected, 2) == "leaving 10.0.0.3"
    assert verdict({"10.0.0.1": 1, "10.0.0.2": 0}, expected, 2).startswith("waiting")


class StubVllm(BaseHTTPRequestHandler):
    models: ClassVar[list[str]] = []
    tokens = 1

    def do_GET(self) -> None:
        if self.path == "/health":
            self.reply(200, {})
        elif self.headers.get("Authorization") != "Bearer key":
            self.reply(401, {"error": "unauthorized"})
        else:
            self.reply(200, {"data": [{"id": m} for m in self.models]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply(200, {"choices": [{"text": " hi"}], "usage": {"completion_tokens": self.tokens}})

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_vllm_readiness_needs_the_model_listed_and_a_real_token() -> None:
    probe = load("vllm_probe").probe
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubVllm)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        StubVllm.models = []
        assert probe(port, "qwen", "key").startswith("waiting /v1/models=200 lists []")
        assert probe(port, "qwen", "wrong").startswith("unauthorized")
        StubVllm.models, StubVllm.tokens = ["qwen"], 0
        assert probe(port, "qwen", "key") == "waiting completion returned no tokens"
        StubVllm.tokens = 1
        assert probe(port, "qwen", "key") == 'ready " hi"'
    finally:
        server.shutdown()
    assert probe(port, "qwen", "key").startswith(f"starting port {port} not answering")


def test_the_probes_never_send_the_key_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The readiness probe runs in the server's container, whose environment (the image's, or
    vllm.env) may name an HTTP proxy: urllib would hand it the request, key and all. The host
    scripts that ask local HTTP servers (the supervisor's health check, monitoring's waits)
    likewise go direct."""
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(8)
    proxy.settimeout(0.2)
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.getsockname()[1]}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubVllm)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        StubVllm.models, StubVllm.tokens = ["qwen"], 1
        assert load("vllm_probe").probe(port, "qwen", "key") == 'ready " hi"'
        assert load("mp_supervisor").healthy(f"http://127.0.0.1:{port}/health")
        with pytest.raises(TimeoutError):
            proxy.accept()  # nothing ever connected to the proxy
    finally:
        server.shutdown()
        proxy.close()


def test_failed_waits_check_image_snapshot_and_memory_on_each_node(tmp_path: Path) -> None:
    """check_nodes (diagnose.sh) on this host as the head: a missing image and a missing
    snapshot are named as likely causes, with the node's free memory."""
    path = fake_docker_path(tmp_path, "#!/usr/bin/env bash\nexit 1\n")  # no image anywhere
    driver = tmp_path / "driver.sh"
    driver.write_text(
        f'. "{SCRIPTS}/lib.sh"\n. "{SCRIPTS}/diagnose.sh"\nparse_flags "$@"\ncheck_nodes\n'
    )
    done = subprocess.run(
        ["bash", str(driver), "--host", "spark1", "--node-checks", f"spark1|-|{SCRIPTS}",
         "--image", "sha256:abc", "--model", "org/tiny", "--revision", "main",
         "--cache-dir", str(tmp_path / "hf")],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": path},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--- checked on every node ---" in done.stdout
    assert re.search(r"spark1: \d+ MiB of memory available", done.stdout)
    assert "likely cause: the image sha256:abc is missing on spark1" in done.stdout
    assert "likely cause: spark-vllm: spark1: hf-manifest: no snapshot of org/tiny@main" in (
        done.stdout
    )


# --- receipts and facts (components/facts.py) ----------------------------------------------------


def facts(state_dir: Path, *guard: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """facts.sh as the program runs it (components/bundle.py facts_script): from stdin after
    snapshot.sh and dir_safety.py, nothing installed; the cache beside the state."""
    cache = state_dir.parent / "hf"
    done = subprocess.run(["bash", "-s", "--", str(state_dir), str(cache), *guard],
                          input=facts_script(),
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "spark-vllm-facts 1"
    # What this machine's own Docker holds and is given is for the tests of it, not these.
    lines = [line for line in lines[1:] if not line.startswith((*DOCKERD_LINES, *LABEL_LINES))]
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines}


DOCKERD_LINES = ("dockerd-arg ", "daemon-json ")
LABEL_LINES = ("key-label ", "key-label-error ")  # tests/program/test_key_labels.py


def receipt(state_dir: Path, step: str, token: str, *checks: str) -> None:
    run("receipt.sh", "--host", "node1", "--state-dir", str(state_dir), "--step", step,
        "--token", token, "--checks", ";".join(checks), check=True)  # fmt: skip


def test_receipts_hold_until_what_they_check_changes(host_tmp: Path) -> None:
    state = host_tmp / "state"
    bound, scripts = state / "ray", state / "bin"
    bound.mkdir(parents=True)
    scripts.mkdir()
    (scripts / "a.sh").write_text("echo a\n")
    cache = host_tmp / "hf"
    snapshot = make_snapshot(cache, {"config.json": b"{}", "model.safetensors": b"x" * 64})
    receipt(state, "s-scripts", "t1", f"sha256sums|{scripts}")
    receipt(state, "s-mounts", "t2", f"mark|{bound}")
    receipt(state, "s-key", "t3", f"files|{scripts / 'a.sh'}")
    receipt(state, "s-fetch", "t4", f"snapshot|{cache}|org/tiny|main")
    assert facts(state) == {"s-scripts": "t1", "s-mounts": "t2", "s-key": "t3", "s-fetch": "t4"}

    (scripts / "a.sh").write_text("echo changed\n")
    shutil.rmtree(bound)
    bound.mkdir()  # the same path, a new directory: containers would still bind the old one
    (snapshot / "model.safetensors").unlink()
    found = facts(state)
    assert found["s-scripts"] == f"- files in {scripts} were changed or removed"
    assert found["s-mounts"] == f"- {bound} was removed or recreated"
    assert found["s-key"] == "t3"
    assert found["s-fetch"] == f"- model org/tiny: {COMMIT} 1 2 (was {COMMIT} 2 66)"


def test_the_fabric_key_receipt_holds_only_while_its_from_is_there(
    host_tmp: Path, tmp_path: Path
) -> None:
    """The authorize step's check (stacks/plan/fabric.py): its line, with `from=` the plan's
    addresses; the same key authorized from anywhere (an older release's line) is drift."""
    auth = tmp_path / ".ssh" / "authorized_keys"
    auth.parent.mkdir()
    state = host_tmp / "state"
    receipt(state, "s-authorize", "t1", f"authorized|{MARKER}|10.0.0.1,10.0.0.3")
    receipt(state, "s-older", "t2", f"authorized|{MARKER}")
    home = {"HOME": str(tmp_path)}
    auth.write_text(f'from="10.0.0.1,10.0.0.3" {HEAD_KEY}\n')
    assert facts(state, env=home) == {"s-authorize": "t1", "s-older": "t2"}
    auth.write_text(f"{HEAD_KEY}\n")
    assert facts(state, env=home) == {
        "s-authorize": f"- the key marked {MARKER} is no longer authorized "
        "from 10.0.0.1,10.0.0.3 alone",
        "s-older": "t2",
    }


def test_a_removed_state_dir_has_no_receipts(host_tmp: Path) -> None:
    assert facts(host_tmp / "never-made") == {}


# The guard's log: a stop of a container since replaced (gone), of one started again since
# (running), and of one stopped still: only the last is news for the next `up`.
GUARD_DOCKER = """#!/usr/bin/env bash
case "$1" in
  logs) cat <<'LOG'
spark-vllm: spark2: memory-guard: watching: acts below 1.0 GiB available of 23.4 GiB
spark-vllm: spark2: memory-guard: stopped spark-vllm-vllm (id aaaaaaaaaaaa, vllm, started 9s before) at T1: low
  likely cause: x
spark-vllm: spark2: memory-guard: stopped spark-vllm-vllm (id bbbbbbbbbbbb, vllm, started 9s before) at T2: low
spark-vllm: spark2: memory-guard: stopped spark-vllm-vllm (id cccccccccccc, vllm, started 9s before) at T3: low
LOG
  ;;
  inspect)
    case "${*: -1}" in
      bbbbbbbbbbbb) echo true ;;
      cccccccccccc) echo false ;;
      *) echo "Error: No such object" >&2; exit 1 ;;
    esac ;;
esac
"""  # noqa: E501


def test_facts_name_what_the_memory_guard_stopped_that_is_stopped_still(host_tmp: Path) -> None:
    env = fake_bin(host_tmp, docker=GUARD_DOCKER)
    found = facts(host_tmp / "state", "spark-vllm-memory-guard", env=env)
    assert found == {
        "guard": "spark-vllm: spark2: memory-guard: stopped spark-vllm-vllm (id cccccccccccc, "
        "vllm, started 9s before) at T3: low"
    }
    # Without a guard (memoryGuard off), nothing is asked of Docker.
    assert facts(host_tmp / "state", env=fake_bin(host_tmp, docker="#!/bin/sh\nexit 1\n")) == {}


def test_facts_give_what_the_running_dockerd_adds_to_every_container(host_tmp: Path) -> None:
    """The daemon of /run/docker.pid (here a bash that is not exec-replaced, with dockerd's words
    on its command line): its `--default-ulimit` flags, and the daemon.json its
    `--config-file` names (on one line), as components/facts.py parses them. Run in a mount
    namespace of its own, with a /run of its own, so this machine's Docker plays no part."""
    config = host_tmp / "daemon.json"
    nofile = {"Name": "nofile", "Soft": 65536, "Hard": 65536}
    config.write_text(json.dumps({"default-ulimits": {"nofile": nofile}}, indent=2))
    daemon = subprocess.Popen(["bash", "-c", "sleep 60; exit 0", "dockerd", "--default-ulimit",
                               "core=0:0", f"--config-file={config}"])  # fmt: skip
    setup = f"mount -t tmpfs tmpfs /run && echo {daemon.pid} > /run/docker.pid && "
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c",
             setup + 'exec bash -s -- "$0" "$1"', str(host_tmp / "state"), str(host_tmp / "hf")],
            input=facts_script(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        daemon.kill()
        daemon.wait()
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith(DOCKERD_LINES)]
    assert lines == [
        "dockerd-arg --default-ulimit=core=0:0",
        'daemon-json {  "default-ulimits": {    "nofile": {      "Name": "nofile",      '
        '"Soft": 65536,      "Hard": 65536    }  }}',
    ]
    parsed = parse_facts("spark1", done.stdout)
    assert [(u.name, u.soft, u.hard) for u in parsed.daemon_ulimits] == [
        ("core", 0, 0),
        ("nofile", 65536, 65536),
    ]


# --- quoting for remote shells (lib.sh words) -----------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_words_survive_a_remote_shell_with_spaces_and_quotes(shell: str, tmp_path: Path) -> None:
    """What the scripts send over SSH is one command line; paths with a space or a quote must
    arrive as the same words (the remote login shell may be bash or a POSIX sh)."""
    odd = str(tmp_path / "state dir" / "it's; $(here)")
    line = subprocess.run(
        ["bash", "-c", f'. "{SCRIPTS}/lib.sh"; words printf "%s\\n" "$1" plain', "t", odd],
        capture_output=True, text=True, timeout=10, check=True,
    ).stdout  # fmt: skip
    done = subprocess.run([shell, "-c", line], capture_output=True, text=True, timeout=10)
    assert done.stdout.splitlines() == [odd, "plain"], line


class StreamingVllm(StubVllm):
    """Streams `tokens` SSE chunks, `gap` seconds apart, after `first` seconds."""

    first, gap, count = 0.05, 0.01, 8

    def do_GET(self) -> None:
        if self.path == "/version":
            self.reply(200, {"version": "0.16.0rc1"})
        else:
            super().do_GET()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["stream"] is True and body["max_tokens"] == 64
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(self.first)
        for index in range(self.count):
            chunk = {"choices": [{"index": 0, "text": f" t{index}"}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(self.gap)
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


def test_the_speed_measure_reports_medians_of_streamed_completions() -> None:
    measure = load("vllm_probe").measure
    server = ThreadingHTTPServer(("127.0.0.1", 0), StreamingVllm)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        word, ttft, rate, runs, tokens, version = measure(
            port, "qwen", "key", "127.0.0.1", 3
        ).split()
    finally:
        server.shutdown()
    assert (word, runs, tokens, version) == ("speed", "3", "8", "0.16.0rc1")
    assert 0.04 <= float(ttft) < 1.0
    assert 20 < float(rate) <= 110  # 7 tokens over ~7 gaps of 10 ms (and scheduling)


def test_a_stalled_load_is_stopped_only_if_its_pid_still_names_it(tmp_path: Path) -> None:
    """image-load.sh stop kills the process group its pidfile names only while that PID is the
    process that wrote it (its start time too): a PID the kernel gave to another process since
    (even another load) is left be."""
    bin_dir, stage = tmp_path / "bin", tmp_path / "image-stage"
    bin_dir.mkdir()
    stage.mkdir()
    shutil.copy(SCRIPTS / "image-load.sh", bin_dir / "image-load.sh")
    load = subprocess.Popen(["bash", "-c", "exec -a image-load-stand-in sleep 60"],
                            start_new_session=True)  # fmt: skip
    try:
        fields = Path(f"/proc/{load.pid}/stat").read_text().rsplit(") ", 1)[1].split()
        since = fields[19]
        for recorded, alive in ((f"{load.pid} {int(since) + 1}", True), (f"{load.pid}", True),
                                (f"{load.pid} {since}", False)):  # fmt: skip
            (stage / "s1.pid").write_text(recorded + "\n")
            subprocess.run(["bash", str(bin_dir / "image-load.sh"), "stop", "s1"], check=True,
                           timeout=30)  # fmt: skip
            time.sleep(0.2)
            assert (load.poll() is None) == alive, recorded
            assert not (stage / "s1.pid").exists()
    finally:
        load.kill()
        load.wait()
