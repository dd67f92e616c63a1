"""The firewall guard (components/scripts/firewall.sh) run for real, with the host's iptables, in
a network namespace of its own: a host with a management link to a neighbour and a fabric
interface, two deployments' guards side by side, and the neighbour probing as an attacker on the
LAN would, with the route to the fabric subnet a neighbour can add.

What it shows (issue 36): the fabric's addresses are closed to other interfaces on every port
(Linux's weak host model otherwise delivers them), two guards never reopen each other's ports
(neither rebuilds its chain once both hold), a connection open before the guard keeps working,
and each guard's removal takes only its own chain (the parent last).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab.conftest import require_lab_prerequisites

pytestmark = pytest.mark.lab

SCRIPT = Path(__file__).resolve().parents[2] / "components" / "scripts" / "firewall.sh"
MGMT_HOST, MGMT_NEIGHBOUR = "10.99.1.2", "10.99.1.1"
MGMT6_HOST, MGMT6_NEIGHBOUR = "fd99:1::2", "fd99:1::1"
FABRIC_IP, FABRIC6 = "10.99.2.2", "fd99:2::2"
FABRIC_IF = "fab0"
# Stack A holds Ray's and vLLM's kinds of ports; stack B another; 45000 is the host's own
# service (every address), which no guard may close; 40001 listens on the fabric's addresses
# only (as NCCL's and Gloo's bootstrap sockets do, on ports no list names).
A_PORTS, B_PORT, OWN_PORT, FABRIC_ONLY_PORT = "6379,10002:10999", 7000, 45000, 40001
INTERVAL = 1

ECHO_SERVER = """
import socket, sys, threading
def serve(family, address, port):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if address == "::" else 1)
    s.bind((address, port)); s.listen(64)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()
def echo(conn):
    while data := conn.recv(64):
        conn.sendall(data)
for spec in sys.argv[1:]:
    family, address, port = spec.split(",")
    fam = socket.AF_INET6 if family == "6" else socket.AF_INET
    threading.Thread(target=serve, args=(fam, address, int(port)), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""

# Connects, then echoes a word each time the file it is given appears (and removes it): a TCP
# connection opened before the guard, checked after.
HELD_CLIENT = """
import os, socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
print("connected", flush=True)
while True:
    if os.path.exists(sys.argv[3]):
        s.sendall(b"ping")
        print("echo", s.recv(4).decode(), flush=True)
        os.remove(sys.argv[3])
    time.sleep(0.1)
"""


@dataclass
class Netns:
    host: str
    neighbour: str

    def run(self, where: str, command: str, check: bool = True) -> str:
        done = subprocess.run(
            ["ip", "netns", "exec", where, "bash", "-c", command],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"{where}: {command}: {done.stderr}")
        return done.stdout

    def iptables(self, family: str = "iptables") -> str:
        return self.run(self.host, f"{family} -w 10 -S")

    def open_ports(self, targets: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The (address, port) pairs the neighbour can connect to (in parallel, 1 s each)."""
        probes = " ".join(
            f"(timeout 1 bash -c 'exec 3<>/dev/tcp/{address}/{port}' 2>/dev/null "
            f"&& echo {address},{port}) &"
            for address, port in targets
        )
        out = self.run(self.neighbour, f"{probes} wait", check=False)
        found = [line.rsplit(",", 1) for line in out.split()]
        return sorted((address, int(port)) for address, port in found)


@pytest.fixture
def netns() -> Iterator[Netns]:
    require_lab_prerequisites()
    tag = f"fwg{os.getpid() % 100000}"
    spaces = Netns(f"{tag}h", f"{tag}n")
    setup = [
        f"ip netns add {spaces.host}",
        f"ip netns add {spaces.neighbour}",
        f"ip link add {tag}a netns {spaces.host} type veth peer name {tag}b "
        f"netns {spaces.neighbour}",
        f"ip -n {spaces.host} link set lo up",
        f"ip -n {spaces.neighbour} link set lo up",
        f"ip -n {spaces.host} link set {tag}a name mgmt0",
        f"ip -n {spaces.host} addr add {MGMT_HOST}/24 dev mgmt0",
        f"ip -n {spaces.host} addr add {MGMT6_HOST}/64 dev mgmt0 nodad",
        f"ip -n {spaces.host} link set mgmt0 up",
        f"ip -n {spaces.neighbour} addr add {MGMT_NEIGHBOUR}/24 dev {tag}b",
        f"ip -n {spaces.neighbour} addr add {MGMT6_NEIGHBOUR}/64 dev {tag}b nodad",
        f"ip -n {spaces.neighbour} link set {tag}b up",
        # The fabric: a veth whose far end stays in the host (no dummy module in every kernel).
        f"ip -n {spaces.host} link add {FABRIC_IF} type veth peer name {FABRIC_IF}p",
        f"ip -n {spaces.host} link set {FABRIC_IF}p up",
        f"ip -n {spaces.host} addr add {FABRIC_IP}/24 dev {FABRIC_IF}",
        f"ip -n {spaces.host} addr add {FABRIC6}/64 dev {FABRIC_IF} nodad",
        f"ip -n {spaces.host} link set {FABRIC_IF} up",
        # What a neighbour adds: the fabric subnet through the host's management address.
        f"ip -n {spaces.neighbour} route add {FABRIC_IP}/32 via {MGMT_HOST}",
        f"ip -n {spaces.neighbour} -6 route add {FABRIC6}/128 via {MGMT6_HOST}",
        # Connection tracking on from the start, as on a host where Docker runs (its NAT rules
        # use it): a fresh namespace tracks nothing until a rule asks, and a session it did not
        # see start is NEW to it (nf_conntrack_proto_tcp.c picks a mid-stream packet up so).
        f"ip netns exec {spaces.host} iptables -t nat -A POSTROUTING -o {FABRIC_IF}p -j MASQUERADE",
    ]
    try:
        for command in setup:
            subprocess.run(command.split(), check=True, capture_output=True, timeout=30)
        yield spaces
    finally:
        for space in (spaces.host, spaces.neighbour):
            subprocess.run(
                ["bash", "-c", f"ip netns pids {space} | xargs -r kill -9"], capture_output=True
            )
            subprocess.run(["ip", "netns", "del", space], capture_output=True)


def start(netns: Netns, where: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", where, *argv], stdout=out, stderr=subprocess.STDOUT
        )


def wait_for(predicate: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {seconds:.0f} s: {what}")


def guard(netns: Netns, chain: str, ports: str, state: Path) -> subprocess.Popen[bytes]:
    state.mkdir()
    argv = ["bash", str(SCRIPT), "guard", "--chain", chain, "--fabric-interface", FABRIC_IF,
            "--fabric-ip", FABRIC_IP, "--tcp-ports", ports, "--digest", "d1", "--root", "/",
            "--dir", str(state), "--interval", str(INTERVAL)]  # fmt: skip
    return start(netns, netns.host, argv, state.parent / f"{chain}.log")


def remove(netns: Netns, chain: str, state: Path) -> None:
    netns.run(netns.host, f"bash {SCRIPT} remove --chain {chain} --root / --dir {state}")


def test_two_guards_close_the_fabric_and_their_ports_and_never_reopen_them(
    netns: Netns, tmp_path: Path
) -> None:
    listeners = [
        "4,0.0.0.0,6379", "4,0.0.0.0,10500", f"4,0.0.0.0,{B_PORT}", f"4,0.0.0.0,{OWN_PORT}",
        f"4,{FABRIC_IP},{FABRIC_ONLY_PORT}", f"6,{FABRIC6},{FABRIC_ONLY_PORT}",
        "6,::,16379",
    ]  # fmt: skip
    server = start(netns, netns.host, ["python3", "-c", ECHO_SERVER, *listeners],
                   tmp_path / "server.log")  # fmt: skip
    wait_for(lambda: "listening" in (tmp_path / "server.log").read_text(), 10, "listeners")
    fabric = [(FABRIC_IP, FABRIC_ONLY_PORT), (FABRIC6, FABRIC_ONLY_PORT), (FABRIC_IP, OWN_PORT)]
    ours = [(MGMT_HOST, 6379), (MGMT_HOST, 10500), (MGMT_HOST, B_PORT), (MGMT6_HOST, 16379)]
    own = [(MGMT_HOST, OWN_PORT)]
    # Without the guards, the neighbour reaches them all: the fabric's sockets too, through the
    # management link (the weak host model).
    assert netns.open_ports(fabric + ours) == sorted(fabric + ours)

    # A session open before the guards (the SSH session that would fix a mistake, here on a
    # port the guard will drop) keeps working after them.
    poke = tmp_path / "poke"
    held = start(netns, netns.neighbour, ["python3", "-c", HELD_CLIENT, MGMT_HOST, "6379",
                                          str(poke)], tmp_path / "held.log")  # fmt: skip
    wait_for(lambda: "connected" in (tmp_path / "held.log").read_text(), 10, "the held session")

    # An older release's layout: INPUT jumps to stack A's chain directly.
    old_layout = ("iptables -N SPARK-VLLM-A && iptables -A SPARK-VLLM-A -p tcp --dport 6379 "
                  "-j DROP && iptables -I INPUT 1 -j SPARK-VLLM-A")  # fmt: skip
    netns.run(netns.host, old_layout)
    state_a, state_b = tmp_path / "a", tmp_path / "b"
    guards = [
        guard(netns, "SPARK-VLLM-A", f"{A_PORTS},16379", state_a),
        guard(netns, "SPARK-VLLM-B", str(B_PORT), state_b),
    ]
    try:
        for state in (state_a, state_b):
            wait_for(lambda s=state: (s / "applied").exists(), 30, f"{state.name}'s marker")
        # Both hold, and no probe gets through from then on. Two guards starting at once may
        # both insert the parent's jump (the next pass moves one away, in one transaction); once
        # settled, neither rebuilds its chain again: two that fought for INPUT's first rule
        # flushed and rebuilt theirs on every pass, their ports open meanwhile.
        for _ in range(4):
            assert netns.open_ports(ours) == [], netns.iptables()
            time.sleep(0.5)
        settled = [(tmp_path / f"SPARK-VLLM-{x}.log").read_text() for x in "AB"]
        for _ in range(4):
            assert netns.open_ports(ours) == [], netns.iptables()
            time.sleep(0.5)
        for name, before in zip("AB", settled, strict=True):
            log = (tmp_path / f"SPARK-VLLM-{name}.log").read_text()
            assert "applying it again" not in log[len(before) :], log
        assert netns.open_ports(fabric) == [], netns.iptables("ip6tables")
        assert netns.open_ports(own) == own  # the host's own service: no guard's business
        rules = netns.iptables()
        assert rules.count("-A INPUT -j SPARK-VLLM\n") == 1, rules
        assert "-A INPUT -j SPARK-VLLM-A" not in rules, rules  # the old layout's jump is gone
        assert "-A SPARK-VLLM -j SPARK-VLLM-A" in rules and "-A SPARK-VLLM -j SPARK-VLLM-B" in rules
        # Loopback's addresses from another interface (a host with route_localnet would take
        # them; a neighbour's own kernel never sends them, so the rule is read, not probed).
        assert "-A SPARK-VLLM-A -d 127.0.0.0/8 -j DROP" in rules, rules
        # Established connections pass before any drop: the lock-out's last line.
        chain = [r for r in rules.splitlines() if r.startswith("-A SPARK-VLLM-A ")]
        assert chain[1] == "-A SPARK-VLLM-A -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"

        poke.touch()
        wait_for(lambda: "echo ping" in (tmp_path / "held.log").read_text(), 10,
                 "the session opened before the guard still answers")  # fmt: skip

        # Stack A leaves: its ports open again (nothing of A's listens on a real host by then),
        # stack B's stay closed, and the parent stays while B is in it.
        remove(netns, "SPARK-VLLM-A", state_a)
        assert netns.open_ports([(MGMT_HOST, 6379), (MGMT_HOST, B_PORT)]) == [(MGMT_HOST, 6379)]
        rules = netns.iptables()
        assert "SPARK-VLLM-A" not in rules and "-A INPUT -j SPARK-VLLM\n" in rules, rules
        remove(netns, "SPARK-VLLM-B", state_b)
        for family in ("iptables", "ip6tables"):
            assert "SPARK-VLLM" not in netns.iptables(family), family
        assert netns.open_ports([(MGMT_HOST, B_PORT)]) == [(MGMT_HOST, B_PORT)]
    finally:
        for process in (*guards, held, server):
            process.kill()
            process.wait()
