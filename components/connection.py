"""How this machine reaches a host: pulumi-command's SSH connection, and the OpenSSH options
of the Docker provider (and of the facts read, which uses the same route)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from pulumi_command import remote

from stacks.credentials import SshAuth
from stacks.plan.cluster import NodePlan, SshEndpoint


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
    # With ssh.useAgent no agentSocketPath: pulumi-command then dials SSH_AUTH_SOCK from the
    # environment it runs in, and the path (new at every login) stays out of every step's
    # state, where it would plan an update of each step per session and leave deletes a dead one.
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
        "-o", ssh_option("ControlPath", f"{control_dir}/%C"),
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


def ssh_option(name: str, value: object) -> str:
    """`name=value` as OpenSSH reads an option (`-o`): a value holding a space, a quote or a
    backslash is double-quoted with `\\` and `"` escaped (misc.c argv_split), so it stays one
    word (lib.sh's ssh_option_value does the same on the hosts)."""
    text = str(value)
    if re.search(r"[\s\"'\\]", text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{name}={text}"


def _client_opts(endpoint: SshEndpoint, auth: SshAuth, known_hosts_file: Path) -> list[str]:
    checking = "yes" if endpoint.host_key is not None else "accept-new"
    opts = [
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={auth.per_dial_timeout}",
        "-o", f"ConnectionAttempts={auth.dial_error_limit}",
        "-o", f"StrictHostKeyChecking={checking}",
        "-o", ssh_option("UserKnownHostsFile", known_hosts_file),
    ]  # fmt: skip
    if auth.private_key_path is not None:
        opts += ["-i", auth.private_key_path, "-o", "IdentitiesOnly=yes"]
    return opts
