"""Network namespaces, bridges, veth links and routes of a lab.

Layout (bastion topology):

    root ns  <prefix>-out ──veth── outside0  bastion  mgmt0 ──┐
                                                               br-mgmt (in netns <prefix>-sw)
                                  spark1..N  mgmt0 ────────────┘
                                  spark1..N  <fabric if> ───── br-fabric (same switch netns)

In jump topology the outside link ends in the head instead of a bastion, and the root namespace
routes only the head's mgmt address over it.
"""

from __future__ import annotations

from pathlib import Path

from lab.proc import LabError, ok, run
from lab.spec import MGMT_IFNAME, OUTSIDE_IFNAME, LabSpec

MGMT_BRIDGE = "br-mgmt"
FABRIC_BRIDGE = "br-fabric"
NETNS_DIR = Path("/run/netns")


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def ip(*args: str, netns: str | None = None, what: str = "") -> None:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    run(argv, timeout=20, what=what or "ip " + " ".join(args))


def add_netns(name: str) -> None:
    if not netns_exists(name):
        run(["ip", "netns", "add", name], timeout=20, what=f"create netns {name}")
    ip("link", "set", "lo", "up", netns=name, what=f"{name}: loopback up")


def create_switch(spec: LabSpec) -> None:
    """One netns holds both bridges, so neither the machine nor a host can bypass them."""
    sw = spec.switch_netns
    add_netns(sw)
    for bridge in (MGMT_BRIDGE, FABRIC_BRIDGE):
        ip("link", "add", bridge, "type", "bridge", netns=sw, what=f"{sw}: create {bridge}")
        ip("link", "set", bridge, "up", netns=sw)


def attach(spec: LabSpec, node: str, bridge: str, ifname: str, cidr: str) -> None:
    """veth from node's netns (named ifname there) to a bridge port in the switch netns."""
    sw = spec.switch_netns
    port = ("m-" if bridge == MGMT_BRIDGE else "f-") + node
    ns = spec.netns(node)
    ip(
        "link",
        "add",
        port,
        "type",
        "veth",
        "peer",
        "name",
        ifname,
        "netns",
        ns,
        netns=sw,
        what=f"{node}: create {ifname} on {bridge}",
    )
    ip("link", "set", port, "master", bridge, "up", netns=sw)
    ip("addr", "add", cidr, "dev", ifname, netns=ns, what=f"{node}: address {cidr} on {ifname}")
    ip("link", "set", ifname, "up", netns=ns)


def create_outside_link(spec: LabSpec, far_node: str) -> None:
    """The only link from this machine into the lab: to the bastion, or to the head (jump)."""
    ns = spec.netns(far_node)
    plen = spec.outside_net.prefixlen
    ip(
        "link",
        "add",
        spec.root_ifname,
        "type",
        "veth",
        "peer",
        "name",
        OUTSIDE_IFNAME,
        "netns",
        ns,
        what=f"create outside link {spec.root_ifname} <-> {far_node}",
    )
    ip("addr", "add", f"{spec.outside_root_ip}/{plen}", "dev", spec.root_ifname)
    ip("link", "set", spec.root_ifname, "up")
    ip("addr", "add", f"{spec.outside_far_ip}/{plen}", "dev", OUTSIDE_IFNAME, netns=ns)
    ip("link", "set", OUTSIDE_IFNAME, "up", netns=ns)


def root_routes(spec: LabSpec) -> list[list[str]]:
    """Routes this machine gets. The unreachable ones keep lab traffic off the default route,
    so a host that must not be reachable fails fast instead of leaking to the real network."""
    routes = [
        ["unreachable", str(spec.mgmt_net)],
        ["unreachable", str(spec.fabric_net)],
    ]
    if spec.topology == "jump":
        routes.append([f"{spec.host_mgmt_ip(0)}/32", "via", spec.outside_far_ip])
    return routes


def add_root_routes(spec: LabSpec) -> None:
    for route in root_routes(spec):
        ip("route", "replace", *route, what=f"root ns: route {' '.join(route)}")


def delete_root_routes(spec: LabSpec) -> None:
    for route in root_routes(spec):
        ok(["ip", "route", "del", *route])


def tbf_shaping(ifname: str, rate: str) -> list[str]:
    """`tc` shaping ifname's egress to rate (e.g. "1gbit"): the lab's one way to slow a link."""
    return ["tc", "qdisc", "replace", "dev", ifname, "root", "tbf",
            "rate", rate, "burst", "256kb", "latency", "50ms"]  # fmt: skip


def shape_fabric(spec: LabSpec, node: str, ifname: str) -> None:
    """Optional link speed on the fabric so transfer tests see realistic timings."""
    if not spec.fabric_rate:
        return
    run(
        [
            "nsenter",
            f"--net={NETNS_DIR / spec.netns(node)}",
            "--",
            *tbf_shaping(ifname, spec.fabric_rate),
        ],
        timeout=20,
        what=f"{node}: shape {ifname} to {spec.fabric_rate}",
    )


def build_network(spec: LabSpec) -> None:
    create_switch(spec)
    plen_m, plen_f = spec.mgmt_net.prefixlen, spec.fabric_net.prefixlen
    if spec.topology == "bastion":
        add_netns(spec.netns("bastion"))
        attach(spec, "bastion", MGMT_BRIDGE, MGMT_IFNAME, f"{spec.bastion_mgmt_ip}/{plen_m}")
    for i, name in enumerate(spec.host_names):
        add_netns(spec.netns(name))
        attach(spec, name, MGMT_BRIDGE, MGMT_IFNAME, f"{spec.host_mgmt_ip(i)}/{plen_m}")
        fabric_if = spec.fabric_ifname(i)
        attach(spec, name, FABRIC_BRIDGE, fabric_if, f"{spec.host_fabric_ip(i)}/{plen_f}")
        shape_fabric(spec, name, fabric_if)
    far = "bastion" if spec.topology == "bastion" else spec.host_names[0]
    create_outside_link(spec, far)
    add_root_routes(spec)


def lab_netns_names(spec: LabSpec) -> list[str]:
    """Every netns of this prefix that exists, including leftovers of an earlier, larger run."""
    if not NETNS_DIR.is_dir():
        return []
    mine = f"{spec.prefix}-"
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(mine))


def netns_pids(name: str) -> list[int]:
    result = run(["ip", "netns", "pids", name], timeout=20, check=False)
    return [int(tok) for tok in result.stdout.split()]


def netns_empty(name: str) -> bool:
    return not netns_pids(name)


def delete_network(spec: LabSpec) -> None:
    """Deleting a netns destroys its veth ends, and with them the peers and bridges."""
    ok(["ip", "link", "del", spec.root_ifname])
    for name in lab_netns_names(spec):
        if not ok(["ip", "netns", "del", name]):
            raise LabError(f"delete netns {name}: failed (processes left: {netns_pids(name)})")
    delete_root_routes(spec)
