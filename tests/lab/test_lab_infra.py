"""The lab itself: isolation, reachability, pinned keys, daemons, image, model, teardown.

The `lab`-marked tests need root and the tools of lab/install-deps.sh; they are skipped without
them and fail on CI (CI=true). Two labs per session: the shared bastion lab (conftest) and a
3-host jump lab torn down here. The unmarked tests check pure logic and run anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import HF_MODEL, IMAGE_NAME, Lab, LabError, LabInfo, LabSpec, SpecError, leftovers
from lab.client import known_hosts_text, ssh_options
from lab.hfmodel import seed_cache
from lab.spec import BastionInfo, HostInfo, Topology


def tcp_open(addr: str, port: int = 22) -> bool:
    """TCP connect from this machine's namespace (bash /dev/tcp; busybox wget crashes)."""
    argv = ["timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{addr}/{port}"]
    return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0


def host_tcp_open(lab: Lab, host: str, addr: str, port: int = 22) -> bool:
    probe = f"timeout 3 bash -c 'exec 3<>/dev/tcp/{addr}/{port}'"
    return lab.sh(host, probe, check=False, timeout=10).returncode == 0


# -- bastion topology (the shared lab) ----------------------------------------------------------


@pytest.mark.lab
def test_lab_json_describes_the_lab(lab_bastion: Lab) -> None:
    info = lab_bastion.info()
    raw = json.loads((Path(info.state_dir) / "lab.json").read_text())
    assert raw["topology"] == "bastion"
    assert [h["name"] for h in raw["hosts"]] == ["spark1", "spark2"]
    for host in raw["hosts"]:
        assert set(host) >= {
            "name",
            "mgmt_ip",
            "fabric_ip",
            "fabric_ifname",
            "ssh_port",
            "user",
            "host_key",
        }
        assert host["host_key"].startswith("ssh-ed25519 ")
        assert host["fabric_ifname"] == "enp1s0f1np1"
    assert raw["bastion"]["address"] == lab_bastion.spec.outside_far_ip
    assert LabInfo.from_json(json.dumps(raw)) == info
    known = Path(info.known_hosts).read_text()
    for host in info.hosts:
        line = next(x for x in known.splitlines() if x.endswith(host.host_key))
        assert host.mgmt_ip in line and host.fabric_ip in line


@pytest.mark.lab
def test_root_namespace_reaches_only_the_bastion(lab_bastion: Lab) -> None:
    info = lab_bastion.info()
    assert info.bastion is not None
    assert tcp_open(info.bastion.address)
    for host in info.hosts:
        assert not tcp_open(host.mgmt_ip), f"{host.name} mgmt reachable from the machine"
        assert not tcp_open(host.fabric_ip), f"{host.name} fabric reachable from the machine"


@pytest.mark.lab
def test_every_host_answers_through_the_bastion_with_its_pinned_key(
    lab_bastion: Lab,
) -> None:
    for host in lab_bastion.info().hosts:
        # No multiplexing: every call is a full handshake checked against known_hosts.
        out = lab_bastion.ssh(host.name, "hostname", multiplex=False).stdout.strip()
        assert out == host.name


@pytest.mark.lab
def test_a_wrong_pinned_key_is_refused(lab_bastion: Lab, tmp_path: Path) -> None:
    info = lab_bastion.info()
    wrong = tmp_path / "known_hosts"
    keys = Path(info.known_hosts).read_text()
    # spark2's addresses paired with spark1's key.
    wrong.write_text(keys.replace(info.hosts[1].host_key, info.hosts[0].host_key))
    # OpenSSH keeps the first value given for an option: ours goes before the lab's.
    argv = ["ssh", "-o", f"UserKnownHostsFile={wrong}", *ssh_options(info, info.hosts[1])]
    argv += [f"root@{info.hosts[1].mgmt_ip}", "true"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 255
    assert "host key" in done.stderr.lower()


@pytest.mark.lab
def test_bastion_reaches_mgmt_but_not_the_fabric(lab_bastion: Lab) -> None:
    lab = lab_bastion
    for host in lab_bastion.info().hosts:
        probe = "timeout 3 bash -c 'exec 3<>/dev/tcp/{}/22' && echo open || echo closed"
        assert lab.ssh_bastion(probe.format(host.mgmt_ip)).stdout.strip() == "open"
        assert lab.ssh_bastion(probe.format(host.fabric_ip)).stdout.strip() == "closed"


@pytest.mark.lab
def test_hosts_reach_each_other_on_the_fabric(lab_bastion: Lab) -> None:
    lab, info = lab_bastion, lab_bastion.info()
    spark1, spark2 = info.hosts
    assert host_tcp_open(lab, "spark1", spark2.fabric_ip)
    assert host_tcp_open(lab, "spark2", spark1.fabric_ip)
    links = lab.exec("spark1", ["ip", "-br", "link"]).stdout
    assert "enp1s0f1np1" in links and "mgmt0" in links
    assert (
        spark1.fabric_ip in lab.exec("spark1", ["ip", "-br", "addr", "show", "enp1s0f1np1"]).stdout
    )


@pytest.mark.lab
def test_lab_installs_no_ssh_trust_between_hosts(lab_bastion: Lab) -> None:
    """The program establishes head -> worker trust itself; the lab must not pre-install it."""
    lab, info = lab_bastion, lab_bastion.info()
    worker = info.hosts[1]
    done = lab.sh(
        "spark1",
        f"ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        f"-o ConnectTimeout=5 root@{worker.fabric_ip} true",
        check=False,
    )
    assert done.returncode == 255 and "Permission denied" in done.stderr
    assert lab.exec("spark2", ["cat", "/root/.ssh/authorized_keys"]).stdout.count("ssh-") == 1


@pytest.mark.lab
def test_hosts_are_isolated_machines(lab_bastion: Lab) -> None:
    lab = lab_bastion
    lab.sh("spark1", "echo mine > /root/private-marker && echo t > /tmp/private-marker")
    assert lab.sh("spark2", "ls /root/private-marker /tmp/private-marker", check=False).returncode
    assert lab.exec("spark2", ["hostname"]).stdout.strip() == "spark2"
    assert lab.exec("spark2", ["cat", "/proc/1/comm"]).stdout.strip() == "tini"
    assert "spark2" in lab.exec("spark2", ["cat", "/etc/hosts"]).stdout
    assert "spark1" not in lab.exec("spark2", ["cat", "/etc/hosts"]).stdout
    shm = lab.exec("spark2", ["df", "-k", "--output=size", "/dev/shm"]).stdout.split()[-1]
    assert int(shm) == 1024 * 1024  # the spec's 1g


@pytest.mark.lab
def test_docker_info_over_ssh_on_every_host(lab_bastion: Lab) -> None:
    for host in lab_bastion.info().hosts:
        out = lab_bastion.ssh(host.name, "docker info --format '{{.Driver}} {{.Name}}'")
        assert out.stdout.split() == ["overlay2", host.name]


@pytest.mark.lab
def test_accept_env_is_stock(lab_bastion: Lab) -> None:
    """An env var sent with SendEnv does not arrive (only LANG/LC_* would)."""
    env = {**os.environ, "SPARK_LAB_PROBE": "leaked", "LC_SPARK_LAB": "lc-ok"}
    done = lab_bastion.ssh(
        "spark2",
        'echo "${SPARK_LAB_PROBE:-absent} ${LC_SPARK_LAB:-absent}"',
        multiplex=False,
        extra_options=["-o", "SendEnv=SPARK_LAB_PROBE LC_SPARK_LAB"],
        env=env,
    )
    assert done.stdout.split() == ["absent", "lc-ok"]


@pytest.mark.lab
def test_image_is_on_the_head_only(lab_bastion: Lab) -> None:
    lab = lab_bastion
    assert lab.exec("spark1", ["docker", "image", "inspect", IMAGE_NAME]).returncode == 0
    assert lab.exec("spark2", ["docker", "image", "inspect", IMAGE_NAME], check=False).returncode


@pytest.mark.lab
def test_image_has_the_tools_and_resolves_the_seeded_model_offline(lab_bastion: Lab) -> None:
    script = (
        "set -e; for t in bash tar gzip python3 ray vllm curl ps; do command -v $t; done; "
        "ray --version; python3 -c 'import huggingface_hub, ray'; "
        "python3 -c 'from huggingface_hub import snapshot_download as s; "
        f'print(s("{HF_MODEL}", revision="main", cache_dir="/hf/hub"))\''
    )
    done = lab_bastion.exec(
        "spark1",
        [
            "docker",
            "run",
            "--rm",
            "--init",
            "--network",
            "host",
            "-e",
            "HF_HUB_OFFLINE=1",
            "-v",
            "/root/.cache/huggingface:/hf:ro",
            IMAGE_NAME,
            "bash",
            "-c",
            script,
        ],
        timeout=120,
    )
    lines = done.stdout.strip().splitlines()
    assert "ray, version 2.60.0" in done.stdout
    snapshot = lines[-1]
    assert snapshot.startswith("/hf/hub/models--spark-vllm-lab--tiny-chat/snapshots/")


@pytest.mark.lab
def test_hf_snapshot_is_on_the_head_only(lab_bastion: Lab) -> None:
    lab = lab_bastion
    repo = "/root/.cache/huggingface/hub/models--spark-vllm-lab--tiny-chat"
    commit = lab.exec("spark1", ["cat", f"{repo}/refs/main"]).stdout
    assert len(commit) == 40 and int(commit, 16) >= 0
    listing = lab.exec("spark1", ["ls", "-l", f"{repo}/snapshots/{commit}"]).stdout
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert f"{name} -> ../../blobs/" in listing
    size = lab.exec(
        "spark1", ["stat", "-L", "-c", "%s", f"{repo}/snapshots/{commit}/model.safetensors"]
    )
    assert int(size.stdout) > 8_000_000
    assert lab.exec("spark2", ["test", "-e", repo], check=False).returncode != 0


@pytest.mark.lab
def test_ray_declares_logical_gpus_in_a_container_on_the_head(lab_bastion: Lab) -> None:
    lab, head = lab_bastion, lab_bastion.info().head
    name = "lab-infra-ray-probe"
    lab.exec("spark1", ["docker", "rm", "-f", name], check=False)
    lab.exec("spark1", [
        "docker", "run", "-d", "--name", name, "--network", "host", "--init", IMAGE_NAME,
        "ray", "start", "--head", "--block", f"--node-ip-address={head.fabric_ip}",
        "--port=6390", "--num-gpus=1", "--num-cpus=1", "--disable-usage-stats",
        "--include-dashboard=false", "--object-store-memory=100000000",
    ])  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        status = ""
        while time.monotonic() < deadline:
            status = lab.exec("spark1", ["docker", "exec", name, "ray", "status",
                                         f"--address={head.fabric_ip}:6390"],
                              check=False, timeout=60).stdout  # fmt: skip
            if "GPU" in status:
                break
            time.sleep(1)
        assert "1.0 GPU" in status, status
    finally:
        lab.exec("spark1", ["docker", "rm", "-f", name], check=False)


@pytest.mark.lab
def test_up_again_is_idempotent(lab_bastion: Lab) -> None:
    lab = lab_bastion
    pids = {h: lab.node(h).init_pid_file.read_text() for h in ("bastion", "spark1", "spark2")}
    started = time.monotonic()
    again = Lab(lab.spec).up()
    assert again == lab_bastion.info()
    assert time.monotonic() - started < 10
    assert pids == {h: lab.node(h).init_pid_file.read_text() for h in pids}


@pytest.mark.lab
def test_up_again_restores_a_removed_model_seed(lab_bastion: Lab) -> None:
    refs = "/root/.cache/huggingface/hub/models--spark-vllm-lab--tiny-chat/refs/main"
    before = lab_bastion.exec("spark1", ["cat", refs]).stdout
    lab_bastion.exec("spark1", ["rm", refs])
    lab_bastion.up()
    assert lab_bastion.exec("spark1", ["cat", refs]).stdout == before


# -- jump topology, and a full teardown ---------------------------------------------------------


@pytest.mark.lab
def test_jump_topology_and_clean_teardown(lab_factory: Callable[..., Lab]) -> None:
    lab = lab_factory("jump", hosts=3, topology="jump", with_model=False,
                          fabric_ifnames=("enp1s0f1np1", "enP2p1s0f1np1"))  # fmt: skip
    info = lab.info()
    head, workers = info.head, info.workers
    assert info.bastion is None
    assert tcp_open(head.mgmt_ip)
    for w in workers:
        assert not tcp_open(w.mgmt_ip) and not tcp_open(w.fabric_ip)
        # The program's way (ProxyCommand through the head) and a human's (ProxyJump config).
        assert lab.ssh(w.name, "hostname", multiplex=False).stdout.strip() == w.name
        human = subprocess.run(["ssh", "-F", info.ssh_config, w.name, "hostname"],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
        assert human.stdout.strip() == w.name, human.stderr
    assert "enP2p1s0f1np1" in lab.exec("spark2", ["ip", "-br", "link"]).stdout
    # Something for teardown to clean: a running container (cgroups, overlay mounts) on the head.
    lab.exec("spark1", ["docker", "run", "-d", "--init", "--network", "host", IMAGE_NAME,
                        "sleep", "600"])  # fmt: skip
    lab.ssh("spark2", "true")  # leaves a ControlMaster for `down` to close

    lab.down()
    assert leftovers(lab.spec) == []
    lab.down()  # twice: still fine
    assert not (Path(info.state_dir) / "lab.json").exists()
    with pytest.raises(LabError):
        lab.info()


# -- pure logic (no root needed) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"hosts": 1},
        {"topology": "mesh"},
        {"prefix": "Bad-Prefix"},
        {"prefix": "muchtoolongprefix"},
        {"mgmt_subnet": "10.241.0.0/24"},  # overlaps the fabric
        {"fabric_ifnames": ("an-interface-name-too-long",)},
        {"state_dir": Path("/tmp/lab")},  # hidden by every host's private /tmp
        {"state_dir": Path("relative")},
    ],
)
def test_spec_rejects(fields: dict[str, object]) -> None:
    with pytest.raises(SpecError):
        LabSpec(**fields)  # type: ignore[arg-type]


def test_spec_addresses_follow_the_design() -> None:
    spec = LabSpec(hosts=3, fabric_ifnames=("a0", "b0"))
    assert spec.host_names == ["spark1", "spark2", "spark3"]
    assert [spec.host_mgmt_ip(i) for i in range(3)] == ["10.240.1.11", "10.240.1.12", "10.240.1.13"]
    assert spec.host_fabric_ip(1) == "10.241.0.12"
    assert spec.bastion_mgmt_ip == "10.240.1.1" and spec.outside_far_ip == "10.240.0.2"
    assert [spec.fabric_ifname(i) for i in range(3)] == ["a0", "b0", "enp1s0f1np1"]
    assert len(spec.root_ifname) <= 15


def _info(topology: Topology) -> LabInfo:
    """A LabInfo as `up` would write it, for two hosts, without running anything."""
    hosts = [
        HostInfo(
            name=f"spark{i}",
            mgmt_ip=f"10.0.1.1{i}",
            fabric_ip=f"10.0.2.1{i}",
            fabric_ifname="f0",
            ssh_port=22,
            user="root",
            host_key=f"ssh-ed25519 K{i}",
            netns=f"t-spark{i}",
            is_head=i == 1,
        )
        for i in (1, 2)
    ]
    bastion = BastionInfo(
        address="10.0.0.2",
        mgmt_ip="10.0.1.1",
        ssh_port=22,
        user="root",
        host_key="ssh-ed25519 KB",
        netns="t-bastion",
    )
    state = "/var/lib/x"
    return LabInfo(
        topology=topology,
        prefix="t",
        state_dir=state,
        client_key=f"{state}/id_ed25519",
        known_hosts=f"{state}/known_hosts",
        ssh_config=f"{state}/ssh_config",
        image=IMAGE_NAME,
        hf_model=HF_MODEL,
        hf_revision="main",
        hosts=hosts,
        bastion=bastion if topology == "bastion" else None,
        extra={"outside_far_ip": "10.0.0.2"},
    )


def test_ssh_options_hop_through_the_bastion_or_the_head() -> None:
    bastion_info, jump_info = _info("bastion"), _info("jump")
    via_bastion = " ".join(ssh_options(bastion_info, bastion_info.hosts[0]))
    assert "ProxyCommand=" in via_bastion and "root@10.0.0.2" in via_bastion
    assert "StrictHostKeyChecking=yes" in via_bastion and "BatchMode=yes" in via_bastion
    assert "ProxyCommand" not in " ".join(ssh_options(jump_info, jump_info.head))
    via_head = " ".join(ssh_options(jump_info, jump_info.hosts[1]))
    assert "root@10.0.1.11" in via_head
    known = known_hosts_text(jump_info)
    assert "10.0.1.11,10.0.2.11,10.0.0.2 ssh-ed25519 K1" in known
    assert "10.0.1.12,10.0.2.12 ssh-ed25519 K2" in known
    assert LabInfo.from_json(bastion_info.to_json()) == bastion_info


def test_model_seed_has_the_hub_cache_layout(tmp_path: Path) -> None:
    commit = seed_cache(tmp_path)
    assert commit == seed_cache(tmp_path)  # deterministic and idempotent
    repo = tmp_path / "hub" / "models--spark-vllm-lab--tiny-chat"
    assert (repo / "refs" / "main").read_text() == commit and len(commit) == 40
    snapshot = repo / "snapshots" / commit
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        link = snapshot / name
        target = os.readlink(link)
        assert target.startswith("../../blobs/")
        assert link.resolve().parent == (repo / "blobs").resolve()
    weights = (snapshot / "model.safetensors").resolve()
    assert len(weights.name) == 64  # LFS file: stored by sha256
    assert len((snapshot / "config.json").resolve().name) == 40  # git blob sha1
    assert weights.stat().st_size > 8_000_000
    json.loads((snapshot / "config.json").read_text())
