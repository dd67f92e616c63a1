"""The memory guard's Docker socket, filtered: on every node, in its own container, it listens on
a unix socket that only the guard's container mounts, and forwards to the host's Docker socket
exactly the calls memory_guard.py makes, on this deployment's servers on this node only:

    GET  /containers/json?filters={"label":["spark-vllm.deployment=ID","spark-vllm.node=NODE"],
                                   "status":["running"]}
    GET  /containers/{id}/json                                  (a server of ours)
    HEAD /containers/{id}/archive?path=/var/tmp/spark-vllm-ready  (a server of ours)
    POST /containers/{id}/kill?signal=SIGKILL                   (a server of ours)

each optionally behind the API version (`/v1.43/...`). "A server of ours" is checked through
the real socket before anything is forwarded: the container's labels say this deployment, this
node and a vllm or vllm-headless role, and the call goes to the ID Docker reported, never to the
name or prefix the client gave. Anything else: 403 with a JSON message, and Docker never sees
it. Why (docs/design.md, The memory guard): the serving image is often a third party's, and
with executor ray root in the head's server and Ray containers shares the host's PID namespace;
the raw socket is root on the host, the filtered one can only kill a server of ours.

    python3 -I -S -c "$(cat docker_filter.py)" --deployment ID --node NAME
        --listen PATH --docker PATH

It marks itself non-dumpable first (prctl PR_SET_DUMPABLE 0): root in a container on the
host's PID namespace then cannot open /proc/<pid>/root (nor /fd, /cwd) without CAP_SYS_PTRACE,
so the raw socket in this container's filesystem stays out of its reach. It must be its
container's only process (no --init), since any other process there would be dumpable.

Standard library only, no sibling imports. The decision is a pure function (`allowed`),
table-tested in tests/program/test_docker_filter.py with a fake Docker API.
"""

from __future__ import annotations

import ctypes

# Before anything else: the shorter the time this process is dumpable, the better.
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
_libc = ctypes.CDLL(None, use_errno=True)
if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or _libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0):
    raise SystemExit(f"docker-filter: cannot mark itself non-dumpable (errno {ctypes.get_errno()})")

import contextlib  # noqa: E402
import http.client  # noqa: E402
import http.server  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import socketserver  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import urllib.parse  # noqa: E402
from dataclasses import dataclass  # noqa: E402

READY_MARKER = "/var/tmp/spark-vllm-ready"  # memory_guard.py's, the launcher's marker
SERVER_ROLES = ("vllm", "vllm-headless")
DOCKER_SECONDS = 10  # one call to Docker; the guard's own bound is the same
CLIENT_SECONDS = 10  # a client that sends nothing is dropped
MAX_BODY = 16 * 1024 * 1024  # a list or an inspect of a node's containers is a few KiB
MAX_CLIENTS = 4  # the guard makes one call at a time
# A container as the client may name it: an ID, a prefix of one, or a name.
_CONTAINER = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
_VERSION = re.compile(r"^(/v[0-9]{1,2}\.[0-9]{1,3})(/.*)$")
_PATHS = {
    ("GET", "list"): re.compile(r"^/containers/json$"),
    ("GET", "inspect"): re.compile(rf"^/containers/({_CONTAINER})/json$"),
    ("HEAD", "marker"): re.compile(rf"^/containers/({_CONTAINER})/archive$"),
    ("POST", "kill"): re.compile(rf"^/containers/({_CONTAINER})/kill$"),
}


@dataclass(frozen=True)
class Call:
    """A request the filter lets through: what it is, the container it names (None for the
    list), and the path and query to send Docker (the client's version prefix kept)."""

    kind: str  # list, inspect, marker, kill
    container: str | None
    version: str  # "/v1.43" or ""
    query: str


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str


def allowed(method: str, target: str, deployment: str, node: str) -> Call | Refusal:
    """The call `method target` may make, or why not: one of the guard's four calls, with
    exactly its query. Whether the container it names is a server of ours is `ours`, checked
    against Docker's inspect before the call is forwarded."""
    path, _, raw_query = target.partition("?")
    if "#" in target or "%" in path:
        return Refusal(403, f"not a call the memory guard makes: {method} {path}")
    version = ""
    versioned = _VERSION.match(path)
    if versioned:
        version, path = versioned.group(1), versioned.group(2)
    for (allowed_method, kind), pattern in _PATHS.items():
        found = pattern.match(path)
        if found is None or method != allowed_method:
            continue
        query = _query(raw_query)
        if query is None:
            return Refusal(403, f"{method} {path}: a query parameter repeated or malformed")
        want = _query_for(kind, query, deployment, node)
        if isinstance(want, Refusal):
            return want
        container = found.group(1) if found.groups() else None
        return Call(kind, container, version, want)
    return Refusal(403, f"not a call the memory guard makes: {method} {path}")


def _query(raw: str) -> dict[str, str] | None:
    if not raw:
        return {}
    try:
        pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return None
    keys = [key for key, _ in pairs]
    return dict(pairs) if len(keys) == len(set(keys)) else None


def _query_for(kind: str, query: dict[str, str], deployment: str, node: str) -> str | Refusal:
    """The query sent on to Docker: the guard's, re-encoded; any other is refused."""
    if kind == "list":
        label = [f"spark-vllm.deployment={deployment}", f"spark-vllm.node={node}"]
        try:
            filters = json.loads(query.get("filters", ""))
        except ValueError:
            filters = None
        if set(query) != {"filters"} or not isinstance(filters, dict):
            return Refusal(403, "GET /containers/json: only with this deployment's label filter")
        labels, status = filters.get("label"), filters.get("status", ["running"])
        if set(filters) - {"label", "status"} or labels != label or status != ["running"]:
            return Refusal(403, f"GET /containers/json: only filtered by labels {label}, running")
        return "filters=" + urllib.parse.quote(json.dumps(filters, sort_keys=True))
    if kind == "marker":
        if query != {"path": READY_MARKER}:
            return Refusal(403, f"HEAD /containers/.../archive: only path={READY_MARKER}")
        return "path=" + urllib.parse.quote(READY_MARKER)
    if kind == "kill":
        if query not in ({}, {"signal": "SIGKILL"}):
            return Refusal(403, "POST /containers/.../kill: only signal=SIGKILL")
        return "signal=SIGKILL"
    if query:
        return Refusal(403, "GET /containers/.../json: no query")
    return ""


def ours(inspect: object, deployment: str, node: str) -> str | None:
    """The container's full ID when Docker's inspect says it is a server of this deployment on
    this node (labels spark-vllm.deployment, .node, .role vllm or vllm-headless); else None."""
    if not isinstance(inspect, dict):
        return None
    config = inspect.get("Config")
    labels = config.get("Labels") if isinstance(config, dict) else None
    identity = inspect.get("Id")
    if not isinstance(labels, dict) or not isinstance(identity, str):
        return None
    if (
        labels.get("spark-vllm.deployment") == deployment
        and labels.get("spark-vllm.node") == node
        and labels.get("spark-vllm.role") in SERVER_ROLES
        and re.fullmatch(r"[0-9a-f]{64}", identity)
    ):
        return identity
    return None


# -- forwarding ----------------------------------------------------------------------------------


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=DOCKER_SECONDS)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(DOCKER_SECONDS)
        self.sock.connect(self.unix_path)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


# Not passed on: they describe one hop (the body is re-sent whole, with its own length).
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "trailer", "upgrade"}


def ask(docker: str, method: str, path: str) -> Answer:
    """One call to the real Docker API; a chunked body is read whole (http.client decodes it)."""
    connection = _UnixConnection(docker)
    try:
        connection.request(method, path, headers={"Host": "docker"})
        response = connection.getresponse()
        body = response.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            raise OSError(f"Docker's answer to {method} {path} is over {MAX_BODY} bytes")
        headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP]
        return Answer(response.status, headers, body)
    finally:
        connection.close()


def forward(docker: str, deployment: str, node: str, method: str, call: Call) -> Answer:
    """The call through the real socket: a container's first inspected, and refused unless it
    is a server of ours; then sent to the ID Docker reported."""
    version = call.version
    if call.container is None:
        return ask(docker, method, f"{version}/containers/json?{call.query}")
    inspected = ask(docker, "GET", f"{version}/containers/{call.container}/json")
    if inspected.status == 404:
        return _refusal(Refusal(404, f"no such container: {call.container}"))
    if inspected.status != 200:
        return inspected
    identity = ours(_json(inspected.body), deployment, node)
    if identity is None:
        return _refusal(
            Refusal(403, f"{call.container} is not a server of deployment {deployment} on {node}")
        )
    if call.kind == "inspect":
        return inspected
    action = "archive" if call.kind == "marker" else "kill"
    return ask(docker, method, f"{version}/containers/{identity}/{action}?{call.query}")


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _refusal(refusal: Refusal) -> Answer:
    body = json.dumps({"message": f"docker-filter: {refusal.message}"}).encode()
    return Answer(refusal.status, [("Content-Type", "application/json")], body)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "spark-vllm-docker-filter"
    sys_version = ""
    server: Server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(CLIENT_SECONDS)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        self.close_connection = True  # one request per connection, as the guard's client does
        server = self.server
        if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length", "0") != "0":
            answer = _refusal(Refusal(403, "the memory guard's calls carry no body"))
        elif self.headers.get("Upgrade"):
            answer = _refusal(Refusal(403, "no connection upgrades"))
        else:
            call = allowed(method, self.path, server.deployment, server.node)
            if isinstance(call, Refusal):
                answer = _refusal(call)
            else:
                try:
                    answer = forward(server.docker, server.deployment, server.node, method, call)
                except (OSError, http.client.HTTPException) as error:
                    answer = _refusal(Refusal(502, f"Docker did not answer: {error}"))
        if answer.status == 403:
            self.log_message("refused %s %s", method, self.path[:200])
        self.send_response(answer.status)
        for key, value in answer.headers:
            self.send_header(key, value)
        if method != "HEAD" and answer.status not in (204, 304):
            self.send_header("Content-Length", str(len(answer.body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if method != "HEAD" and answer.status not in (204, 304):
            self.wfile.write(answer.body)

    def log_message(self, format: str, *args: object) -> None:
        print(f"spark-vllm: {self.server.node}: docker-filter: {format % args}", flush=True)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return  # only refusals and errors are worth a line


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, listen: str, docker: str, deployment: str, node: str) -> None:
        self.docker, self.deployment, self.node = docker, deployment, node
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(listen)  # the last run's, in the volume
        old = os.umask(0o177)  # the socket: its owner's only (root, the guard's user)
        try:
            super().__init__(listen, Handler)
        finally:
            os.umask(old)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # more clients than the guard ever opens
            return
        super().process_request(request, client_address)  # type: ignore[arg-type]

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)  # type: ignore[arg-type]
        finally:
            self.slots.release()


def main(argv: list[str]) -> int:
    flags: dict[str, str] = {}
    words = list(argv)
    while words:
        word = words.pop(0)
        if not word.startswith("--") or not words:
            print(f"docker-filter: unexpected argument {word!r}", file=sys.stderr)
            return 2
        flags[word[2:]] = words.pop(0)
    missing = [f for f in ("deployment", "node", "listen", "docker") if f not in flags]
    if missing:
        print(f"docker-filter: missing {missing}", file=sys.stderr)
        return 2
    # Its container's PID 1 (no --init): without a handler, SIGTERM would be ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = Server(flags["listen"], flags["docker"], flags["deployment"], flags["node"])
    print(
        f"spark-vllm: {flags['node']}: docker-filter: serving {flags['listen']}: the memory "
        f"guard's calls on deployment {flags['deployment']}'s servers, nothing else",
        flush=True,
    )
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
