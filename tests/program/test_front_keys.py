"""Named keys at the front (stacks/plan/front.py): the configuration as a table of pure cases,
then run for real on loopback (the installed HAProxy, Debian's 2.6 as in the lab image) before
two stand-in models: a key's models, its rate, its counters in the metrics, a key revoked by a
reload while the others' requests go on, and the counters and refusals a reload carries over."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stacks.plan import monitoring
from stacks.plan.front import (
    HANDOVER_CERT_NAME,
    HANDOVER_PEERS,
    KEY_ENTRY_LENGTH,
    KEY_METRICS_PATH,
    RELOAD_DRAIN_SECONDS,
    Key,
    Route,
    handover_address,
    key_models_file,
    keys_lua,
    limited_models,
    models_document,
    router_config,
)
from stacks.plan.front_body import BODY_LUA, BODY_LUA_NAME
from stacks.settings import key_entry, keys_map
from tests.program.conftest import ConfigFactory
from tests.program.planning import plan_of
from tests.program.ports import free_port
from tests.program.prometheus import running_prometheus
from tests.program.scripting import fake_docker_path, run

OPERATOR = "operator-key-0c9e2b7d5a1f3e86"
VALUES = {
    "alice": "alice-key-5f0c2d7e9b1a4c38e6d2",
    "bob": "bob-key-8e1f3a6c0d9b2e7f4a51c",
    "carol": "carol-key-3d7a1e0f9c5b2e8d6a4f",
}
KEYS = (Key("alice", ("beta",)), Key("bob", None, 3), Key("carol"))
HAPROXY = shutil.which("haproxy")


def routes(*ports: int) -> list[Route]:
    return [
        Route(name, f"org/{name}", None, (("s", f"127.0.0.1:{port}"),))
        for name, port in zip(("alpha", "beta")[: len(ports)], ports, strict=True)
    ]


def config(keys: tuple[Key, ...], ports: tuple[int, ...] = (1, 2)) -> str:
    return router_config(
        "127.0.0.1:1",
        "/k/bearer",
        routes(*ports),
        "/f/models.json",
        "127.0.0.1:3",
        keys=keys,
        keys_map="/k/keys.map",
        keys_lua="/f/keys.lua",
        handover=handover_address(3),
        body_lua="/f/body.lua",
        handover_cert="/k/handover.pem",
    )


def test_without_keys_the_configuration_is_as_before() -> None:
    """No `keys`: not a line of the named keys' machinery (a stack without them keeps its
    front as it was)."""
    for ports in ((1,), (1, 2)):
        text = config((), ports)
        words = ("keys.map", "txn.key", "track-sc1", "keys.lua", "key_metrics", "backend keys")
        for word in (*words, "429", "403", "peer"):
            assert word not in text


@pytest.mark.parametrize(
    ("key", "served", "expected"),
    [
        (Key("a"), ["alpha", "beta"], None),  # unset: every model
        (Key("a", ("alpha", "beta")), ["alpha", "beta"], None),  # every one named: no limit
        (Key("a", ("beta",)), ["alpha", "beta"], ["beta"]),
        (
            Key("a", ("beta", "alpha")),
            ["alpha", "beta", "gamma"],
            ["alpha", "beta"],
        ),  # served order
        (Key("a", ("alpha",)), ["alpha"], None),  # one model: nothing to refuse
    ],
)
def test_a_keys_limited_models(key: Key, served: list[str], expected: list[str] | None) -> None:
    assert limited_models(key, served) == expected


def test_the_configuration_names_keys_never_their_values() -> None:
    text = config(KEYS)
    assert "http_auth_bearer,map_str(/k/keys.map)" in text
    # On to vLLM with the operator's key, from a map of its own (no client token looks it up).
    assert "set-header authorization %[str(operator),map_str(/k/upstream.map)] if named_key" in (
        text
    )
    assert "unless has_key || named_key" in text
    assert "acl key_1 var(txn.key) -m beg bob." in text  # its entry: name, then its tag
    assert "hdr retry-after 60" in text and "sc_http_req_rate(1) gt 3" in text
    assert text.count("status 429") == 1  # bob alone has a limit
    assert "file /f/models-alice.json if METH_GET { path /v1/models } key_0" in text
    assert "lua-load /f/keys.lua" in text
    assert f"use-service lua.key_metrics if {{ path {KEY_METRICS_PATH} }}" in text
    for value in (OPERATOR, *VALUES.values()):
        assert value not in text
    # One model: no body is read, so no model is refused; the rate, the counters and the
    # client routes (the one 403) stay.
    single = config(KEYS, (1,))
    assert "not available with this key" not in single and "models-alice" not in single
    assert single.count("status 403") == 1 and "is not open to this key" in single
    assert "sc_http_req_rate(1) gt 3" in single and "backend keys" in single


def test_a_reload_hands_the_keys_table_to_the_new_workers() -> None:
    """The local peer, named in `global` (the container passes no `-L`), listens on loopback at
    the metrics listener's port on 127.0.0.2 (a port the stack owns already), over TLS that
    requires the deployment's certificate both ways, and the keys' table names its section;
    nothing of it without `handover`, and no handover in clear text."""
    lines = config(KEYS).splitlines()
    assert lines.index("    localpeer front") < lines.index("defaults")
    section = lines.index("peers handover")
    tls = "ssl crt /k/handover.pem ca-file /k/handover.pem verify required"
    assert lines[section + 1] == f"    bind 127.0.0.2:3 {tls}"
    assert lines[section + 2] == f"    default-server {tls}"
    assert lines[section + 3] == "    server front"
    assert lines[section + 4] == "backend keys"
    assert lines[section + 5].startswith("    stick-table type string len 48 ")
    assert lines[section + 5].endswith(" peers handover")
    with pytest.raises(ValueError, match="TLS only"):
        router_config(
            "127.0.0.1:1", "/k/bearer", routes(1, 2), "/f/models.json", keys=KEYS,
            keys_map="/k/m", body_lua="/f/body.lua", handover=handover_address(3),
        )  # fmt: skip
    assert "127.0.0.2" not in config(()) and "peer" not in config(())
    bare = router_config(
        "127.0.0.1:1", "/k/bearer", routes(1, 2), "/f/models.json", keys=KEYS, keys_map="/k/m",
        body_lua="/f/body.lua",
    )  # fmt: skip
    assert "peer" not in bare


def test_a_keys_entry_is_its_name_and_a_tag_of_its_value() -> None:
    """What the table counts a key under (stacks/settings.py key_entry): a new value under the
    same name is a new entry; the same value, the same entry; the longest name's entry fits
    the table's entries (KEY_ENTRY_LENGTH); the map holds it beside the value."""
    alice = key_entry("alice", VALUES["alice"])
    assert alice.startswith("alice.") and VALUES["alice"] not in alice
    assert key_entry("alice", VALUES["alice"]) == alice
    assert key_entry("alice", "alice-key-reissued-9d2f4b6a8c0e1f3a") != alice
    assert key_entry("alice", VALUES["bob"]).split(".")[1] == key_entry("bob", VALUES["bob"])[4:]
    assert len(key_entry("a" * 32, VALUES["alice"])) <= KEY_ENTRY_LENGTH
    assert keys_map([("alice", VALUES["alice"])]) == f"{VALUES['alice']} {alice}\n"


def test_a_reload_bounds_what_the_previous_workers_hold() -> None:
    """`hard-stop-after` in `global`, for every front, keys or not: a reload for any change
    (a key revoked among them) ends the previous workers within RELOAD_DRAIN_SECONDS."""
    for keys in ((), KEYS):
        lines = config(keys).splitlines()
        bound = lines.index(f"    hard-stop-after {RELOAD_DRAIN_SECONDS}s")
        assert lines.index("global") < bound < lines.index("defaults")


# --- the real HAProxy -------------------------------------------------------------------------


# A reload's bound on the previous workers in these tests (RELOAD_DRAIN_SECONDS in a stack), and
# how long a stand-in's stream would run without it.
DRAIN_SECONDS = 2
STREAM_SECONDS = 30


def model_server(name: str) -> ThreadingHTTPServer:
    """A stand-in that answers every request with the name of the model it serves, and, as
    vLLM's --api-key does, a 401 to a request without the operator's key."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            asked = self.rfile.read(length)
            admitted = self.headers.get("Authorization") == f"Bearer {OPERATOR}"
            if admitted and b'"stream": true' in asked:
                self.stream()
                return
            body = json.dumps({"served_by": name} if admitted else {"error": "vLLM's 401"})
            self.send_response(200 if admitted else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def stream(self) -> None:
            """A generation that goes on (an event every 0.2 s, for STREAM_SECONDS at most)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            event = f"data: {name}\n\n".encode()
            chunk = f"{len(event):x}\r\n".encode() + event + b"\r\n"
            deadline = time.monotonic() + STREAM_SECONDS
            try:
                while time.monotonic() < deadline:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    time.sleep(0.2)
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                self.close_connection = True  # the front closed it: nothing more to read

        do_GET = do_POST = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: dict


@dataclass
class Front:
    url: str
    metrics: str
    write: Callable[[tuple[Key, ...], dict[str, str]], None]  # the map and the configuration
    master: subprocess.Popen
    cli: Path  # HAProxy's master CLI (`-S`): the test's window on its workers, not the lab's


def call(
    url: str, key: str | None, model: str | None = None, path: str = "/v1/completions"
) -> Response:
    body = None if model is None else json.dumps({"model": model, "prompt": "hi"}).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw, status, got = response.read(), response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        raw, status, got = error.read(), error.code, dict(error.headers)
    return Response(status, {k.lower(): v for k, v in got.items()}, json.loads(raw or b"{}"))


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    if HAPROXY is None:
        if os.environ.get("CI") == "true":
            pytest.fail("HAProxy (Debian's, lab/install-deps.sh) is not installed")
        pytest.skip("HAProxy (Debian's, lab/install-deps.sh) is not installed")
    servers = [model_server("alpha"), model_server("beta")]
    port, metrics = free_port(), free_port()
    secrets, files = tmp_path / "secrets", tmp_path / "front"
    secrets.mkdir()
    files.mkdir()
    (secrets / "bearer").write_text(f"Bearer {OPERATOR}\n")
    served = routes(*(server.server_address[1] for server in servers))
    haproxy_cfg = files / "haproxy.cfg"

    def write(keys: tuple[Key, ...], values: dict[str, str]) -> None:
        # The maps and the handover's key pair as the head's step writes them.
        text = keys_map([(k.name, values[k.name]) for k in keys])
        run(
            "front-keys-file.sh", "write", "--host", "h", "--file", str(secrets / "keys.map"),
            stdin=f"{OPERATOR}\n{text}", check=True,
        )  # fmt: skip
        (files / "keys.lua").write_text(keys_lua(keys, str(secrets / "keys.map")))
        (files / BODY_LUA_NAME).write_text(BODY_LUA)
        (files / "models.json").write_text(models_document(served))
        for key in keys:
            allowed = limited_models(key, [r.served_name for r in served])
            if allowed is not None:
                name = key_models_file(str(files / "models.json"), key.name)
                Path(name).write_text(models_document(served, allowed))
        haproxy_cfg.write_text(
            router_config(
                f"127.0.0.1:{port}",
                str(secrets / "bearer"),
                served,
                str(files / "models.json"),
                f"127.0.0.1:{metrics}",
                keys=keys,
                keys_map=str(secrets / "keys.map"),
                keys_lua=str(files / "keys.lua"),
                handover=handover_address(metrics),
                body_lua=str(files / BODY_LUA_NAME),
                handover_cert=str(secrets / HANDOVER_CERT_NAME),
                drain_seconds=DRAIN_SECONDS,
            )
        )
        # -dW: any warning fails the check (on 3.2, the Lua one the conditional block avoids).
        check = subprocess.run(
            [HAPROXY, "-dW", "-c", "-f", str(haproxy_cfg)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr

    write(KEYS, VALUES)
    cli = tmp_path / "master.sock"
    master = subprocess.Popen(
        [HAPROXY, "-W", "-db", "-S", str(cli), "-f", str(haproxy_cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            call(url, OPERATOR, path="/health")
            break
        except OSError:
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.1)
    try:
        yield Front(url, f"http://127.0.0.1:{metrics}", write, master, cli)
    finally:
        master.terminate()
        master.wait(timeout=10)
        for server in servers:
            server.shutdown()


def test_each_key_reaches_its_models_and_no_other(front: Front) -> None:
    url = front.url
    # The operator's key and a key without `models`: every model.
    for key in (OPERATOR, VALUES["carol"]):
        assert call(url, key, "alpha").body == {"served_by": "alpha"}
        assert call(url, key, "beta").body == {"served_by": "beta"}
    assert call(url, None, "beta").status == 401
    assert call(url, "not-a-key-7d1e0c9b3a5f2e8d", "beta").status == 401
    # alice: beta only. Another model, served or not, is a 403 in vLLM's shape naming only
    # the model asked for; a request without `model` (the first model's) too.
    alice = VALUES["alice"]
    assert call(url, alice, "beta").body == {"served_by": "beta"}
    for asked in ("alpha", "gamma"):
        refused = call(url, alice, asked)
        assert refused.status == 403
        error = refused.body["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "PermissionDeniedError",
            403,
            "model",
        )
        assert f"`{asked}`" in error["message"] and "beta" not in error["message"]
        assert refused.headers["content-type"] == "application/json"
    missing = call(url, alice, path="/health")
    assert missing.status == 403 and "alpha" not in json.dumps(missing.body)
    # /v1/models: the key's models alone; the whole list for the others.
    listed = call(url, alice, path="/v1/models").body
    assert [model["id"] for model in listed["data"]] == ["beta"]
    listed = call(url, VALUES["carol"], path="/v1/models").body
    assert [model["id"] for model in listed["data"]] == ["alpha", "beta"]


def test_past_its_rate_a_key_gets_a_429_with_retry_after_and_the_others_do_not(
    front: Front,
) -> None:
    bob = VALUES["bob"]
    assert [call(front.url, bob, "alpha").status for _ in range(3)] == [200, 200, 200]
    refused = call(front.url, bob, "alpha")
    assert refused.status == 429
    assert refused.headers["retry-after"] == "60"
    assert (
        refused.body["error"]["type"] == "RateLimitError" and refused.body["error"]["code"] == 429
    )
    # Other keys, and the operator's, are not counted against bob's limit.
    assert call(front.url, VALUES["carol"], "alpha").status == 200
    assert call(front.url, OPERATOR, "alpha").status == 200


def key_metrics(front: Front) -> dict[tuple[str, str], int]:
    with urllib.request.urlopen(front.metrics + KEY_METRICS_PATH, timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("spark_vllm_key_"):
            series, value = line.rsplit(" ", 1)
            name, label = series.split("{")
            values[(name, label.removeprefix('key="').removesuffix('"}'))] = int(value)
    return values


def test_each_keys_requests_and_bytes_are_in_the_metrics(front: Front) -> None:
    for _ in range(2):
        call(front.url, VALUES["carol"], "alpha")
    call(front.url, VALUES["alice"], "beta")
    call(front.url, OPERATOR, "beta")  # the operator's key is not counted per key
    metrics = key_metrics(front)
    assert metrics[("spark_vllm_key_requests_total", "carol")] == 2
    assert metrics[("spark_vllm_key_requests_total", "alice")] == 1
    assert ("spark_vllm_key_requests_total", "bob") not in metrics  # no request yet
    assert metrics[("spark_vllm_key_bytes_in_total", "carol")] > 0
    out_carol = metrics[("spark_vllm_key_bytes_out_total", "carol")]
    out_alice = metrics[("spark_vllm_key_bytes_out_total", "alice")]
    assert out_carol > out_alice > 0  # two answers against one
    # HAProxy's own exporter still answers beside them.
    with urllib.request.urlopen(front.metrics + "/metrics", timeout=10) as response:
        assert "haproxy_frontend_http_requests_total" in response.read().decode()


def test_a_key_revoked_by_a_reload_is_refused_and_no_other_request_fails(front: Front) -> None:
    failures: list[int] = []
    served = [0]
    stop = threading.Event()

    def keep_asking(key: str) -> None:
        while not stop.is_set():
            status = call(front.url, key, "beta").status
            served[0] += 1
            if status != 200:
                failures.append(status)

    clients = [
        threading.Thread(target=keep_asking, args=(key,)) for key in (VALUES["carol"], OPERATOR)
    ]
    for client in clients:
        client.start()
    time.sleep(0.5)
    assert call(front.url, VALUES["alice"], "beta").status == 200
    kept = tuple(key for key in KEYS if key.name != "alice")
    front.write(kept, VALUES)
    front.master.send_signal(signal.SIGUSR2)  # what front-reload.sh sends the container
    deadline = time.monotonic() + 10
    while call(front.url, VALUES["alice"], "beta").status != 401:
        assert time.monotonic() < deadline, "the revoked key is still admitted"
        time.sleep(0.1)
    time.sleep(0.5)
    stop.set()
    for client in clients:
        client.join(timeout=10)
    assert failures == [] and served[0] > 10


def keyed_connection(front: Front, key: str, stream: bool) -> socket.socket:
    """A kept-alive connection that made one request with `key`: answered whole (idle now), or
    with `stream`, a stream under way (its first event read)."""
    host, port = urllib.parse.urlsplit(front.url).netloc.split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    body = json.dumps({"model": "beta", "prompt": "hi", "stream": stream}).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: front\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while b"served_by" not in seen and b"data: beta" not in seen:
        got = sock.recv(65536)
        assert got, f"the front closed the connection: {seen!r}"
        seen += got
    assert seen.startswith(b"HTTP/1.1 200"), seen
    return sock


def seconds_until_closed(sock: socket.socket, within: float) -> float:
    """How long until the front closes `sock` (what it sends meanwhile is read and dropped);
    fails past `within` seconds."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < within:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except OSError:  # reset: closed too
            return time.monotonic() - started
    raise AssertionError(f"the connection is still open {within} s after the reload")


def test_a_revoked_keys_open_connections_end_within_the_reloads_bound(front: Front) -> None:
    """After a reload that revokes alice, the previous workers still hold her connections,
    checked against the keys they loaded: an idle kept-alive one is closed at once, and a
    stream under way ends within the bound (`hard-stop-after`), not when it finishes."""
    with (
        keyed_connection(front, VALUES["alice"], stream=False) as idle,
        keyed_connection(front, OPERATOR, stream=True) as streaming,
    ):
        # The stand-in streams for the operator's key (vLLM's own check): alice's stream is
        # one the front admitted with her key, carried on with the operator's.
        with keyed_connection(front, VALUES["alice"], stream=True) as hers:
            kept = tuple(key for key in KEYS if key.name != "alice")
            front.write(kept, VALUES)
            front.master.send_signal(signal.SIGUSR2)  # what front-reload.sh sends the container
            assert seconds_until_closed(idle, within=2) < 2
            ended = seconds_until_closed(hers, within=DRAIN_SECONDS + 3)
            assert ended >= DRAIN_SECONDS - 1, ended  # the stream ran on until the bound
        # The bound is the previous workers': every stream they held ends with it.
        assert seconds_until_closed(streaming, within=2) < 2
    assert call(front.url, VALUES["alice"], "beta").status == 401


def master_cli(front: Front, command: str) -> str:
    """One command on HAProxy's master CLI: the master's own, or the current worker's (`@1`)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(front.cli))
        sock.sendall(command.encode() + b"\n")
        sock.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: sock.recv(65536), b"")).decode()


# HAProxy 2.6's PEERS_RESYNC_FINISHED (src/peers.c): the local and the remote resync are done.
RESYNC_FINISHED = 0x3


def wait_until_it_can_hand_over(front: Front) -> None:
    """Bounded: a worker hands its table over only once its own resync is finished; after a
    cold start (no old worker to learn from) it waits PEER_RESYNC_TIMEOUT (5 s) for one."""
    deadline = time.monotonic() + 15
    while True:
        shown = master_cli(front, "@1 show peers")
        line = next((x for x in shown.splitlines() if f" id={HANDOVER_PEERS} " in x), None)
        assert line is not None, f"the front has no `peers {HANDOVER_PEERS}`: {shown!r}"
        match = re.search(r" flags=(0x[0-9a-f]+) ", line)
        assert match is not None, line
        if int(match.group(1), 16) & RESYNC_FINISHED == RESYNC_FINISHED:
            return
        assert time.monotonic() < deadline, f"the front's peers never resynced: {line}"
        time.sleep(0.2)


def wait_until_reloaded(front: Front, reloads: int) -> None:
    """Bounded: the master reloaded `reloads` times and no old worker is left (an old worker
    leaves once it has pushed its table to the new one, or found it cannot). The master
    re-executes itself to reload: its CLI drops or refuses connections meanwhile."""
    deadline = time.monotonic() + 15
    shown = ""
    while True:
        try:
            shown = master_cli(front, "show proc")
        except OSError:
            shown = ""
        master = next((x for x in shown.splitlines() if " master " in x), None)
        old = shown.split("# old workers", 1)[1].split("#", 1)[0] if "# old" in shown else ""
        if master is not None and int(master.split()[2]) >= reloads and not old.strip():
            return
        assert time.monotonic() < deadline, f"the front did not reload: {shown}"
        time.sleep(0.1)


def test_a_keys_counters_and_its_refusals_survive_a_reload(front: Front) -> None:
    """A key added is a reload, and the keys' table goes over to the new workers: every key's
    counters go on, and a key past its rate stays refused (a 429, not a fresh minute)."""
    carol, bob = VALUES["carol"], VALUES["bob"]
    assert [call(front.url, carol, "alpha").status for _ in range(2)] == [200, 200]
    assert [call(front.url, bob, "alpha").status for _ in range(4)] == [200, 200, 200, 429]
    wait_until_it_can_hand_over(front)
    before = key_metrics(front)  # seconds after the requests: their bytes are counted
    dave = "dave-key-1b6e9c3f7a0d2e5b8c41"
    front.write((*KEYS, Key("dave")), {**VALUES, "dave": dave})
    front.master.send_signal(signal.SIGUSR2)  # what front-reload.sh sends the container
    wait_until_reloaded(front, 1)
    assert call(front.url, dave, "alpha").status == 200  # the new configuration serves
    after = key_metrics(front)
    for series in ("requests", "bytes_in", "bytes_out"):
        for name in ("carol", "bob"):
            metric = (f"spark_vllm_key_{series}_total", name)
            assert after.get(metric) == before[metric], (metric, "lost in the reload")
    refused = call(front.url, bob, "alpha")
    assert refused.status == 429 and refused.headers["retry-after"] == "60"
    assert key_metrics(front)[("spark_vllm_key_requests_total", "bob")] == 5
    assert call(front.url, carol, "alpha").status == 200


def test_a_new_key_under_a_revoked_keys_name_starts_at_zero(front: Front) -> None:
    """bob is past his rate; his key is revoked, then the name given to a new key: the table
    (handed over at each reload) still holds the old key's entry, but the new key counts under
    an entry of its own (stacks/settings.py key_entry): no 429 it never earned, no requests it
    never made in the metrics. The old key, given again, is refused."""
    old_bob = VALUES["bob"]
    assert [call(front.url, old_bob, "alpha").status for _ in range(4)] == [200, 200, 200, 429]
    wait_until_it_can_hand_over(front)
    without_bob = tuple(key for key in KEYS if key.name != "bob")
    front.write(without_bob, VALUES)
    front.master.send_signal(signal.SIGUSR2)
    wait_until_reloaded(front, 1)
    assert call(front.url, old_bob, "alpha").status == 401
    wait_until_it_can_hand_over(front)
    new_bob = "bob-key-reissued-2c8f0e4a6d1b3f7e9a5c"
    front.write(KEYS, {**VALUES, "bob": new_bob})
    front.master.send_signal(signal.SIGUSR2)
    wait_until_reloaded(front, 2)
    assert [call(front.url, new_bob, "alpha").status for _ in range(3)] == [200, 200, 200]
    assert key_metrics(front)[("spark_vllm_key_requests_total", "bob")] == 3
    assert call(front.url, new_bob, "alpha").status == 429  # his own rate, counted afresh
    assert call(front.url, old_bob, "alpha").status == 401


def test_prometheus_reads_each_keys_counters_with_the_planned_job(
    front: Front, make_config: ConfigFactory, tmp_path: Path
) -> None:
    """The `front-keys` job as monitoring plans it (its target, `metrics_path`, labels), run by
    a real Prometheus (Debian's, as the lab installs it) against this front: Prometheus parses
    the Lua service's text and stores each key's series."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Prometheus (Debian's, lab/install-deps.sh) is not installed")
        pytest.skip("Prometheus (Debian's, lab/install-deps.sh) is not installed")
    port = free_port()
    config = make_config(hosts=1)
    config["keys"] = [{"name": key.name} for key in KEYS]
    config["front"] = {"metricsPort": int(front.metrics.rsplit(":", 1)[1])}
    config["monitoring"] = {
        "enabled": True,
        "prometheus": {"port": port, "scrapeIntervalSeconds": 1},
    }
    planned = json.loads(monitoring.prometheus_config(plan_of(config)))
    # Its job alone: the plan's other targets (the servers, the exporters) are not here.
    planned["scrape_configs"] = [
        job for job in planned["scrape_configs"] if job["job_name"] == "front-keys"
    ]
    (tmp_path / "prometheus.yml").write_text(json.dumps(planned))
    for _ in range(2):
        assert call(front.url, VALUES["carol"], "alpha").status == 200
    query = urllib.parse.urlencode({"query": 'spark_vllm_key_requests_total{job="front-keys"}'})
    series: list[dict] = []
    with running_prometheus(binary, tmp_path / "prometheus.yml", port, tmp_path) as log:
        deadline = time.monotonic() + 30
        while not series:
            if time.monotonic() > deadline:
                tail = log.read_text()[-2000:]
                pytest.fail(f"Prometheus stored no key series in 30 s; its log ends: {tail}")
            time.sleep(0.5)
            try:
                url = f"http://127.0.0.1:{port}/api/v1/query?{query}"
                with urllib.request.urlopen(url, timeout=5) as response:
                    series = json.loads(response.read())["data"]["result"]
            except OSError:
                continue
    [carol] = series
    assert carol["metric"]["key"] == "carol" and carol["metric"]["node"] == "spark1"
    assert carol["value"][1] == "2"


# --- front-reload.sh and the map --------------------------------------------------------------

RECORDING_DOCKER = """#!/usr/bin/env bash
case "$1" in
  inspect) echo "running $FAKE_STARTED" ;;
  exec) exit 0 ;;
  kill) echo kill >> "$FAKE_SIGNALS" ;;
  *) exit 1 ;;
esac
"""


@pytest.mark.parametrize(("with_map", "signalled"), [(True, True), (False, False)])
def test_a_map_written_after_the_front_started_reloads_it(
    tmp_path: Path, with_map: bool, signalled: bool
) -> None:
    """A key's new value rewrites only the map: a front started after its configuration was
    written but before the map was must still reload (front-reload.sh --keys-map)."""
    config, keys_map, signals = tmp_path / "haproxy.cfg", tmp_path / "keys.map", tmp_path / "sig"
    config.write_text("global\n")
    os.utime(config, (1_000_000_000, 1_000_000_000))  # 2001
    keys_map.write_text("value name\n")  # now
    flags = ["--host", "spark1", "--container", "front", "--file", str(config)]
    flags += ["--config", str(config), "--digest", "d1"]
    flags += ["--keys-map", str(keys_map)] if with_map else []
    env = {
        "PATH": fake_docker_path(tmp_path, RECORDING_DOCKER),
        "FAKE_STARTED": "2020-01-01T00:00:00.000000000Z",  # after the file, before the map
        "FAKE_SIGNALS": str(signals),
    }
    done = run("front-reload.sh", *flags, env=env)
    assert done.returncode == 0, done.stderr
    assert signals.exists() == signalled, done.stdout


def test_the_map_is_written_private_from_stdin_and_removed(tmp_path: Path) -> None:
    keys_map = tmp_path / "secrets" / "keys.map"
    upstream = tmp_path / "secrets" / "upstream.map"
    text = "".join(f"{value} {name}\n" for name, value in VALUES.items())
    done = run(
        "front-keys-file.sh", "write", "--host", "h", "--file", str(keys_map),
        stdin=f"{OPERATOR}\n{text}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert keys_map.read_text() == text
    assert upstream.read_text() == f"operator Bearer {OPERATOR}\n"
    assert keys_map.stat().st_mode & 0o777 == 0o600
    assert upstream.stat().st_mode & 0o777 == 0o600
    assert (keys_map.parent.stat().st_mode & 0o777) == 0o700
    for value in VALUES.values():
        assert value not in done.stdout + done.stderr
    assert "named keys written: 3" in done.stdout
    # The handover's key pair: made once, private, a certificate then its key; kept when the
    # keys change (the running workers hold it), gone with the keys.
    pair = keys_map.parent / HANDOVER_CERT_NAME
    assert pair.stat().st_mode & 0o777 == 0o600
    pem = pair.read_text()
    assert pem.index("BEGIN CERTIFICATE") < pem.index("BEGIN PRIVATE KEY")
    assert "front handover key pair made" in done.stdout
    again = run(
        "front-keys-file.sh", "write", "--host", "h", "--file", str(keys_map),
        stdin=f"{OPERATOR}\n{text}", check=True,
    )  # fmt: skip
    assert pair.read_text() == pem and "key pair made" not in again.stdout
    run("front-keys-file.sh", "remove", "--host", "h", "--file", str(keys_map), check=True)
    assert not keys_map.exists() and not upstream.exists() and not pair.exists()
    assert not keys_map.parent.exists()
