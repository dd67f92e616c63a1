"""The spark-vllm stack configuration that deploys onto a lab (what Pulumi.lab.yaml holds).

Derived from the LabSpec alone, so the committed Pulumi.lab.yaml can be checked against the lab's
defaults, and tests can deploy onto labs with other subnets, sizes and topologies.
"""

from __future__ import annotations

import re
from typing import Any

from lab.spec import HF_MODEL, HF_REVISION, IMAGE_NAME, LabSpec

PROJECT = "spark-vllm"
LAB_USER = "root"
SERVED_NAME = "tiny-chat"


LAB_MIN_LINK_GBPS = 1
TC_RATE = re.compile(r"(?P<number>[\d.]+)(?P<unit>[kmg]?)(bit|bps)", re.IGNORECASE)


def min_link_gbps(spec: LabSpec) -> float:
    """The link test's floor: LAB_MIN_LINK_GBPS, or half the rate `--fabric-rate` shapes the
    fabric to (tc's units: a bare `bit`, `kbit`, `mbit`, `gbit`; `bps` is bytes per second)."""
    if not spec.fabric_rate:
        return LAB_MIN_LINK_GBPS
    rate = TC_RATE.fullmatch(spec.fabric_rate)
    if rate is None:
        raise ValueError(f"--fabric-rate {spec.fabric_rate!r}: expected e.g. 1gbit or 200mbit")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[rate["unit"].lower()]
    bits = float(rate["number"]) * scale * (8 if spec.fabric_rate.lower().endswith("bps") else 1)
    return round(bits / 1e9 / 2, 6)


def stack_config(spec: LabSpec) -> dict[str, Any]:
    """`Pulumi.<stack>.yaml` config (namespaced keys) for the lab `spec` describes."""
    config: dict[str, Any] = {}
    if spec.topology == "bastion":
        config["bastion"] = {"address": spec.outside_far_ip, "user": LAB_USER}
    config["hosts"] = [_host(spec, index) for index in range(spec.hosts)]
    config["ssh"] = {
        "privateKeyPath": str(spec.state_dir / "id_ed25519"),
        "knownHostsFile": str(spec.state_dir / "known_hosts"),
    }
    config["image"] = {"ref": IMAGE_NAME, "keepOnDestroy": True}
    # The front's HAProxy: in the lab image (Debian's package), which has no registry to pull from.
    config["front"] = {"image": {"ref": IMAGE_NAME}}
    config["model"] = {
        "id": HF_MODEL,
        "revision": HF_REVISION,
        "servedName": SERVED_NAME,
        "cacheDir": "/root/.cache/huggingface",
    }
    # `auto`: the hosts share this machine's memory, so a fixed fraction of it may not be free.
    # No executor: the default, vLLM's own multi-node mode (mp), as a user's stack gets it.
    config["vllm"] = {
        "port": 8000,
        "tensorParallelSize": spec.hosts,
        "maxModelLen": 2048,
        "gpuMemoryUtilization": "auto",
    }
    if spec.vllm == "real":
        config["vllm"].update(real_vllm_settings())
    config["docker"] = {"requestGpus": False}
    # The firewall is on by default (tests show it). The link floor: the lab's veth fabric on
    # a busy 2-core machine still carries several Gbit/s; a shaped one (tc) falls below it.
    config["fabric"] = {"minLinkGbps": min_link_gbps(spec)}
    config["preflight"] = {
        "unifiedMemory": False,
        "minFreeMemoryGib": 1,
        "minFreeDiskGib": 2,
        "requireNvidiaRuntime": False,
    }
    # The lab's hosts share this machine's memory, so the preflight cannot treat them as
    # unified-memory hosts; the memory guard a Spark user gets by default (memoryGuard auto
    # follows unifiedMemory) runs here all the same, with its default threshold.
    config["memoryGuard"] = {"enabled": True}
    config["timeouts"] = {
        "rayJoinSeconds": 120,
        "vllmReadySeconds": 240,
        "imageTransferMinutes": 10,
        "weightsTransferMinutes": 10,
    }
    return {f"{PROJECT}:{key}": value for key, value in config.items()}


def real_vllm_settings() -> dict[str, Any]:
    """What vLLM's CPU build needs on the lab's hosts, which a GPU host does not:
    - its KV cache size, 1 GiB (vllm/envs.py VLLM_CPU_KVCACHE_SPACE; its default takes a share
      of the host's memory, which every lab host shares with this machine);
    - float32: with `auto` vLLM runs the model in bfloat16 on a CPU that lists avx512_bf16, and
      its workers died of SIGILL on this machine kind (a VM that lists AMX too);
    - no CPU binding, one thread a rank: with `auto` (vllm/utils/ompmultiprocessing.py) each
      rank binds to the first core of the CPUs it sees and leaves the next for the engine,
      and every lab host sees this machine's same two cores: every rank of every server on
      every host ran on core 0 (/proc/PID/status Cpus_allowed_list), and a second server's
      first start took 370 s beside a serving one. Unbound, the kernel spreads them as a
      host's own cores would."""
    return {
        "env": {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1",
        },
        "extraArgs": ["--dtype", "float32"],
    }


def _host(spec: LabSpec, index: int) -> dict[str, Any]:
    """Bastion topology: every host through the bastion on mgmt. Jump topology (the seeds'):
    the head on the outside link, each worker through the head at its fabric address."""
    host: dict[str, Any] = {"name": spec.host_names[index]}
    if spec.topology == "bastion":
        host.update(address=spec.host_mgmt_ip(index), user=LAB_USER, via="bastion")
    elif index == 0:
        host.update(address=spec.outside_far_ip, user=LAB_USER)
    else:
        host.update(address=spec.host_fabric_ip(index), user=LAB_USER, via=spec.host_names[0])
    host.update(fabricInterface=spec.fabric_ifname(index), fabricIp=spec.host_fabric_ip(index))
    return host
