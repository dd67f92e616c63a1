"""What a lab run looks like (LabSpec) and what `up` reports back (LabInfo)."""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from lab.engines import DEFAULT_ENGINE, ENGINES

Topology = Literal["bastion", "jump"]
# What serves in the lab image: the stand-in (lab/image/vllm_standin) or vLLM's own CPU build
# (lab/image.py REAL_VLLM) with a tiny real model.
VllmKind = Literal["standin", "real"]
VLLM_KINDS: tuple[VllmKind, ...] = ("standin", "real")

DEFAULT_STATE_DIR = Path("/var/lib/spark-vllm-lab")
DEFAULT_CACHE_DIR = Path("/var/cache/spark-vllm-lab")
DEFAULT_FABRIC_IFNAME = "enp1s0f1np1"
MGMT_IFNAME = "mgmt0"
OUTSIDE_IFNAME = "outside0"
IMAGE_NAME = "spark-vllm-lab:latest"
HF_MODEL = "spark-vllm-lab/tiny-chat"
# More tiny models beside it, for stacks that serve several (the same shapes, their own commits).
HF_MORE_MODELS = ("spark-vllm-lab/tiny-chat-b", "spark-vllm-lab/tiny-chat-c")
HF_REVISION = "main"

# Linux limits interface names to 15 characters; the root-namespace end of the outside link is
# named "<prefix>-out", so the prefix stays short. Lower-case only: it also names netns and cgroups.
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
# Each host binds a private /tmp, /run, /root and /dev/shm over the machine's: a state dir under
# one of them would be hidden from the host's own daemons.
_HIDDEN_INSIDE_HOSTS = ("/tmp", "/run", "/root", "/dev/shm", "/etc/docker", "/proc", "/sys")


class SpecError(ValueError):
    """The requested lab cannot be built as specified."""


@dataclass(frozen=True)
class LabSpec:
    """Everything that distinguishes one lab run from another."""

    hosts: int = 2
    topology: Topology = "bastion"
    prefix: str = "svl"
    mgmt_subnet: str = "10.240.1.0/24"
    fabric_subnet: str = "10.241.0.0/24"
    outside_subnet: str = "10.240.0.0/30"
    state_dir: Path = DEFAULT_STATE_DIR
    cache_dir: Path = DEFAULT_CACHE_DIR
    fabric_ifnames: tuple[str, ...] = ()  # per host; empty or shorter -> DEFAULT_FABRIC_IFNAME
    fabric_rate: str | None = None  # e.g. "1gbit": tc tbf on every host's fabric interface
    engines: tuple[str, ...] = ()  # per host (lab/engines.py); empty or shorter -> 20.10
    shm_size: str = "1g"
    with_image: bool = True
    with_model: bool = True
    vllm: VllmKind = "standin"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.hosts < 2:
            raise SpecError(f"a lab needs at least 2 hosts, got {self.hosts}")
        if self.hosts > 200:
            raise SpecError(f"at most 200 hosts, got {self.hosts}")
        if self.vllm not in VLLM_KINDS:
            raise SpecError(f"vllm must be one of {', '.join(VLLM_KINDS)}, got {self.vllm!r}")
        if self.topology not in ("bastion", "jump"):
            raise SpecError(f"topology must be 'bastion' or 'jump', got {self.topology!r}")
        if not _PREFIX_RE.match(self.prefix):
            raise SpecError(f"prefix must match {_PREFIX_RE.pattern}, got {self.prefix!r}")
        for name in self.fabric_ifnames:
            if not _IFNAME_RE.match(name) or name in (MGMT_IFNAME, OUTSIDE_IFNAME, "lo"):
                raise SpecError(f"bad fabric interface name {name!r} (max 15 chars, not reserved)")
        if len(self.fabric_ifnames) > self.hosts:
            raise SpecError("more fabric interface names than hosts")
        for engine in self.engines:
            if engine not in ENGINES:
                raise SpecError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if len(self.engines) > self.hosts:
            raise SpecError("more engines than hosts")
        self._check_subnets()
        self._check_state_dir()

    def _check_subnets(self) -> None:
        nets = [self.mgmt_net, self.fabric_net, self.outside_net]
        for a in range(len(nets)):
            for b in range(a + 1, len(nets)):
                if nets[a].overlaps(nets[b]):
                    raise SpecError(f"subnets {nets[a]} and {nets[b]} overlap")
        if self.outside_net.num_addresses < 4:
            raise SpecError("outside subnet needs at least a /30")
        if self.mgmt_net.num_addresses < self.hosts + 12:
            raise SpecError(f"mgmt subnet {self.mgmt_net} too small for {self.hosts} hosts")

    def _check_state_dir(self) -> None:
        for path in (self.state_dir, self.cache_dir):
            if not path.is_absolute():
                raise SpecError(f"{path} must be an absolute path")
            for hidden in _HIDDEN_INSIDE_HOSTS:
                if path == Path(hidden) or Path(hidden) in path.parents:
                    raise SpecError(f"{path} is under {hidden}, which every host replaces")

    # -- derived values -------------------------------------------------------------------------

    @property
    def mgmt_net(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.mgmt_subnet)

    @property
    def fabric_net(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.fabric_subnet)

    @property
    def outside_net(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.outside_subnet)

    @property
    def host_names(self) -> list[str]:
        return [f"spark{i}" for i in range(1, self.hosts + 1)]

    def host_mgmt_ip(self, index: int) -> str:
        """index is 0-based: spark1 -> .11 as in design.md."""
        return str(self.mgmt_net.network_address + 11 + index)

    def host_fabric_ip(self, index: int) -> str:
        return str(self.fabric_net.network_address + 11 + index)

    def fabric_ifname(self, index: int) -> str:
        if index < len(self.fabric_ifnames):
            return self.fabric_ifnames[index]
        return DEFAULT_FABRIC_IFNAME

    def engine(self, index: int) -> str:
        """The Docker engine of host `index` (0-based)."""
        return self.engines[index] if index < len(self.engines) else DEFAULT_ENGINE

    @property
    def bastion_mgmt_ip(self) -> str:
        return str(self.mgmt_net.network_address + 1)

    @property
    def outside_root_ip(self) -> str:
        """This machine's end of the outside link."""
        return str(self.outside_net.network_address + 1)

    @property
    def outside_far_ip(self) -> str:
        """The bastion's (or, in jump topology, the head's) end of the outside link."""
        return str(self.outside_net.network_address + 2)

    def netns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    @property
    def switch_netns(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def root_ifname(self) -> str:
        return f"{self.prefix}-out"

    def cgroup_parent(self, host: str) -> str:
        return f"{self.prefix}-{host}"


@dataclass(frozen=True)
class HostInfo:
    name: str
    mgmt_ip: str
    fabric_ip: str
    fabric_ifname: str
    ssh_port: int
    user: str
    host_key: str  # "ssh-ed25519 AAAA..." (no comment)
    netns: str
    is_head: bool
    engine: str = DEFAULT_ENGINE  # lab/engines.py


@dataclass(frozen=True)
class BastionInfo:
    address: str  # what this machine connects to
    mgmt_ip: str
    ssh_port: int
    user: str
    host_key: str
    netns: str


@dataclass(frozen=True)
class LabInfo:
    topology: Topology
    prefix: str
    state_dir: str
    client_key: str
    known_hosts: str
    ssh_config: str
    image: str
    hf_model: str
    hf_revision: str
    hosts: list[HostInfo]
    bastion: BastionInfo | None = None
    mgmt_subnet: str = ""
    fabric_subnet: str = ""
    outside_subnet: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head(self) -> HostInfo:
        return self.hosts[0]

    @property
    def workers(self) -> list[HostInfo]:
        return self.hosts[1:]

    def host(self, name: str) -> HostInfo:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in this lab ({[h.name for h in self.hosts]})")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> LabInfo:
        raw = json.loads(text)
        hosts = [HostInfo(**h) for h in raw.pop("hosts")]
        bastion_raw = raw.pop("bastion")
        bastion = BastionInfo(**bastion_raw) if bastion_raw else None
        return cls(hosts=hosts, bastion=bastion, **raw)
