"""The memory guard: on every node, in its own small container, it reads the host's available
memory and memory pressure twice a second, and before the host runs so short that it stops
answering (GB10's unified memory: vLLM takes more than gpu_memory_utilization while it starts,
vllm#46307, and the host wedges), it stops this deployment's server that is starting on the node
through the Docker API. SSH and the host stay alive; the stop is one line on its log, which the
readiness wait reports.

Only a server that is starting: a vllm or vllm-headless container inside its start window
(`--start-window-seconds` since Docker's `State.StartedAt`: timeouts.vllmReadySeconds, past
which the readiness wait has given up) without the launcher's ready marker of this start, and
at most once per start (a start is the container's ID and StartedAt). Never a Ray container
(it holds every model's workers on the node, and its restart policy would leave it down), never
a ready server: memory that runs short beside ready servers is someone else's, and the guard
says so in one line and stops nothing.

    python3 -c "$(cat memory_guard.py)" --node NAME --deployment ID --min-available auto|BYTES
        --max-pressure-percent P --start-window-seconds S [--interval-seconds S]
        [--docker-socket PATH]

Its Docker socket is not Docker's: docker_filter.py, in its own container, forwards the calls
below on this deployment's servers on the node, and no other call.

Runs whole as its container's command (`python3 -c`): standard library only, no sibling
imports. The decisions are pure functions (facts in, decision out), table-tested in
tests/program/test_memory_guard.py; the loop at the bottom only reads and acts.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import sys
import time
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime

GIB = 1073741824
# `--min-available auto`: 3% of the host's memory, at least 1 GiB (3.6 GiB on a DGX Spark's
# 119.7 GiB). Below what the memory check keeps free beside a server it sized (5%, at least
# 2 GiB: stacks/plan/hardware.py AUTO_MARGIN_*), so a server that took what it was given never
# trips it; above earlyoom's SIGKILL level (half its 10% default), so the guard acts before a
# killer that would take the largest process and leave Docker to restart it.
AUTO_FRACTION = 0.03
AUTO_FLOOR_BYTES = GIB
SERVER_ROLES = ("vllm", "vllm-headless")
# The launcher's ready marker (vllm-launcher.sh): written in the container's own filesystem
# once the server answers /health, removed at the start of each attempt. Its mtime, newer than
# the container's StartedAt, says this start is ready.
READY_MARKER = "/var/tmp/spark-vllm-ready"
STOP_LINE = "memory-guard: stopped"  # what the readiness wait looks for in the guard's log
# After a stop, the kernel needs a moment to take the memory back: read again before acting.
SETTLE_SECONDS = 5.0
DOCKER_SECONDS = 10  # one Docker API call; the guard itself must never hang on it


@dataclass(frozen=True)
class Memory:
    total: int  # bytes (MemTotal)
    available: int  # bytes (MemAvailable)


@dataclass(frozen=True)
class Limits:
    min_available: int  # bytes
    max_pressure: float  # percent of PSI's `full avg10`


@dataclass(frozen=True)
class Server:
    """One of this deployment's containers on the node, as Docker lists and inspects it."""

    id: str
    name: str
    role: str
    started: float  # seconds since the epoch (`State.StartedAt`): with `id`, this start
    ready: bool  # the launcher's ready marker is newer than `started`

    @property
    def start(self) -> tuple[str, float]:
        return (self.id, self.started)


def parse_meminfo(text: str) -> Memory:
    """MemTotal and MemAvailable of /proc/meminfo (kB), in bytes."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if key in ("MemTotal", "MemAvailable") and fields:
            values[key] = int(fields[0]) * 1024
    return Memory(values["MemTotal"], values["MemAvailable"])


def parse_pressure(text: str) -> float | None:
    """PSI's `full avg10` of /proc/pressure/memory: the share of the last 10 s in which every
    task that wanted to run waited for memory (the host thrashing). None without PSI."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "full":
            for word in words[1:]:
                if word.startswith("avg10="):
                    return float(word.split("=", 1)[1])
    return None


def limits_of(min_available: str, max_pressure: float, total: int) -> Limits:
    """The thresholds for a host of `total` bytes: `auto` or bytes below which it acts."""
    if min_available == "auto":
        floor = max(AUTO_FLOOR_BYTES, int(total * AUTO_FRACTION))
    else:
        floor = int(min_available)
    return Limits(floor, max_pressure)


def breach(memory: Memory, pressure: float | None, limits: Limits) -> str | None:
    """Why the host is about to run out, or None: available memory below the floor, or PSI
    `full avg10` at or above its limit."""
    if memory.available < limits.min_available:
        return f"{gib(memory.available)} GiB of {gib(memory.total)} GiB available, below the guard's {gib(limits.min_available)} GiB"  # noqa: E501
    if pressure is not None and limits.max_pressure > 0 and pressure >= limits.max_pressure:
        return f"memory pressure {pressure:.0f}% (PSI full avg10), at or above the guard's {limits.max_pressure:g}%"  # noqa: E501
    return None


@dataclass(frozen=True)
class Decision:
    """What the guard does on a breach: stop `server`, or nothing, saying `why_not`."""

    server: Server | None
    why_not: str = ""


def decide(
    servers: list[Server], acted: frozenset[tuple[str, float]], now: float, window: float
) -> Decision:
    """On a breach: the server to stop, the newest of those starting (a vllm or vllm-headless
    container started less than `window` seconds before `now`, not ready, and not acted on in
    this start: `acted` holds the starts already stopped). The plan starts one server after the
    one before it is ready, so at most one is starting after an `up`; after a reboot, the last
    Docker started. Ties: by name, so every run agrees. None, with the reason, when no server is
    starting: Ray containers and ready servers are never stopped."""
    starting = [
        s
        for s in servers
        if s.role in SERVER_ROLES
        and not s.ready
        and 0 <= now - s.started < window
        and s.start not in acted
    ]
    if starting:
        return Decision(max(starting, key=lambda s: (s.started, s.name)))
    servers_here = [s for s in servers if s.role in SERVER_ROLES]
    if not servers_here:
        return Decision(None, "no server of ours runs here: nothing stopped")
    ready = sum(1 for s in servers_here if s.ready)
    return Decision(
        None,
        f"no server of ours is starting here ({ready} ready, {len(servers_here) - ready} past "
        f"their start window or already stopped once in this start): nothing stopped; the "
        "memory is another process's",
    )


def stop_line(node: str, server: Server, why: str, pressure: float | None, now: float) -> str:
    """The guard's one line about a stop (its log; the readiness wait quotes it)."""
    seen = f"; memory pressure {pressure:.0f}%" if pressure is not None else ""
    return (
        f"spark-vllm: {node}: {STOP_LINE} {server.name} (id {server.id[:12]}, {server.role}, "
        f"started {max(0, now - server.started):.0f}s before) at {stamp(now)}: {why}{seen}"
    )


CAUSE = (
    "the server takes more memory than this node has while it starts (on unified memory "
    "vllm.gpuMemoryUtilization does not cap vLLM's start-up): lower it or vllm.kvCache (or use "
    "`auto`), or free the memory another process holds, then run `pulumi up` again"
)


def gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def started_at(text: str) -> float:
    """Docker's time stamps (`State.StartedAt`, a path stat's `mtime`: RFC 3339 with up to
    nanoseconds, `Z` or an offset) as seconds since the epoch."""
    offset = "+00:00"
    if text.endswith("Z"):
        text = text[:-1]
    elif len(text) > 6 and text[-6] in "+-" and text[-3] == ":":
        text, offset = text[:-6], text[-6:]
    head, _, fraction = text.partition(".")
    seconds = datetime.fromisoformat(head + offset).astimezone(UTC)
    return seconds.timestamp() + (float("0." + fraction[:6]) if fraction else 0.0)


def marker_mtime(stat_header: str | None) -> float | None:
    """The ready marker's mtime from Docker's `X-Docker-Container-Path-Stat` header (base64
    JSON of the path's stat: `HEAD /containers/{id}/archive`); None without the marker."""
    if not stat_header:
        return None
    stat = json.loads(base64.b64decode(stat_header))
    return started_at(stat["mtime"])


# -- acting: the Docker API on its unix socket ---------------------------------------------------


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=DOCKER_SECONDS)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(DOCKER_SECONDS)
        self.sock.connect(self.path)


def docker(socket_path: str, method: str, path: str) -> object:
    connection = _UnixConnection(socket_path)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        body = response.read()
        if response.status >= 300:
            raise RuntimeError(f"Docker API {method} {path}: {response.status} {body[:200]!r}")
        return json.loads(body) if body else None
    finally:
        connection.close()


def ready_since(socket_path: str, container: str) -> float | None:
    """The ready marker's mtime in `container`, or None (`HEAD .../archive`: 404 without it)."""
    connection = _UnixConnection(socket_path)
    try:
        path = f"/containers/{container}/archive?path=" + urllib.parse.quote(READY_MARKER)
        connection.request("HEAD", path)
        response = connection.getresponse()
        response.read()
        if response.status == 404:
            return None
        if response.status >= 300:
            raise RuntimeError(f"Docker API HEAD {path}: {response.status}")
        return marker_mtime(response.getheader("X-Docker-Container-Path-Stat"))
    finally:
        connection.close()


def running_servers(socket_path: str, deployment: str, node: str) -> list[Server]:
    """This deployment's running servers on the node (its labels: the filter in front of
    Docker, docker_filter.py, answers this list and no other), with their start times and
    whether each start is ready."""
    labels = [f"spark-vllm.deployment={deployment}", f"spark-vllm.node={node}"]
    filters = json.dumps({"label": labels, "status": ["running"]})
    listed = docker(socket_path, "GET", "/containers/json?filters=" + urllib.parse.quote(filters))
    servers = []
    for entry in listed if isinstance(listed, list) else []:
        role = (entry.get("Labels") or {}).get("spark-vllm.role", "")
        if role not in SERVER_ROLES:
            continue
        inspect = docker(socket_path, "GET", f"/containers/{entry['Id']}/json")
        assert isinstance(inspect, dict)
        name = inspect["Name"].lstrip("/")
        started = started_at(inspect["State"]["StartedAt"])
        marked = ready_since(socket_path, entry["Id"])
        ready = marked is not None and marked >= started
        servers.append(Server(entry["Id"], name, role, started, ready))
    return servers


def stop(socket_path: str, server: Server) -> None:
    """SIGKILL through the API (`docker kill`): the memory comes back at once, and Docker counts
    the container as stopped by hand, so its `unless-stopped` policy does not start it again
    (moby daemon/kill.go sets HasBeenManuallyStopped)."""
    docker(socket_path, "POST", f"/containers/{server.id}/kill?signal=SIGKILL")


def read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as file:
            return file.read()
    except OSError:
        return ""


def watch(flags: dict[str, str]) -> None:
    node, deployment = flags["node"], flags["deployment"]
    socket_path = flags.get("docker_socket", "/var/run/docker.sock")
    interval = float(flags.get("interval_seconds", "0.5"))
    window = float(flags["start_window_seconds"])
    acted: set[tuple[str, float]] = set()
    total = parse_meminfo(read("/proc/meminfo")).total
    limits = limits_of(flags["min_available"], float(flags["max_pressure_percent"]), total)
    pressure_seen = parse_pressure(read("/proc/pressure/memory")) is not None
    print(
        f"spark-vllm: {node}: memory-guard: watching: acts below {gib(limits.min_available)} GiB "
        f"available of {gib(total)} GiB"
        + (f" or at {limits.max_pressure:g}% memory pressure" if pressure_seen else " (no PSI)")
        + f", on a server of ours in the first {window:.0f}s of its start and not yet ready",
        flush=True,
    )
    quiet_until = 0.0
    said = ""  # the last "nothing stopped" reason, said once while memory stays low
    while True:
        time.sleep(interval)
        memory = parse_meminfo(read("/proc/meminfo"))
        pressure = parse_pressure(read("/proc/pressure/memory"))
        why = breach(memory, pressure, limits)
        now = time.time()
        if why is None:
            said = ""
        if why is None or now < quiet_until:
            continue
        try:
            decision = decide(
                running_servers(socket_path, deployment, node), frozenset(acted), now, window
            )
            server = decision.server
            if server is None:
                if decision.why_not != said:
                    print(
                        f"spark-vllm: {node}: memory-guard: memory low: {why}; {decision.why_not}"
                    )
                said = decision.why_not
            else:
                acted.add(server.start)
                stop(socket_path, server)
                print(stop_line(node, server, why, pressure, now))
                print(f"  likely cause: {CAUSE}")
        except (OSError, RuntimeError, KeyError, ValueError) as error:
            print(f"spark-vllm: {node}: memory-guard: {why}; Docker did not answer: {error}")
        sys.stdout.flush()
        quiet_until = time.time() + SETTLE_SECONDS


def main(argv: list[str]) -> int:
    flags: dict[str, str] = {}
    words = list(argv)
    while words:
        word = words.pop(0)
        if not word.startswith("--") or not words:
            print(f"memory-guard: unexpected argument {word!r}", file=sys.stderr)
            return 2
        flags[word[2:].replace("-", "_")] = words.pop(0)
    missing = [f for f in ("node", "deployment", "min_available", "max_pressure_percent",
                           "start_window_seconds") if f not in flags]  # fmt: skip
    if missing:
        print(f"memory-guard: missing {missing}", file=sys.stderr)
        return 2
    watch(flags)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
