"""docker_filter.py, the memory guard's Docker socket: the filter runs as its container runs it
(`python3 -I -S -c`), in front of a fake Docker API on a unix socket, and the guard's own client
(memory_guard.py) talks to it. What it lets through reaches Docker whole; what it refuses never
reaches Docker at all."""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.program.scripting import SCRIPTS, load

guard = load("memory_guard")

DEPLOYMENT, NODE = "dep-1", "spark1"
OURS = "a" * 64  # a server of this deployment on this node
HEADLESS = "c" * 64  # executor mp's headless server, ours too
RAY = "d" * 64  # ours, but Ray: the guard never kills it
FOREIGN = "b" * 64  # another deployment's server
ELSEWHERE = "e" * 64  # ours, on another node
STAT = base64.b64encode(json.dumps({"name": "ready", "mtime": "2026-12-07T12:00:00Z"}).encode())


def labels(deployment: str, node: str, role: str) -> dict[str, str]:
    return {"spark-vllm.deployment": deployment, "spark-vllm.node": node, "spark-vllm.role": role}


CONTAINERS = {
    OURS: ("spark-vllm-vllm", labels(DEPLOYMENT, NODE, "vllm")),
    HEADLESS: ("spark-vllm-vllm-headless", labels(DEPLOYMENT, NODE, "vllm-headless")),
    RAY: ("spark-vllm-ray-head", labels(DEPLOYMENT, NODE, "ray-head")),
    FOREIGN: ("other-vllm", labels("dep-2", NODE, "vllm")),
    ELSEWHERE: ("spark-vllm-vllm-2", labels(DEPLOYMENT, "spark2", "vllm")),
}


@dataclass
class FakeDocker:
    """The Docker API's answers to the guard's calls; `seen` is every request it received."""

    path: str
    seen: list[tuple[str, str]] = field(default_factory=list)


def _fake_handler(docker: FakeDocker) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _find(self, ref: str) -> str | None:
            for identity, (name, _) in CONTAINERS.items():
                if ref in (identity, name) or (len(ref) >= 12 and identity.startswith(ref)):
                    return identity
            return None

        def _send(self, status: int, body: bytes = b"", chunked: bool = False, **extra: str):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Api-Version", "1.43")
            for key, value in extra.items():
                self.send_header(key.replace("_", "-"), value)
            if chunked:  # as Docker answers a list
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for start in range(0, len(body), 7):
                    piece = body[start : start + 7]
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            else:
                if status != 204:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD" and status != 204:
                    self.wfile.write(body)

        def _route(self) -> None:
            docker.seen.append((self.command, self.path))
            path, _, query = self.path.partition("?")
            parts = path.split("/")
            if parts[1].startswith("v1."):
                parts = ["", *parts[2:]]
            if parts[1:] == ["containers", "json"] and self.command == "GET":
                filters = json.loads(urllib.parse.parse_qs(query)["filters"][0])
                wanted = set(filters["label"])
                listed = [
                    {"Id": identity, "Names": ["/" + name], "Labels": found}
                    for identity, (name, found) in CONTAINERS.items()
                    if wanted <= {f"{k}={v}" for k, v in found.items()}
                ]
                return self._send(200, json.dumps(listed).encode(), chunked=True)
            identity = self._find(parts[2]) if len(parts) == 4 else None
            if identity is None:
                return self._send(404, b'{"message":"No such container"}')
            name, found = CONTAINERS[identity]
            if parts[3] == "json":
                inspect = {
                    "Id": identity,
                    "Name": "/" + name,
                    "Config": {"Labels": found, "Env": ["SECRET=x"]},
                    "State": {"StartedAt": "2026-12-07T11:59:00.123456789Z"},
                }
                return self._send(200, json.dumps(inspect).encode())
            if parts[3] == "archive" and self.command == "HEAD":
                return self._send(200, X_Docker_Container_Path_Stat=STAT.decode())
            if parts[3] in ("kill", "stop") and self.command == "POST":
                return self._send(204)
            return self._send(200, b'{"done":true}')

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _route

    return Handler


class _Unix(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _wait_for(path: str, process: subprocess.Popen[str]) -> None:
    """Until the filter accepts a connection: its socket file exists from bind(), a moment
    before listen() (a loaded machine refused the first call in between)."""
    deadline = time.monotonic() + 15
    while not _accepts(path):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the filter did not listen: {process.communicate()}")
        time.sleep(0.02)


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


@dataclass
class Running:
    docker: FakeDocker
    listen: str
    process: subprocess.Popen[str]


def _start(directory: str, as_nobody: bool = False) -> tuple[Running, _Unix]:
    fake = FakeDocker(os.path.join(directory, "docker.sock"))
    server = _Unix(fake.path, _fake_handler(fake))
    os.chmod(fake.path, 0o666)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    listen = os.path.join(directory, "filtered", "docker.sock")
    os.mkdir(os.path.dirname(listen), 0o777)
    os.chmod(os.path.dirname(listen), 0o777)
    args = ["--deployment", DEPLOYMENT, "--node", NODE, "--listen", listen, "--docker", fake.path]
    script = (SCRIPTS / "docker_filter.py").read_text()
    # Another user cannot always run this virtual environment's interpreter: the system's.
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") if as_nobody else None
    process = subprocess.Popen(
        [python or sys.executable, "-I", "-S", "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        user=65534 if as_nobody else None,
        group=65534 if as_nobody else None,
        extra_groups=[] if as_nobody else None,
    )
    _wait_for(listen, process)
    return Running(fake, listen, process), server


@pytest.fixture
def running() -> Iterator[Running]:
    with tempfile.TemporaryDirectory() as directory:
        filtered, server = _start(directory)
        try:
            yield filtered
        finally:
            filtered.process.terminate()
            filtered.process.communicate(timeout=10)
            server.shutdown()
            server.server_close()


def call(listen: str, method: str, path: str, body: bytes | None = None) -> tuple[int, dict, bytes]:
    connection = guard._UnixConnection(listen)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_the_guards_own_calls_pass_through_with_their_answers_whole(running: Running) -> None:
    servers = guard.running_servers(running.listen, DEPLOYMENT, NODE)
    # The list (chunked by Docker) arrives whole: the guard keeps the servers of the labels it
    # asked for (Ray's container is listed, never a server); each inspected and stat'ed.
    assert {s.id for s in servers} == {OURS, HEADLESS}
    ours = next(s for s in servers if s.id == OURS)
    assert ours.name == "spark-vllm-vllm"
    assert ours.ready  # the marker's stat header came through: mtime after StartedAt
    guard.stop(running.listen, ours)
    assert ("POST", f"/containers/{OURS}/kill?signal=SIGKILL") in running.docker.seen


def test_the_api_version_prefix_is_kept(running: Running) -> None:
    status, headers, body = call(running.listen, "GET", f"/v1.43/containers/{OURS}/json")
    assert status == 200
    assert json.loads(body)["Id"] == OURS
    assert headers["Api-Version"] == "1.43"
    status, _, _ = call(running.listen, "POST", f"/v1.43/containers/{OURS}/kill?signal=SIGKILL")
    assert status == 204
    assert running.docker.seen[-1] == ("POST", f"/v1.43/containers/{OURS}/kill?signal=SIGKILL")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/containers/create"),
        ("POST", "/v1.43/containers/create"),
        ("GET", "/containers/json?all=1"),  # every container, not the deployment's
        ("GET", "/containers/json"),
        ("GET", '/containers/json?filters={"label":["spark-vllm.deployment=dep-2"]}'),
        (
            "GET",
            "/containers/json?filters="
            + urllib.parse.quote('{"label":["spark-vllm.deployment=dep-1"],"status":["running"]}'),
        ),  # every node's (one daemon is one node's: the guard never asks this)
        ("GET", "/containers/json?filters=" + urllib.parse.quote('{"label":[],"status":[]}')),
        ("POST", f"/containers/{OURS}/exec"),
        ("POST", f"/containers/{OURS}/stop"),
        ("POST", f"/containers/{OURS}/kill?signal=SIGTERM"),
        ("DELETE", f"/containers/{OURS}"),
        ("GET", f"/containers/{OURS}/archive?path=/etc/shadow"),  # the content, not a stat
        ("HEAD", f"/containers/{OURS}/archive?path=/etc/shadow"),
        ("HEAD", f"/containers/{OURS}/archive?path=/var/tmp/spark-vllm-ready&path=/etc"),
        ("GET", f"/containers/{OURS}/json?size=1"),
        ("GET", f"/containers/{OURS}/logs"),
        ("GET", "/containers/%2e%2e/json"),
        ("GET", "/v1.43/../containers/json"),
        ("GET", "/images/json"),
        ("GET", "/_ping"),
        ("GET", "/version"),
        ("POST", "/v1.43/exec/abc/start"),
    ],
)
def test_any_other_call_is_refused_and_docker_never_sees_it(
    running: Running, method: str, path: str
) -> None:
    status, headers, body = call(running.listen, method, path)
    assert status == 403, body
    assert headers["Content-Type"] == "application/json"
    if method != "HEAD":  # a HEAD's answer has no body
        assert json.loads(body)["message"].startswith("docker-filter: ")
    assert running.docker.seen == []


@pytest.mark.parametrize(
    "container",
    [FOREIGN, RAY, ELSEWHERE, "other-vllm", FOREIGN[:12]],
)
def test_a_container_not_a_server_of_ours_here_is_never_touched(
    running: Running, container: str
) -> None:
    for method, path in [
        ("POST", f"/containers/{container}/kill?signal=SIGKILL"),
        ("POST", f"/v1.43/containers/{container}/kill"),
        ("HEAD", f"/containers/{container}/archive?path=/var/tmp/spark-vllm-ready"),
        ("GET", f"/containers/{container}/json"),
    ]:
        status, _, body = call(running.listen, method, path)
        assert status == 403, (path, body)
        if method != "HEAD":
            assert "is not a server of deployment dep-1 on spark1" in json.loads(body)["message"]
    # Docker was asked who it is (an inspect), never to act on it.
    assert {method for method, _ in running.docker.seen} == {"GET"}
    assert all(path.endswith(f"/containers/{container}/json") for _, path in running.docker.seen)


def test_a_server_named_by_name_or_prefix_is_acted_on_by_its_id(running: Running) -> None:
    status, _, _ = call(running.listen, "POST", "/containers/spark-vllm-vllm/kill?signal=SIGKILL")
    assert status == 204
    assert running.docker.seen[-1] == ("POST", f"/containers/{OURS}/kill?signal=SIGKILL")


def test_a_request_with_a_body_is_refused(running: Running) -> None:
    status, _, _ = call(running.listen, "POST", f"/containers/{OURS}/kill", body=b"{}")
    assert status == 403
    assert running.docker.seen == []


def test_an_unknown_container_is_a_404_and_nothing_else_is_asked(running: Running) -> None:
    status, _, body = call(running.listen, "POST", "/containers/nosuch/kill?signal=SIGKILL")
    assert status == 404, body
    assert running.docker.seen == [("GET", "/containers/nosuch/json")]


def test_its_socket_is_its_owners_only(running: Running) -> None:
    assert os.stat(running.listen).st_mode & 0o777 == 0o600


def test_it_is_not_dumpable_so_no_other_process_opens_its_root() -> None:
    """A non-dumpable process's /proc/<pid> files are root's (and /proc/<pid>/root needs
    CAP_SYS_PTRACE). Run as `nobody`: dumpable, they would be nobody's."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the filter as another user")
    with tempfile.TemporaryDirectory() as directory:
        os.chmod(directory, 0o777)
        filtered, server = _start(directory, as_nobody=True)
        try:
            pid = filtered.process.pid
            assert os.stat(f"/proc/{pid}/status").st_uid == 0
            # The control: a process of the same user that did not ask is nobody's.
            sleeper = subprocess.Popen(["sleep", "30"], user=65534, group=65534, extra_groups=[])
            try:
                assert os.stat(f"/proc/{sleeper.pid}/status").st_uid == 65534
            finally:
                sleeper.kill()
                sleeper.wait()
        finally:
            filtered.process.terminate()
            filtered.process.communicate(timeout=10)
            server.shutdown()
            server.server_close()


def test_it_exits_on_docker_stop_as_pid_1_would_need(running: Running) -> None:
    running.process.terminate()
    assert running.process.wait(timeout=10) == 143


def test_a_docker_that_does_not_answer_is_a_502_not_a_hang(running: Running) -> None:
    os.unlink(running.docker.path)  # Docker gone
    status, _, body = call(running.listen, "POST", f"/containers/{OURS}/kill?signal=SIGKILL")
    assert status == 502
    assert "Docker did not answer" in json.loads(body)["message"]
