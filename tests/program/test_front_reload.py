"""front-reload.sh against a real HAProxy in master-worker mode (the front's `-W`): a changed
configuration takes effect at once, a stream already running finishes whole, and a
configuration HAProxy refuses is not loaded. Docker is a stand-in that runs the commands the
script gives it on this machine (the lab runs the script against the front container)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stacks.plan.front import Route, router_config
from tests.program.scripting import SCRIPTS, fake_docker_path

KEY = "reload-key"
HAPROXY = shutil.which("haproxy")
pytestmark = pytest.mark.skipif(
    HAPROXY is None and os.environ.get("CI") != "true",
    reason="HAProxy (Debian's, lab/install-deps.sh) is not installed",
)

FAKE_DOCKER = """#!/usr/bin/env bash
case "$1" in
  inspect) [ -z "${FAKE_GONE:-}" ] || { echo "Error: No such object: $4" >&2; exit 1; }
           echo "${FAKE_STATUS:-running} ${FAKE_STARTED:-2020-01-01T00:00:00.000000000Z}" ;;
  exec) shift 2; exec "$@" ;;
  kill) kill -s "$3" "$FAKE_MASTER_PID" ;;
  *) exit 1 ;;
esac
"""


def backend(name: str) -> ThreadingHTTPServer:
    """A server that answers /health, and /slow with ten chunks over two seconds."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            chunks = 10 if self.path == "/slow" else 1
            for index in range(chunks):
                self.wfile.write(f"{name}{index}\n".encode())
                self.wfile.flush()
                if chunks > 1:
                    time.sleep(0.2)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def wait_until_it_answers(url: str) -> None:
    """HAProxy answers a keyed request within 20 s of its start."""
    deadline = time.monotonic() + 20
    while True:
        try:
            get(f"{url}/")
            return
        except OSError:
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.1)


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[Path, str, list[ThreadingHTTPServer], dict]]:
    assert HAPROXY is not None
    servers = [backend("a"), backend("b")]
    port = free_port()
    bearer = tmp_path / "bearer"
    bearer.write_text(f"Bearer {KEY}\n")
    config = tmp_path / "front" / "haproxy.cfg"  # as on the head: <state>/front
    config.parent.mkdir()

    def configure(server: ThreadingHTTPServer) -> None:
        route = Route("m", "org/m", None, (("s", f"127.0.0.1:{server.server_address[1]}"),))
        text = router_config(f"127.0.0.1:{port}", str(bearer), [route], str(tmp_path / "m.json"))
        config.write_text(text)

    configure(servers[0])
    master = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    env = {"PATH": fake_docker_path(tmp_path, FAKE_DOCKER), "FAKE_MASTER_PID": str(master.pid)}
    url = f"http://127.0.0.1:{port}"
    wait_until_it_answers(url)
    try:
        yield config, url, servers, {"env": env, "configure": configure}
    finally:
        master.terminate()
        master.wait(timeout=10)
        for server in servers:
            server.shutdown()


def reload(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    flags = {"host": "spark1", "container": "front", "file": str(config),
             "config": str(config), "digest": "d1"}  # fmt: skip
    argv = ["bash", str(SCRIPTS / "front-reload.sh")]
    argv += [word for key, value in flags.items() for word in (f"--{key}", value)]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


def test_a_new_configuration_serves_at_once_and_a_running_stream_finishes(front: tuple) -> None:
    config, url, servers, extra = front
    assert get(f"{url}/") == "a0\n"
    streamed: list[str] = []
    stream = threading.Thread(target=lambda: streamed.append(get(f"{url}/slow")))
    stream.start()
    time.sleep(0.5)  # the stream is under way through the old worker
    extra["configure"](servers[1])
    done = reload(config, extra["env"])
    assert done.returncode == 0 and "front reloaded" in done.stdout, done.stderr
    deadline = time.monotonic() + 10
    while get(f"{url}/") != "b0\n":
        assert time.monotonic() < deadline, "the new configuration is not serving"
        time.sleep(0.1)
    stream.join(timeout=10)
    assert streamed == ["".join(f"a{i}\n" for i in range(10))], "the stream was cut"


def test_a_configuration_haproxy_refuses_is_not_loaded(front: tuple) -> None:
    config, url, _, extra = front
    config.write_text(config.read_text().replace("balance leastconn", "balance nonsense"))
    done = reload(config, extra["env"])
    assert done.returncode == 1
    assert done.stderr.startswith("spark-vllm: spark1: ") and "HAProxy refuses" in done.stderr
    assert "no earlier configuration was kept" in done.stderr
    assert get(f"{url}/") == "a0\n"  # the previous configuration serves


def test_a_refused_configuration_is_not_left_for_the_next_start(front: tuple) -> None:
    """Once a configuration was loaded, it is kept: a refused one after it is replaced on disk
    by it at once (a restart of the front would otherwise read what HAProxy refused)."""
    config, url, servers, extra = front
    extra["configure"](servers[1])
    assert reload(config, extra["env"]).returncode == 0
    deadline = time.monotonic() + 10
    while get(f"{url}/") != "b0\n":  # loaded (HAProxy reads the file after the signal)
        assert time.monotonic() < deadline, "the new configuration is not serving"
        time.sleep(0.1)
    loaded = config.read_text()
    config.write_text(loaded.replace("balance leastconn", "balance nonsense"))
    receipt = config.parent.parent / "receipts" / "front-config"
    receipt.parent.mkdir()
    receipt.write_text("token\n")
    done = reload(config, extra["env"])
    assert done.returncode == 1 and "the one it runs was put back on disk" in done.stderr
    assert config.read_text() == loaded
    assert not receipt.exists()  # the next `up` writes the new configuration again
    assert get(f"{url}/") == "b0\n"


def test_a_front_that_is_not_running_reads_it_when_it_starts(front: tuple) -> None:
    config, _, _, extra = front
    for status in ("restarting", "exited", "created"):
        done = reload(config, {**extra["env"], "FAKE_STATUS": status})
        assert done.returncode == 0, done.stderr
        assert f"the front is {status}: it reads configuration d1 when it starts" in done.stdout
    gone = reload(config, {**extra["env"], "FAKE_GONE": "1"})
    assert gone.returncode == 1 and "cannot read the front's container front" in gone.stderr


def test_a_front_started_after_the_file_was_written_runs_it_already(front: tuple) -> None:
    """The first deploy: the reload runs right after the container started, maybe before
    HAProxy handles the signal; it runs this file already, so it is not signalled."""
    config, url, _, extra = front
    config.write_text(config.read_text().replace("balance leastconn", "balance nonsense"))
    started = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(time.time() + 5))
    done = reload(config, {**extra["env"], "FAKE_STARTED": started})
    assert done.returncode == 0 and "started with configuration d1" in done.stdout
    assert get(f"{url}/") == "a0\n"


def slow_client(port: int, source: str) -> socket.socket | None:
    """A connection from `source` that sends the start of a request and never its end (as a
    slowloris client does); None when the front refused it at once."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(2)
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: front\r\n")
    except OSError:
        sock.close()
        return None
    return sock


def test_slow_clients_without_the_key_never_starve_one_with_it(tmp_path: Path) -> None:
    """Sixty connections from two addresses of the LAN send headers that never end; a client
    with the key is served at once all the same: no address holds more than its share of the
    front's connections (here 8 of 32), counted before any header is read, and the rest are
    refused at once."""
    assert HAPROXY is not None
    server = backend("a")
    port = free_port()
    bearer = tmp_path / "bearer"
    bearer.write_text(f"Bearer {KEY}\n")
    route = Route("m", "org/m", None, (("s", f"127.0.0.1:{server.server_address[1]}"),))
    config = tmp_path / "haproxy.cfg"
    models = str(tmp_path / "m.json")
    text = router_config(
        f"127.0.0.1:{port}", str(bearer), [route], models, per_client=8, max_connections=32
    )
    config.write_text(text)
    front = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(config)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    held: list[socket.socket] = []
    try:
        wait_until_it_answers(f"http://127.0.0.1:{port}")
        for source in ("127.0.0.2", "127.0.0.3"):
            for _ in range(30):
                sock = slow_client(port, source)
                if sock is not None:
                    held.append(sock)
        # What the front kept of them answers nothing yet (their headers never end); each
        # address got at most its share: the rest were closed as they came.
        time.sleep(0.5)
        alive = 0
        for sock in held:
            sock.settimeout(0.05)
            try:
                alive += sock.recv(1) != b""
            except TimeoutError:
                alive += 1
            except OSError:
                pass
        assert alive <= 16, alive
        started = time.monotonic()
        assert get(f"http://127.0.0.1:{port}/") == "a0\n"
        assert time.monotonic() - started < 2
    finally:
        for sock in held:
            sock.close()
        front.terminate()
        front.wait(timeout=10)
        server.shutdown()
