"""The firewall: every port the cluster listens on (Ray's, vLLM's, torch's rendezvous), and every
port of the fabric's addresses and loopback's, accepted on loopback and the fabric only, IPv4 and
IPv6, kept in place by a guard container on each host. Connections already established pass (a
mistake never cuts the SSH session that could mend it); each deployment keeps a chain of its own
under one parent chain that every deployment on the host shares (components/scripts/firewall.sh).

Why a container (components/scripts/firewall.sh): it needs no root and no sudo, only the Docker
access the deployment needs anyway (CAP_NET_ADMIN in the host's network namespace, the host's
own iptables through a read-only view of its root), and Docker starts it again at boot, so the
rules come back after a reboot with no operator. Every Ray and vLLM container starts through a
gate (components/scripts/firewall-gate.sh) that waits, bounded, for the guard's marker: this boot,
these rules. Without it nothing that listens starts.
"""

from __future__ import annotations

import hashlib

from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.server_plan import ServerPlan, cluster_listen_ports, servers_on

CONTAINER_FIREWALL_DIR = "/spark-vllm/firewall"  # the host's <state>/firewall: the marker
HOST_ROOT = "/host"  # the guard's read-only view of the host's root (its iptables)
MARKER_NAME = "applied"  # `<boot id> <rules digest>`, refreshed while the rules hold
GUARD_INTERVAL_SECONDS = 10  # how often the guard checks its rules (and repairs them)
MARKER_FRESH_SECONDS = 60  # an older marker: the guard is gone, the rules may be too
GATE_WAIT_SECONDS = 120  # a container's start waits this long for the guard, then exits
READY_WAIT_SECONDS = 90  # the firewall step's wait for the guard's first marker
FIREWALLED_LABEL = "spark-vllm.firewalled"  # on containers behind the gate: the chain


def chain_name(plan: ClusterPlan) -> str:
    """One chain per deployment (two stacks on a host keep their own rules). iptables allows
    28 characters."""
    digest = hashlib.sha256(plan.deployment_id.encode()).hexdigest()[:12]
    return f"SPARK-VLLM-{digest.upper()}"


def guarded_ports(plan: ClusterPlan, node: NodePlan) -> list[str]:
    """Every cluster port on `node` (`6379`, `10002:10999`) with either executor, the server's
    own port, which listens on loopback anyway, and node_exporter's. Both executors' ports: a
    switch of executors then leaves the rules as they are while the old executor's containers
    still run (they are deleted at the end of that `up`)."""
    ports = [p for server in servers_on(plan, node) for p in server_guarded_ports(server, node)]
    # Monitoring's exporter listens on the fabric IP (stacks/plan/monitoring.py): held whether
    # or not monitoring runs, so turning it on or off changes no guard.
    ports.append(str(plan.config.monitoring.node_exporter.port))
    return list(dict.fromkeys(ports))


def server_guarded_ports(plan: ServerPlan, node: NodePlan) -> list[str]:
    """The ports of the plan's server (its slot's) and of Ray on `node`."""
    ports = [*cluster_listen_ports(plan, node, uses_ray=True)]
    ports += [p for p in cluster_listen_ports(plan, node, uses_ray=False) if p not in ports]
    if plan.runs_server(node):
        ports.append(str(plan.server_port))
    return ports


def rules_digest(plan: ServerPlan, node: NodePlan) -> str:
    """What the plan's server needs of the guard's rules on `node`, as a hash: its containers'
    gate accepts only a marker with it. One per server: another server added or removed changes
    the rules, not what a running server's gate was started with (its container stays)."""
    words = [chain_name(plan.cluster), node.fabric_interface, *server_guarded_ports(plan, node)]
    return hashlib.sha256(" ".join(words).encode()).hexdigest()[:16]


def marker_name(plan: ServerPlan) -> str:
    """Where the guard says the plan's server's rules hold (slot 0: MARKER_NAME)."""
    return plan.slot.named(MARKER_NAME)


def guard_markers(plan: ClusterPlan, node: NodePlan) -> list[tuple[str, str]]:
    """Every marker the guard on `node` keeps, and its digest: MARKER_NAME first (slot 0's,
    which the firewall step waits for; the whole rules' when no server holds slot 0), then
    each other server's."""
    by_slot = sorted(servers_on(plan, node), key=lambda server: server.slot.index)
    markers = [(marker_name(server), rules_digest(server, node)) for server in by_slot]
    if not markers or markers[0][0] != MARKER_NAME:
        words = [chain_name(plan), node.fabric_interface, *guarded_ports(plan, node)]
        markers.insert(0, (MARKER_NAME, hashlib.sha256(" ".join(words).encode()).hexdigest()[:16]))
    return markers


def guard_digest(plan: ClusterPlan, node: NodePlan) -> str:
    """MARKER_NAME's digest: what the firewall step waits for."""
    return guard_markers(plan, node)[0][1]


def firewall_dir(node: NodePlan) -> str:
    return f"{node.state_dir}/firewall"


def guard_args(plan: ClusterPlan, node: NodePlan) -> list[str]:
    """firewall.sh's arguments in the guard container."""
    return [
        "guard",
        "--chain",
        chain_name(plan),
        "--fabric-interface",
        node.fabric_interface,
        "--fabric-ip",
        node.fabric_ip,
        "--tcp-ports",
        ",".join(guarded_ports(plan, node)),
        "--digest",
        guard_digest(plan, node),
        *_other_markers(plan, node),
        "--root",
        HOST_ROOT,
        "--dir",
        f"{HOST_ROOT}{firewall_dir(node)}",
        "--interval",
        str(GUARD_INTERVAL_SECONDS),
    ]


def gate_args(plan: ServerPlan, node: NodePlan) -> list[str]:
    """firewall-gate.sh's arguments before `--` and the container's own entrypoint."""
    return [
        f"{CONTAINER_FIREWALL_DIR}/{marker_name(plan)}",
        rules_digest(plan, node),
        str(MARKER_FRESH_SECONDS),
        str(GATE_WAIT_SECONDS),
    ]


def _other_markers(plan: ClusterPlan, node: NodePlan) -> list[str]:
    """`--markers name=digest,...` for every server but slot 0 (none with one server)."""
    others = guard_markers(plan, node)[1:]
    return ["--markers", ",".join(f"{name}={digest}" for name, digest in others)] if others else []
