"""One GPU host: how to reach it (commands, Docker), its step scripts and its preflight facts."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.facts import HostFacts, check, gather_facts, receipt_call
from components.remote import (
    QUICK_STEP,
    SshAuth,
    connection_args,
    docker_host,
    docker_ssh_opts,
    script_call,
    scripts_bundle,
)
from stacks.nodes import DeploymentPlan, NodePlan, preflight_flags, ray_listen_ports

# Which bundle `<stateDir>/bin` holds (its digest): the scripts' delete checks it.
BUNDLE_MARKER = ".bundle-digest"
FIREWALL_CHAIN = "SPARK-VLLM-RAY"  # firewall.sh's own chain


@dataclass(frozen=True)
class HostArgs:
    plan: DeploymentPlan
    node: NodePlan
    auth: SshAuth
    known_hosts_file: Path
    control_dir: Path


class Host(pulumi.ComponentResource):
    """Connection, Docker provider, installed scripts, and a preflight that fails early, clearly."""

    connection: remote.ConnectionArgs
    facts: HostFacts  # read before anything is planned: which steps' work is still there
    provider: docker.Provider
    scripts: remote.Command
    preflight: remote.Command

    def __init__(self, name: str, args: HostArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:Host", name, None, opts)
        node, plan = args.node, args.plan
        child = pulumi.ResourceOptions(parent=self)
        self.node = node
        self.connection = connection_args(node, args.auth)
        self.facts = gather_facts(node, args.auth, args.known_hosts_file, args.control_dir)
        # Containers bind these directories: one recreated at the same path leaves them bound
        # to the old one, so the containers carry this token and are replaced when it changes.
        self.mounts_step = f"{name}-mounts"
        self.mounts_token = self.facts.token(self.mounts_step)
        self.provider = docker.Provider(
            f"{name}-docker",
            host=docker_host(node),
            ssh_opts=docker_ssh_opts(node, args.auth, args.known_hosts_file, args.control_dir),
            opts=child,
        )
        self.scripts = self._install_scripts(name, plan, child)
        self.preflight = remote.Command(
            f"{name}-preflight",
            connection=self.connection,
            create=_preflight_command(plan, node),
            add_previous_output_in_env=False,
            triggers=[self.scripts.id],
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[self.scripts],
                custom_timeouts=pulumi.CustomTimeouts(create="5m"),
            ),
        )
        self.prepared: list[pulumi.Resource] = [self.preflight]  # checked, firewalled
        if plan.config.fabric.firewall:
            self.prepared.append(self._firewall(name, plan))
        self.register_outputs({"preflight": self.preflight.stdout, "dockerHost": docker_host(node)})

    def recorded(self, command: str, step: str, *checks: str) -> str:
        """`command`, then its receipt on this host (components/facts.py)."""
        return f"{command} && {receipt_call(self.node, step, self.facts.token(step), list(checks))}"

    def recorded_for(
        self, worker: Host, command: str, step: str, fabric: dict[str, str], *checks: str
    ) -> str:
        """`command` run here (the head) for `worker`, then its receipt on the worker."""
        token = worker.facts.token(step)
        receipt = receipt_call(self.node, step, token, list(checks), on=worker.node, fabric=fabric)
        return f"{command} && {receipt}"

    def _firewall(self, name: str, plan: DeploymentPlan) -> remote.Command:
        """Ray's ports reachable on lo and the fabric only (Ray cannot bind to one interface)."""
        flags = {
            "fabric_interface": self.node.fabric_interface,
            "tcp_ports": ",".join(ray_listen_ports(plan, self.node)),
        }
        step = f"{name}-firewall"
        return remote.Command(
            step,
            connection=self.connection,
            create=self.recorded(
                script_call(self.node, "firewall.sh", "apply", **flags),
                step,
                check("firewall", FIREWALL_CHAIN),
            ),
            delete=script_call(self.node, "firewall.sh", "remove", **flags),
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.preflight], custom_timeouts=QUICK_STEP
            ),
        )

    def _install_scripts(
        self, name: str, plan: DeploymentPlan, child: pulumi.ResourceOptions
    ) -> remote.Command:
        """Unpack the step scripts into `<stateDir>/bin`; re-runs only when a script changes.

        A changed bundle is an update (pulumi-command replaces only on `triggers`), which runs
        this create again over the installed files. The delete removes `bin` only while it
        holds this bundle, so the delete of an older bundle never removes a newer one. (A forced
        `pulumi up --replace` of this resource with the same bundle would still lose `bin` to
        the old half's delete: the delete cannot tell two installs of one bundle apart.)
        """
        bundle = scripts_bundle()
        node = self.node
        step = f"{name}-scripts"
        bin_dir = shlex.quote(node.bin_dir)
        marker = shlex.quote(f"{node.bin_dir}/{BUNDLE_MARKER}")
        bound = (node.bin_dir, node.ray_dir, plan.config.model.cache_dir)
        install = (
            f"umask 077 && mkdir -p {' '.join(shlex.quote(d) for d in bound)} && "
            f"chmod 755 {bin_dir} && base64 -d | tar -xzf - -C {bin_dir} && "
            f"echo {bundle.digest} > {marker}"
        )
        receipts = (
            receipt_call(node, step, self.facts.token(step), [check("sha256sums", node.bin_dir)]),
            receipt_call(
                node, self.mounts_step, self.mounts_token, [check("mark", d) for d in bound]
            ),
        )
        marks = " ".join(shlex.quote(f"{d}/.spark-vllm-mark.{self.mounts_step}") for d in bound)
        receipts_dir = shlex.quote(f"{node.state_dir}/receipts")
        return remote.Command(
            step,
            connection=self.connection,
            create=" && ".join([install, *receipts, f"echo {bundle.digest}"]),
            # The receipts go with the scripts (every other step of this host ran before).
            delete=(
                f'if [ "$(cat {marker} 2>/dev/null)" = {bundle.digest} ]; then '
                f"rm -rf {bin_dir} {receipts_dir} && rm -f {marks}; fi"
            ),
            stdin=bundle.archive_b64,
            logging=remote.Logging.STDERR,
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(custom_timeouts=pulumi.CustomTimeouts(create="2m"))
            ),
        )


def _preflight_command(plan: DeploymentPlan, node: NodePlan) -> str:
    return script_call(node, "preflight.sh", **preflight_flags(plan, node))
