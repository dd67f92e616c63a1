"""Multi-node serving without Ray, as vLLM's multiprocessing executor does it (vLLM >= 0.11.1).

Every node runs `vllm serve` with the same parallel sizes and `--nnodes N --node-rank R
--master-addr HEAD --master-port P`; the nodes with rank > 0 add `--headless` and serve no API.
In vLLM each rank joins one torch.distributed process group whose init method is
`tcp://master_addr:master_port` (vllm/distributed/parallel_state.py): a TCPStore that node rank
0 hosts. Each node starts `world_size // nnodes` local workers (multiproc_executor.py).

The stand-in keeps that shape over plain TCP: node rank 0 listens on the master port (on every
interface, as a TCPStore server does), each headless node connects (retrying until the
rendezvous timeout, as a TCPStore client does), reports its ranks (world size, node rank, IP,
Gloo interface, snapshot) and keeps the connection for its lifetime. Node rank 0 checks every
report and serves only once all nodes have joined.

What real vLLM does NOT do, and so neither does the stand-in: notice a remote node that died
while the server is idle (its worker monitor watches local processes only), or notice, on a
headless node, that the head died (its workers block in a dequeue that never returns). A
request after a remote node died fails, as the collective would. spark-vllm's launcher watches
the rendezvous connections to take the server down cleanly (components/scripts/mp_supervisor.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import threading
import time
from dataclasses import asdict
from typing import Any

from vllm_standin import VERSION
from vllm_standin.config import ServeConfig
from vllm_standin.engine import (
    EngineDeadError,
    StartupError,
    TerminationRequested,
    log_ranks,
    validate_ranks,
)
from vllm_standin.model_files import SnapshotReport
from vllm_standin.worker import RankReport, RankWorker, vllm_get_ip

logger = logging.getLogger("vllm_standin.multiproc")

JOIN_LOG_INTERVAL_S = 10.0
CONNECT_RETRY_S = 1.0


def validate_multinode(config: ServeConfig) -> None:
    """The checks vLLM makes on the parallel config before any work (arg_utils.py asserts,
    config/parallel.py's backend check), with their messages."""
    if config.nnodes < 1:
        raise StartupError(f"AssertionError: nnodes={config.nnodes} must be at least 1.")
    if config.nnodes > 1 and config.executor_backend not in ("mp", "uni", "external_launcher"):
        raise StartupError(
            "ValueError: nnodes > 1 can only be set when distributed executor backend is mp, "
            "uni or external_launcher."
        )
    if config.world_size % config.nnodes != 0:
        raise StartupError(
            f"AssertionError: world_size={config.world_size} must be divisible by "
            f"nnodes={config.nnodes}."
        )
    if not 0 <= config.node_rank < config.nnodes:
        raise StartupError(
            f"AssertionError: node_rank={config.node_rank} must be less than "
            f"nnodes={config.nnodes}."
        )
    if config.nnodes > 1 and config.node_rank > 0 and not config.headless:
        raise StartupError(
            f"AssertionError: node rank {config.node_rank} is a follower node: run it with "
            "--headless (collective_rpc should not be called on follower node)"
        )
    if config.headless and config.node_rank == 0:
        raise StartupError(
            "--headless on node rank 0 runs data-parallel engine cores without an API server, "
            "which the lab stand-in does not model"
        )


def check_host_ip() -> None:
    """Each node's message queues bind on its VLLM_HOST_IP (vllm/utils/network_utils.py
    get_ip()): an address this node does not have fails there, as ZMQ's bind would."""
    host_ip = os.environ.get("VLLM_HOST_IP")
    if not host_ip:
        return
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind((host_ip, 0))
    except OSError as error:
        raise StartupError(
            f"zmq.error.ZMQError: {error.strerror} (addr='tcp://{host_ip}:0'): VLLM_HOST_IP="
            f"{host_ip} is not an address of {socket.gethostname()}"
        ) from None
    finally:
        probe.close()


def local_ranks(config: ServeConfig) -> list[RankReport]:
    """This node's workers: global ranks local_world_size * node_rank onwards."""
    check_host_ip()
    per_node = config.world_size // config.nnodes
    first = per_node * config.node_rank
    return [
        RankWorker(rank, config.model, config.revision, config.compile_key).describe(
            node_ip=vllm_get_ip()
        )
        for rank in range(first, first + per_node)
    ]


def _send(connection: socket.socket, message: dict[str, Any]) -> None:
    connection.sendall((json.dumps(message) + "\n").encode())


def _report_to_json(report: RankReport) -> dict[str, Any]:
    return asdict(report)


def _report_from_json(data: dict[str, Any]) -> RankReport:
    sent = data["snapshot"]
    snapshot = {
        **sent,
        "weights": tuple((name, size) for name, size in sent["weights"]),
        "dangling": tuple(sent["dangling"]),
    }
    return RankReport(**{**data, "snapshot": SnapshotReport(**snapshot)})


class MultiNodeEngine:
    """Node rank 0: its own ranks, the rendezvous server, and every headless node's ranks."""

    def __init__(
        self, config: ServeConfig, driver_snapshot: SnapshotReport, stop_requested: threading.Event
    ) -> None:
        self.config = config
        self.driver_snapshot = driver_snapshot
        self.stop_requested = stop_requested
        self.ranks: list[RankReport] = []
        self.nodes: dict[int, socket.socket] = {}  # node rank -> its rendezvous connection
        self.listener: socket.socket | None = None
        self.lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"tcp://{self.config.master_addr}:{self.config.master_port}"

    def start(self) -> None:
        config = self.config
        own = local_ranks(config)
        self.listener = self._listen()
        logger.info(
            "Multi-node multiproc executor: node rank 0 of %d, world_size=%d, %d local rank(s); "
            "process group at %s",
            config.nnodes,
            config.world_size,
            len(own),
            self.address,
        )
        remote = self._gather(config.nnodes - 1)
        self.ranks = sorted([*own, *remote], key=lambda report: report.rank)
        log_ranks(self.ranks)
        try:
            validate_ranks(self.ranks, self.driver_snapshot)
        except StartupError as error:
            self._tell_nodes({"error": str(error)})
            raise
        self._tell_nodes({"ok": True})
        # Like a TCPStore server, the port stays open; a late joiner is accepted and waits.
        threading.Thread(target=self._accept_late_joiners, daemon=True).start()

    def _listen(self) -> socket.socket:
        """As torch's TCPStore server: on every address, IPv6 and IPv4 (`[::]`, dual-stack)
        where the host has IPv6 (c10d socket.cpp tries IPv6 first), else IPv4 only."""
        ipv6 = socket.has_ipv6 and os.path.exists("/proc/net/if_inet6")
        listener = socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if ipv6:
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            listener.bind(("::" if ipv6 else "", self.config.master_port))
        except OSError as error:
            listener.close()
            raise StartupError(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on "
                f"any local network address. port: {self.config.master_port}, useIpv6: 0, "
                f"code: -{error.errno}, name: {error.strerror}"
            ) from None
        listener.listen(64)
        listener.settimeout(1.0)
        return listener

    def _gather(self, expected: int) -> list[RankReport]:
        assert self.listener is not None
        started = time.monotonic()
        deadline = started + self.config.rendezvous_timeout_s
        next_log = started
        reports: list[RankReport] = []
        while len(self.nodes) < expected:
            if self.stop_requested.is_set():
                raise TerminationRequested()
            now = time.monotonic()
            if now >= deadline:
                raise StartupError(
                    f"torch.distributed.DistStoreError: Timed out after "
                    f"{self.config.rendezvous_timeout_s:g} seconds waiting for clients. "
                    f"{len(self.nodes) + 1}/{self.config.nnodes} nodes joined the process "
                    f"group at {self.address} (missing node ranks "
                    f"{sorted(set(range(1, self.config.nnodes)) - set(self.nodes))})"
                )
            if now >= next_log:
                next_log = now + JOIN_LOG_INTERVAL_S
                logger.info(
                    "Waiting for %d remote node(s) to join the process group at %s (%.0f s)",
                    expected - len(self.nodes),
                    self.address,
                    now - started,
                )
            try:
                connection, peer = self.listener.accept()
            except TimeoutError:
                continue
            joined = self._hello(connection, peer)
            if joined is not None:
                reports.extend(joined)
        return reports

    def _hello(self, connection: socket.socket, peer: tuple[str, int]) -> list[RankReport] | None:
        connection.settimeout(30)
        try:
            line = connection.makefile("r").readline()
            hello = json.loads(line)
        except (OSError, ValueError):
            connection.close()
            return None
        node_rank = int(hello.get("node_rank", -1))
        mine = (self.config.nnodes, self.config.world_size)
        theirs = (hello.get("nnodes"), hello.get("world_size"))
        problem = None
        if theirs != mine:
            problem = (
                f"node rank {node_rank} at {peer[0]} runs with nnodes={theirs[0]}, "
                f"world_size={theirs[1]}; node rank 0 has nnodes={mine[0]}, world_size={mine[1]}"
            )
        elif not 1 <= node_rank < self.config.nnodes or node_rank in self.nodes:
            problem = f"node rank {node_rank} from {peer[0]} is out of range or taken"
        if problem is not None:
            _send(connection, {"error": problem})
            connection.close()
            raise StartupError(f"RuntimeError: {problem}")
        connection.settimeout(None)
        self.nodes[node_rank] = connection
        logger.info("Node rank %d joined from %s", node_rank, peer[0])
        return [_report_from_json(report) for report in hello["ranks"]]

    def _tell_nodes(self, message: dict[str, Any]) -> None:
        for connection in self.nodes.values():
            with contextlib.suppress(OSError):
                _send(connection, message)

    def _accept_late_joiners(self) -> None:
        """A node that restarts after the group formed connects and then waits forever, as a
        torch.distributed rank whose group is complete does."""
        late: list[socket.socket] = []
        while not self.stop_requested.is_set() and self.listener is not None:
            try:
                connection, peer = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            logger.warning("A node connected from %s after the process group formed", peer[0])
            late.append(connection)

    def check_alive(self, timeout_s: float) -> None:
        """Idle: nothing, as vLLM's multiproc executor watches only its local workers."""
        return None

    def check_request(self, timeout_s: float) -> None:
        """A request needs every rank (the collective): a node that is gone fails it."""
        with self.lock:
            for node_rank, connection in self.nodes.items():
                try:
                    connection.settimeout(timeout_s)
                    _send(connection, {"ping": True})
                    answer = connection.recv(64)
                except OSError as error:
                    answer, reason = b"", f"{type(error).__name__}: {error}"
                else:
                    reason = "the connection was closed"
                if not answer:
                    ips = sorted({r.node_ip for r in self.ranks if self._node_of(r) == node_rank})
                    raise EngineDeadError(
                        f"EngineDeadError: Engine loop is not running: node rank {node_rank} "
                        f"({', '.join(ips)}) stopped answering the collective: {reason}"
                    )

    def _node_of(self, report: RankReport) -> int:
        return report.rank // (self.config.world_size // self.config.nnodes)

    def shutdown(self) -> None:
        for connection in self.nodes.values():
            connection.close()
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def run_headless(config: ServeConfig, stop: threading.Event) -> int:
    """A node with rank > 0: its ranks join node rank 0's group and serve it until stopped."""
    logger.info(
        "Launching vLLM (v%s) headless multiproc executor, with head node address %s:%d for "
        "torch.distributed process group.",
        VERSION,
        config.master_addr,
        config.master_port,
    )
    ranks = local_ranks(config)
    log_ranks(ranks)
    connection = _connect(config, stop)
    hello = {
        "nnodes": config.nnodes,
        "world_size": config.world_size,
        "node_rank": config.node_rank,
        "ranks": [_report_to_json(report) for report in ranks],
    }
    _send(connection, hello)
    reader = connection.makefile("rb")
    verdict = _read_message(connection, reader, stop)
    if verdict is None:
        raise StartupError(
            f"RuntimeError: node rank 0 at {config.master_addr}:{config.master_port} closed the "
            "connection before the process group formed"
        )
    if "error" in verdict:
        raise StartupError(f"RuntimeError: node rank 0 refused this node: {verdict['error']}")
    logger.info(
        "Node rank %d joined the process group: ranks %s serve node rank 0's engine",
        config.node_rank,
        [report.rank for report in ranks],
    )
    _serve_collectives(connection, reader, stop)
    return 0


def _connect(config: ServeConfig, stop: threading.Event) -> socket.socket:
    """Retried until the rendezvous timeout, as a TCPStore client retries its connect."""
    started = time.monotonic()
    last_error = "not tried"
    while time.monotonic() - started < config.rendezvous_timeout_s:
        if stop.is_set():
            raise TerminationRequested()
        try:
            connection = socket.create_connection(
                (config.master_addr, config.master_port), timeout=5
            )
            connection.settimeout(None)
            return connection
        except OSError as error:
            last_error = f"{type(error).__name__}: {error}"
        stop.wait(CONNECT_RETRY_S)
    raise StartupError(
        f"torch.distributed.DistNetworkError: The client socket has timed out after "
        f"{config.rendezvous_timeout_s:g}s while trying to connect to ({config.master_addr}, "
        f"{config.master_port}): {last_error}"
    )


def _readable(connection: socket.socket, stop: threading.Event) -> bool:
    """Wait until the connection has data (or was closed); False once stopping. select(), not
    a socket timeout: a timeout inside a file object's readline may lose buffered data."""
    while not stop.is_set():
        ready, _, _ = select.select([connection], [], [], 1.0)
        if ready:
            return True
    return False


def _read_message(
    connection: socket.socket, reader: Any, stop: threading.Event
) -> dict[str, Any] | None:
    if not _readable(connection, stop):
        raise TerminationRequested()
    line = reader.readline()
    return dict(json.loads(line)) if line else None


def _serve_collectives(connection: socket.socket, reader: Any, stop: threading.Event) -> None:
    """Answer node rank 0's requests until stopped. When node rank 0 goes away, keep waiting:
    a real headless node's workers block in their dequeue and never notice."""
    while _readable(connection, stop):
        try:
            line = reader.readline()
        except OSError:
            line = b""
        if not line:
            logger.warning(
                "The head node closed the connection; this node's workers now wait for work "
                "that never comes (as real vLLM's headless workers do) until they are stopped"
            )
            stop.wait()
            return
        try:
            connection.sendall(b"pong\n")
        except OSError:
            continue
