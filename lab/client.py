"""The client side of the lab: this machine's key, pinned host keys, ssh command lines."""

from __future__ import annotations

import os
import shlex
import signal
from collections.abc import Sequence
from pathlib import Path

from lab.proc import ensure_ed25519_key, ok
from lab.spec import BastionInfo, HostInfo, LabInfo

SSH = "/usr/bin/ssh"


def ensure_client_key(state_dir: Path) -> Path:
    key = state_dir / "id_ed25519"
    ensure_ed25519_key(key, "spark-vllm-lab-client", "client key")
    return key


def known_hosts_text(info: LabInfo) -> str:
    """Every key under every address a client or a jump may dial, so StrictHostKeyChecking=yes
    and BatchMode=yes work from the very first connection."""
    lines = []
    if info.bastion:
        b = info.bastion
        lines.append(f"{b.address},{b.mgmt_ip} {b.host_key}")
    for h in info.hosts:
        addrs = [h.mgmt_ip, h.fabric_ip]
        if info.topology == "jump" and h.is_head:
            addrs.append(info.extra["outside_far_ip"])
        lines.append(f"{','.join(addrs)} {h.host_key}")
    return "\n".join(lines) + "\n"


def common_options(info: LabInfo) -> list[str]:
    return [
        "-o",
        f"IdentityFile={info.client_key}",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={info.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "ServerAliveInterval=10",
        "-o",
        "ServerAliveCountMax=3",
        "-F",
        "/dev/null",
    ]


def jump_target(info: LabInfo, host: HostInfo) -> HostInfo | BastionInfo | None:
    """Who a client hops through to reach host: the bastion, or the head in jump topology."""
    if info.bastion:
        return info.bastion
    if host.is_head:
        return None
    return info.head


def ssh_options(info: LabInfo, host: HostInfo) -> list[str]:
    """OpenSSH client arguments to reach host from this machine, as the program passes them
    (a self-contained ProxyCommand instead of ProxyJump, since -o options do not reach a
    ProxyJump's inner ssh)."""
    opts = common_options(info)
    jump = jump_target(info, host)
    if jump is not None:
        address = jump.address if isinstance(jump, BastionInfo) else jump.mgmt_ip
        inner = [
            SSH,
            *common_options(info),
            "-W",
            "%h:%p",
            "-p",
            str(jump.ssh_port),
            f"{jump.user}@{address}",
        ]
        opts += ["-o", "ProxyCommand=" + shlex.join(inner)]
    return opts


def control_options(info: LabInfo) -> list[str]:
    """Reuse one connection per host: a hop through a jump costs 0.4 s without it."""
    return [
        "-o",
        "ControlMaster=auto",
        "-o",
        f"ControlPath={Path(info.state_dir) / 'cm' / '%C'}",
        "-o",
        "ControlPersist=60",
    ]


def ssh_argv(
    info: LabInfo,
    host: HostInfo,
    command: str,
    *,
    multiplex: bool = True,
    extra_options: Sequence[str] = (),
) -> list[str]:
    argv = [SSH, *ssh_options(info, host), *extra_options]
    if multiplex:
        argv += control_options(info)
    return [*argv, "-p", str(host.ssh_port), f"{host.user}@{host.mgmt_ip}", "--", command]


def ssh_config_text(info: LabInfo) -> str:
    """A config for humans: `ssh -F <state dir>/ssh_config spark2`."""
    common = (
        f"  User root\n  IdentityFile {info.client_key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {info.known_hosts}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
    )
    blocks = []
    if info.bastion:
        blocks.append(f"Host bastion\n  HostName {info.bastion.address}\n{common}")
    for h in info.hosts:
        jump = jump_target(info, h)
        via = "bastion" if isinstance(jump, BastionInfo) else (jump.name if jump else None)
        proxy = f"  ProxyJump {via}\n" if via else ""
        blocks.append(f"Host {h.name}\n  HostName {h.mgmt_ip}\n{proxy}{common}")
    return "\n".join(blocks)


def close_control_masters(state_dir: Path) -> None:
    """Masters live in this machine's namespace and would outlive the lab: close them."""
    cm_dir = state_dir / "cm"
    if not cm_dir.is_dir():
        return
    for sock in cm_dir.iterdir():
        ok([SSH, "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", "lab"], timeout=10)
        sock.unlink(missing_ok=True)
    for pid in ssh_pids_using(state_dir):
        os.kill(pid, signal.SIGKILL)


def ssh_pids_using(state_dir: Path) -> list[int]:
    """ssh clients (masters, ProxyCommands) still running with this lab's files."""
    pids = []
    marker = str(state_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(SSH.encode() + b"\0") and marker in cmdline:
            pids.append(int(entry.name))
    return pids
