"""mp_supervisor.py (executor mp): it reads the rendezvous connections from the kernel and stops
the server when a node's ranks leave, or when a node never joins. Run for real on loopback: a
listening socket stands for the head's store, client sockets for the ranks."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "components" / "scripts" / "mp_supervisor.py"
sys.path.insert(0, str(SCRIPT.parent))
import mp_supervisor  # noqa: E402


def test_the_kernels_tables_are_read_for_ipv4_and_v4_mapped_ipv6() -> None:
    tcp = "   0: 0B00F10A:7339 0C00F10A:A1B2 01 00000000:00000000 00:00000000 00000000 0 0 1"
    tcp6 = (
        "   1: 0000000000000000FFFF00000B00F10A:7339 0000000000000000FFFF00000C00F10A:A1B3 "
        "01 00000000:00000000 00:00000000 00000000 0 0 2"
    )
    listening = "   2: 00000000:7339 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 3"
    found = mp_supervisor.parse_connections([tcp, tcp6, listening])
    assert found == [
        ("10.241.0.11", 29497, "10.241.0.12", 41394),
        ("10.241.0.11", 29497, "10.241.0.12", 41395),
    ]


def test_listening_ports_and_process_parents_are_read_from_the_kernels_files() -> None:
    lines = [
        "   0: 0B00F10A:7339 0C00F10A:A1B2 01 00000000:00000000 00:00000000 00000000 0 0 1",
        "   1: 00000000:7339 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 3",
        "   2: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000 0 0 4",
    ]
    assert mp_supervisor.parse_listening_ports(lines) == {29497, 8000}
    # A command name may hold spaces and parentheses: the fields count from the last ")".
    assert mp_supervisor.parse_parent("121 (VLLM::Worker (0)) S 90 121 14 0 -1") == 90
    parents = {14: 1, 90: 14, 121: 90, 122: 90, 300: 1, 301: 300}
    assert mp_supervisor.descendants(14, parents) == {90, 121, 122}
    assert mp_supervisor.descendants(121, parents) == set()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def store() -> Iterator[tuple[socket.socket, int]]:
    """What the head's torch.distributed store is to the kernel: a listening port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener, int(listener.getsockname()[1])
    listener.close()


def supervise(port: int, *flags: str, server: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), "--rendezvous", f"127.0.0.1:{port}", *flags, "--", *server],
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(run: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    _, stderr = run.communicate(timeout=timeout)
    return run.returncode, stderr


def test_the_head_stops_the_server_when_a_workers_ranks_leave(
    store: tuple[socket.socket, int],
) -> None:
    listener, port = store
    health = free_port()
    server = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(health)]
    run = supervise(
        port, "--peers", "spark2=127.0.0.1", "--join-seconds", "20",
        "--health-url", f"http://127.0.0.1:{health}/", server=server,
    )  # fmt: skip
    rank = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    time.sleep(4)  # joined, the server answers: the supervisor now watches this connection
    assert run.poll() is None
    rank.close()
    accepted.close()
    code, said = finished(run, 20)
    assert code == 1, said
    assert "every node joined the rendezvous" in said
    assert f"spark2 (127.0.0.1) left the rendezvous at 127.0.0.1:{port}" in said


def test_the_head_names_a_worker_that_never_joins(store: tuple[socket.socket, int]) -> None:
    _, port = store
    run = supervise(
        port, "--peers", "spark2=127.0.0.1", "--join-seconds", "2",
        "--health-url", "http://127.0.0.1:9/", server=["sleep", "60"],
    )  # fmt: skip
    code, said = finished(run, 20)
    assert code == 1
    assert f"spark2 (127.0.0.1) did not join the rendezvous at 127.0.0.1:{port} within 2s" in said
    assert "Likely cause: that node's vLLM container is not running" in said


def test_the_heads_window_opens_with_its_store_not_with_the_container(
    store: tuple[socket.socket, int],
) -> None:
    """A head that takes longer to open its store than the whole window (a loaded host's
    imports) still gives its peers the window from then on."""
    listener, port = store
    listener.close()  # the store is not open yet
    run = supervise(
        port, "--peers", "spark2=127.0.0.1", "--join-seconds", "2",
        "--health-url", "http://127.0.0.1:9/", server=["sleep", "60"],
    )  # fmt: skip
    time.sleep(4)
    assert run.poll() is None, "the window ran before this node's store opened"
    opened = time.monotonic()
    with socket.socket() as late:
        late.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        late.bind(("127.0.0.1", port))
        late.listen(8)
        code, said = finished(run, 20)
    assert code == 1, said
    assert time.monotonic() - opened >= 2
    assert f"the rendezvous at 127.0.0.1:{port} is open: waiting for spark2" in said
    assert "did not join the rendezvous" in said and "within 2s of its opening" in said


def test_a_headless_nodes_window_opens_when_its_ranks_start(
    store: tuple[socket.socket, int],
) -> None:
    """The node's own start-up (here 4 s before the server starts a rank) is not counted: the
    window opens when a child process of the server has lived on."""
    _, port = store
    # (The rank's stderr elsewhere: once the server is stopped, the orphan would hold the pipe.)
    late_rank = [sys.executable, "-c", "import subprocess, time; time.sleep(4); "
                 "subprocess.run(['sleep', '60'], stderr=subprocess.DEVNULL)"]  # fmt: skip
    started = time.monotonic()
    run = supervise(port, "--peers", "spark1=127.0.0.1", "--join-seconds", "2",
                    server=late_rank)  # fmt: skip
    code, said = finished(run, 30)
    assert code == 1, said
    # 4 s before the rank, 2 s before it counts (RANK_ALIVE_S), then the 2 s window.
    assert time.monotonic() - started >= 4 + mp_supervisor.RANK_ALIVE_S + 2, said
    assert (
        f"could not join the rendezvous at 127.0.0.1:{port} on spark1 (127.0.0.1) within 2s "
        "of this node's ranks starting" in said
    )


def test_a_headless_node_stops_when_the_heads_store_is_gone(
    store: tuple[socket.socket, int],
) -> None:
    listener, port = store
    # The "server" is this node's rank: it holds a connection to the store until it is closed.
    run = supervise(port, "--peers", "spark1=127.0.0.1", "--join-seconds", "20",
                    server=["sleep", "60"])  # fmt: skip
    rank = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    time.sleep(2.5)
    assert run.poll() is None
    accepted.close()  # the head's process died: the kernel closes its end
    rank.close()
    code, said = finished(run, 20)
    assert code == 1, said
    assert f"joined the rendezvous at 127.0.0.1:{port} on spark1 (127.0.0.1)" in said
    assert "is gone (the server there stopped or restarted)" in said


def test_docker_stop_reaches_the_server_and_its_exit_code_is_kept(
    store: tuple[socket.socket, int],
) -> None:
    _, port = store
    run = supervise(port, "--peers", "spark1=127.0.0.1", "--join-seconds", "20",
                    server=[sys.executable, "-c", "import signal, sys, time; "
                            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
                            "time.sleep(60)"])  # fmt: skip
    time.sleep(1)
    run.terminate()
    code, _ = finished(run, 20)
    assert code == 0
