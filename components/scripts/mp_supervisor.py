"""Runs inside a vLLM container with executor mp: starts `vllm serve` and stops it when the
nodes' rendezvous breaks, so that a lost node takes the whole server down cleanly.

    mp_supervisor.py --rendezvous IP:PORT --peers name=IP,... --join-seconds S
                     [--health-url URL] -- vllm serve ...

vLLM's multi-node mode without Ray does not notice by itself (v1/executor/multiproc_executor.py):
the head's worker monitor watches its local worker processes only, so a head whose remote node
died keeps answering /health until a request times out (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS,
300 s), and a headless node whose head died blocks in its dequeue for ever. Every rank holds a
TCP connection to the torch.distributed store at the rendezvous (the head's master port) for as
long as its process group lives; the supervisor reads those connections from the kernel
(/proc/net/tcp and tcp6; the container shares the host's network):

- head (`--health-url`): every peer (worker) must connect within `--join-seconds` of this
  node's store opening (its port listening); once the server answers /health, the connections
  each worker holds then are its ranks: when all of one worker's are gone, that worker's ranks
  died.
- headless node: it must connect within `--join-seconds` of this node's ranks starting (the
  server's first child process that lives on); when it holds none any more, the head's store is
  gone (the head's server stopped or restarted).

Each window counts from the moment this node can join, not from the container's start: before
it, the node is importing and reading its config, which on a loaded host takes longer than the
wait itself (the lab's CI saw a headless node spend 80 of its 120 s there, and the head 90 s
before its store opened, so that both gave up on peers that were still moving). What comes before
is reported every 15 s and bounded by the readiness step's timeout, not here.

Either way the server is stopped (SIGTERM, then SIGKILL) and this exits 1: Docker restarts the
container (unless-stopped) and the nodes meet again at the next rendezvous. A node that cannot
join is named, with the likely cause. SIGTERM (docker stop) is passed on to the server.
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

# No proxy, whatever the environment says (the image's, vllm.env's or the SSH session's
# http_proxy): these requests go to this cluster's own addresses, some with the API key.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

POLL_S = 1.0
REPORT_S = 15.0
STOP_GRACE_S = 20.0
ESTABLISHED = "01"
LISTEN = "0A"
# A child process that lives this long is one of the server's ranks, not a helper it ran and
# waited for (vLLM's CPU platform runs `lscpu`, for one).
RANK_ALIVE_S = 2.0


def say(message: str) -> None:
    print(f"spark-vllm launcher: {message}", file=sys.stderr, flush=True)


def _ipv4(hex_address: str) -> str | None:
    """/proc/net/tcp{,6} addresses: 32-bit words in host order; v6 only when v4-mapped."""
    words = [int(hex_address[i : i + 8], 16) for i in range(0, len(hex_address), 8)]
    packed = b"".join(struct.pack("=I", word) for word in words)
    if len(packed) == 4:
        return str(ipaddress.IPv4Address(packed))
    mapped = ipaddress.IPv6Address(packed).ipv4_mapped
    return str(mapped) if mapped is not None else None


def parse_connections(lines: Iterable[str]) -> list[tuple[str, int, str, int]]:
    """ESTABLISHED TCP connections as (local ip, local port, remote ip, remote port), IPv4 and
    v4-mapped IPv6 (a store listening on [::] accepts IPv4 clients that way)."""
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or fields[3] != ESTABLISHED or ":" not in fields[1]:
            continue
        (local, local_port), (remote, remote_port) = (f.split(":") for f in fields[1:3])
        local_ip, remote_ip = _ipv4(local), _ipv4(remote)
        if local_ip and remote_ip:
            found.append((local_ip, int(local_port, 16), remote_ip, int(remote_port, 16)))
    return found


def parse_listening_ports(lines: Iterable[str]) -> set[int]:
    """The local ports in LISTEN state, of any address family or address."""
    ports = set()
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[3] == LISTEN and ":" in fields[1]:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def tcp_table_lines() -> list[str]:
    lines: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines += handle.readlines()[1:]
        except OSError:
            continue
    return lines


def connections() -> list[tuple[str, int, str, int]]:
    return parse_connections(tcp_table_lines())


def store_open(master_port: int) -> bool:
    """This node's torch.distributed store listens (the head's rank 0 has started it)."""
    return master_port in parse_listening_ports(tcp_table_lines())


def parse_parent(stat: str) -> int:
    """The parent pid in /proc/PID/stat: the fourth field, counted after the command name's
    closing parenthesis (the name itself may hold spaces and parentheses)."""
    return int(stat[stat.rindex(")") + 1 :].split()[1])


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """Every process below `root`, given each process's parent."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def process_parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = parse_parent((entry / "stat").read_text())
            except (OSError, ValueError):
                continue  # gone meanwhile
    return parents


def head_view(master_port: int, peers: dict[str, str]) -> dict[str, set[tuple[str, int]]]:
    """Per peer name: the connections it holds to this node's store."""
    by_ip = {ip: name for name, ip in peers.items()}
    held: dict[str, set[tuple[str, int]]] = {name: set() for name in peers}
    for _, local_port, remote_ip, remote_port in connections():
        if local_port == master_port and remote_ip in by_ip:
            held[by_ip[remote_ip]].add((remote_ip, remote_port))
    return held


def worker_view(master_ip: str, master_port: int) -> set[int]:
    """The local ports this node's ranks connect to the head's store from."""
    return {
        local_port
        for _, local_port, remote_ip, remote_port in connections()
        if (remote_ip, remote_port) == (master_ip, master_port)
    }


def healthy(url: str) -> bool:
    try:
        with DIRECT.open(url, timeout=3) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.master_ip, port = args.rendezvous.rsplit(":", 1)
        self.master_port = int(port)
        self.peers = dict(p.split("=", 1) for p in args.peers.split(",") if p)
        self.join_seconds = float(args.join_seconds)
        self.health_url: str | None = args.health_url
        self.server = subprocess.Popen(args.command)
        self.started = time.monotonic()
        self.stopping = False
        self.reported = 0.0  # when progress was last said (seconds since `started`)
        signal.signal(signal.SIGTERM, self._pass_on)
        signal.signal(signal.SIGINT, self._pass_on)

    def _pass_on(self, signum: int, _frame: object) -> None:
        self.stopping = True
        self.server.send_signal(signum)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def report(self, message: str) -> None:
        """Say how the wait goes, once every REPORT_S."""
        if self.elapsed() - self.reported >= REPORT_S:
            self.reported = self.elapsed()
            say(message)

    def names(self, peers: Iterable[str]) -> str:
        return ", ".join(f"{name} ({self.peers[name]})" for name in sorted(peers))

    def problem(self) -> str | None:
        """None while all is well; else why the server must stop."""
        raise NotImplementedError

    def run(self) -> int:
        while True:
            code = self.server.poll()
            if code is not None:
                return code
            if not self.stopping:
                problem = self.problem()
                if problem is not None:
                    say(problem)
                    self.stop()
                    return 1
            time.sleep(POLL_S)

    def stop(self) -> None:
        self.server.terminate()
        try:
            self.server.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()


class HeadSupervisor(Supervisor):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.seen: set[str] = set()  # peers that joined
        self.ranks: dict[str, set[tuple[str, int]]] | None = None  # frozen once serving
        self.opened: float | None = None  # when this node's store started listening

    def problem(self) -> str | None:
        where = f"the rendezvous at {self.master_ip}:{self.master_port}"
        if self.opened is None:
            if not store_open(self.master_port):
                self.report(
                    f"this node's ranks are starting ({self.elapsed():.0f}s); {where} opens "
                    "once they are up"
                )
                return None
            self.opened = time.monotonic()
            say(f"{where} is open: waiting for {self.names(self.peers)} to join")
        held = head_view(self.master_port, self.peers)
        if self.ranks is not None:
            gone = [name for name, ranks in self.ranks.items() if ranks and not ranks & held[name]]
            if gone:
                return (
                    f"{self.names(gone)} left {where} (its ranks stopped): stopping this server "
                    "so that every node restarts and meets again (Docker restarts it)"
                )
            return None
        joined = {name for name, conns in held.items() if conns}
        left = self.seen - joined
        if left:
            return (
                f"{self.names(left)} left {where} before the server was ready: stopping it so "
                "that every node starts again together"
            )
        self.seen |= joined
        missing = set(self.peers) - joined
        waited = time.monotonic() - self.opened
        if not missing:
            if self.health_url and healthy(self.health_url):
                self.ranks = held
                say(f"every node joined {where} and the server answers: watching its ranks")
            return None
        if waited >= self.join_seconds:
            return (
                f"{self.names(missing)} did not join {where} within {self.join_seconds:.0f}s "
                "of its opening: stopping this server (Docker restarts it). Likely cause: that "
                "node's vLLM "
                "container is not running or failed (see its log), the fabric or a firewall "
                "blocks the port, or it runs another world size or image"
            )
        self.report(
            f"waiting for {self.names(missing)} to join {where} "
            f"({waited:.0f}s of {self.join_seconds:.0f}s)"
        )
        return None


class HeadlessSupervisor(Supervisor):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.joined = False
        self.children_seen: dict[int, float] = {}  # the server's child processes, first seen
        self.ranks_started: float | None = None

    def ranks_up(self) -> bool:
        """The server has a child process that has lived RANK_ALIVE_S: its ranks started."""
        now = time.monotonic()
        alive = descendants(self.server.pid, process_parents())
        self.children_seen = {pid: self.children_seen.get(pid, now) for pid in alive}
        return any(now - seen >= RANK_ALIVE_S for seen in self.children_seen.values())

    def problem(self) -> str | None:
        held = worker_view(self.master_ip, self.master_port)
        where = f"the rendezvous at {self.master_ip}:{self.master_port}"
        head = self.names(self.peers) or self.master_ip
        if held:
            if not self.joined:
                say(f"joined {where} on {head}")
            self.joined = True
            return None
        if self.joined:
            return (
                f"{where} on {head} is gone (the server there stopped or restarted): stopping "
                "this node's ranks so that they join the next one (Docker restarts them)"
            )
        if self.ranks_started is None:
            if not self.ranks_up():
                self.report(
                    f"this node's ranks are starting ({self.elapsed():.0f}s); they join {where} "
                    "once up"
                )
                return None
            self.ranks_started = time.monotonic()
        waited = time.monotonic() - self.ranks_started
        if waited >= self.join_seconds:
            return (
                f"could not join {where} on {head} within {self.join_seconds:.0f}s of this "
                "node's ranks starting. Likely cause: the head's server is not running (see its "
                "log), or the fabric or a firewall blocks the port"
            )
        self.report(f"waiting to join {where} ({waited:.0f}s of {self.join_seconds:.0f}s)")
        return None


def main(argv: list[str]) -> int:
    if "--" not in argv:
        say("mp_supervisor.py needs `-- vllm serve ...` (a bug in spark-vllm: please report it)")
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="mp_supervisor.py")
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--peers", default="")
    parser.add_argument("--join-seconds", required=True)
    parser.add_argument("--health-url", default=None)
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1 :]
    supervisor = HeadSupervisor(args) if args.health_url else HeadlessSupervisor(args)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
