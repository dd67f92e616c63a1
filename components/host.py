"""One GPU host: how to reach it (commands, Docker), what it still has (facts), its step scripts
and its preflight."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.connection import connection_args, docker_host, docker_ssh_opts
from components.facts import HostFacts
from components.graph import Walk
from stacks.credentials import SshAuth
from stacks.plan.cluster import NodePlan
from stacks.plan.names import docker_of, preflight_of, scripts_of


@dataclass(frozen=True)
class HostArgs:
    node: NodePlan
    auth: SshAuth
    known_hosts_file: Path
    control_dir: Path
    facts: HostFacts  # read before anything is planned (components/facts.py gather_facts)
    walk: Walk


class Host(pulumi.ComponentResource):
    """Connection, Docker provider, installed scripts, and a preflight that fails early, clearly."""

    node: NodePlan
    connection: remote.ConnectionArgs
    facts: HostFacts  # which steps' work is still there
    provider: docker.Provider
    scripts: remote.Command
    preflight: remote.Command

    def __init__(self, name: str, args: HostArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:Host", name, None, opts)
        node = args.node
        self.node = node
        self.connection = connection_args(node, args.auth)
        self.facts = args.facts
        self.provider = docker.Provider(
            docker_of(name),
            host=docker_host(node),
            ssh_opts=docker_ssh_opts(node, args.auth, args.known_hosts_file, args.control_dir),
            opts=pulumi.ResourceOptions(parent=self),
        )
        args.walk.add_host(self)
        args.walk.build(name, parent=self)
        self.scripts = args.walk.step(scripts_of(node.name))
        self.preflight = args.walk.step(preflight_of(node.name))
        self.register_outputs({"preflight": self.preflight.stdout, "dockerHost": docker_host(node)})
