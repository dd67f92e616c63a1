"""How the program reaches hosts: SSH connections for commands, SSH options for Docker, and the
step scripts (components/scripts/) that commands run once installed on each host."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import shlex
import tarfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pulumi
from pulumi_command import remote

from stacks.nodes import NodePlan, SshEndpoint

SCRIPTS_DIR = Path(__file__).parent / "scripts"
# Steps that only edit a file or two on a host: anything slower is a hung connection.
QUICK_STEP = pulumi.CustomTimeouts(create="3m", update="3m", delete="3m")


@dataclass(frozen=True)
class SshAuth:
    """This machine's credentials. The key's content is a secret; its path is not."""

    private_key: pulumi.Output[str] | None
    private_key_path: str | None
    agent_socket: str | None
    dial_error_limit: int
    per_dial_timeout: int


@dataclass(frozen=True)
class ScriptsBundle:
    archive_b64: str  # deterministic tar.gz of SCRIPTS_DIR, base64
    digest: str


@cache
def scripts_bundle() -> ScriptsBundle:
    """The step scripts as one reproducible archive: same files, same bytes, no spurious diff."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(SCRIPTS_DIR.iterdir()):
            if not path.is_file() or path.name.startswith("."):
                continue
            data = path.read_bytes()
            info = tarfile.TarInfo(path.name)
            info.size = len(data)
            info.mode = 0o755 if path.suffix == ".sh" else 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    packed = gzip.compress(raw.getvalue(), mtime=0)
    return ScriptsBundle(
        archive_b64=base64.b64encode(packed).decode(),
        digest=hashlib.sha256(packed).hexdigest(),
    )


def script_call(node: NodePlan, script: str, *positional: str, **flags: str | float) -> str:
    """`bash <bin>/<script> [positional] --flag value ...`, every word shell-quoted.

    Commands stay short (the script lives on the host), so a failure message shows a readable
    command line, and no secret is ever among the words: secrets travel on stdin.
    """
    words = ["bash", f"{node.bin_dir}/{script}", *positional, "--host", node.name]
    for key, value in flags.items():
        words += [f"--{key.replace('_', '-')}", str(value)]
    return " ".join(shlex.quote(word) for word in words)


def connection_args(node: NodePlan, auth: SshAuth) -> remote.ConnectionArgs:
    """pulumi-command's connection: pinned key, bounded dials, one proxy hop at most."""
    proxy = None
    if node.jump is not None:
        proxy = remote.ProxyConnectionArgs(**_endpoint_fields(node.jump, auth))
    return remote.ConnectionArgs(**_endpoint_fields(node.ssh, auth), proxy=proxy)


def _endpoint_fields(endpoint: SshEndpoint, auth: SshAuth) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "host": endpoint.address,
        "port": endpoint.port,
        "user": endpoint.user,
        "dial_error_limit": auth.dial_error_limit,
        "per_dial_timeout": auth.per_dial_timeout,
    }
    if endpoint.host_key is not None:
        fields["host_key"] = endpoint.host_key
    if auth.private_key is not None:
        fields["private_key"] = auth.private_key
    if auth.agent_socket is not None:
        fields["agent_socket_path"] = auth.agent_socket
    return fields


def docker_host(node: NodePlan) -> str:
    return f"ssh://{node.ssh.user}@{node.ssh.address}:{node.ssh.port}"


def docker_ssh_opts(
    node: NodePlan, auth: SshAuth, known_hosts_file: Path, control_dir: Path
) -> list[str]:
    """OpenSSH client options for the Docker provider of `node`.

    One shared master connection per host (ControlMaster), because every Docker resource opens
    its own SSH session and stock sshd throttles many at once (MaxStartups).
    """
    opts = _client_opts(node.ssh, auth, known_hosts_file)
    opts += [
        "-o", "ControlMaster=auto",
        "-o", f"ControlPath={control_dir}/%C",
        "-o", "ControlPersist=60",
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=4",
    ]  # fmt: skip
    if node.jump is not None:
        # ProxyCommand, not ProxyJump: OpenSSH does not pass -o options to a ProxyJump hop, so
        # the jump host's key pin, identity and BatchMode would silently not apply to it.
        jump = node.jump
        hop = ["ssh", *_client_opts(jump, auth, known_hosts_file), "-p", str(jump.port)]
        hop += ["-W", "%h:%p", jump.destination]
        opts += ["-o", "ProxyCommand=" + " ".join(shlex.quote(word) for word in hop)]
    return opts


def _client_opts(endpoint: SshEndpoint, auth: SshAuth, known_hosts_file: Path) -> list[str]:
    checking = "yes" if endpoint.host_key is not None else "accept-new"
    opts = [
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={auth.per_dial_timeout}",
        "-o", f"ConnectionAttempts={auth.dial_error_limit}",
        "-o", f"StrictHostKeyChecking={checking}",
        "-o", f"UserKnownHostsFile={known_hosts_file}",
    ]  # fmt: skip
    if auth.private_key_path is not None:
        opts += ["-i", auth.private_key_path, "-o", "IdentitiesOnly=yes"]
    return opts
