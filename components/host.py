"""One GPU host: how to reach it (commands, Docker), what it still has (facts), its step scripts
and its preflight."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.bundle import scripts_bundle
from components.connection import connection_args, docker_host, docker_ssh_opts
from components.facts import HostFacts, gather_facts
from components.steps import host_step
from stacks.credentials import SshAuth
from stacks.plan import hosts
from stacks.plan.nodes import DeploymentPlan, NodePlan


@dataclass(frozen=True)
class HostArgs:
    plan: DeploymentPlan
    node: NodePlan
    auth: SshAuth
    known_hosts_file: Path
    control_dir: Path


class Host(pulumi.ComponentResource):
    """Connection, Docker provider, installed scripts, and a preflight that fails early, clearly."""

    node: NodePlan
    connection: remote.ConnectionArgs
    facts: HostFacts  # read before anything is planned: which steps' work is still there
    provider: docker.Provider
    scripts: remote.Command
    preflight: remote.Command
    prepared: list[pulumi.Resource]  # checked: containers may start (after the firewall's)

    def __init__(self, name: str, args: HostArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:Host", name, None, opts)
        node, plan = args.node, args.plan
        self.node = node
        self.connection = connection_args(node, args.auth)
        self.facts = gather_facts(node, args.auth, args.known_hosts_file, args.control_dir)
        # Containers bind these directories: one recreated at the same path leaves them bound
        # to the old one, so the containers carry this token and are replaced when it changes.
        self.mounts_token = self.facts.token(hosts.mounts_step(name))
        self.provider = docker.Provider(
            f"{name}-docker",
            host=docker_host(node),
            ssh_opts=docker_ssh_opts(node, args.auth, args.known_hosts_file, args.control_dir),
            opts=pulumi.ResourceOptions(parent=self),
        )
        bundle = scripts_bundle()
        self.scripts = host_step(
            hosts.install_scripts(plan, name, node, bundle.digest),
            [self],
            parent=self,
            stdin={"scripts-bundle": bundle.archive_b64},
        )
        self.preflight = host_step(
            hosts.preflight(plan, name, node),
            [self],
            parent=self,
            after=[self.scripts],
            triggers=[self.scripts.id],
        )
        self.prepared = [self.preflight]
        self.register_outputs({"preflight": self.preflight.stdout, "dockerHost": docker_host(node)})
