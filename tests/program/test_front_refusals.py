"""What the front refuses before a request reaches vLLM (stacks/plan/front.py): a named key on a
route that is not a client's (client_routes.py), a body whose `model` the front and vLLM could
read differently (front_body.py), HTTP/2 in clear text, and an oversized JSON body without
`model` whatever the case of its Content-Type. The tables are pure; each refusal is then run
for real on loopback (the installed HAProxy, Debian's 2.6 as in the lab image) before two
stand-in models that answer with what reached them."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stacks.plan.client_routes import CLIENT_ROUTES, ClientRoute, admits
from stacks.plan.front import (
    BODY_BUFFER_BYTES,
    Key,
    Route,
    handover_address,
    keys_lua,
    models_document,
    router_config,
)
from stacks.plan.front_body import BODY_LUA, BODY_LUA_NAME
from stacks.settings import keys_map
from tests.program.ports import free_port
from tests.program.scripting import make_handover_pair

OPERATOR = "operator-key-0c9e2b7d5a1f3e86"
CAROL = "carol-key-3d7a1e0f9c5b2e8d6a4f"  # a named key, every model
ALICE = "alice-key-5f0c2d7e9b1a4c38e6d2"  # a named key, beta only
HAPROXY = shutil.which("haproxy")


# --- the allow-list, as a table -----------------------------------------------------------------

# vLLM's routes that change or read the server, each turned on by a flag or a variable of the
# image, `extraArgs` or `env`; and spellings of client routes that are not the routes.
REFUSED = [
    ("POST", "/v1/load_lora_adapter"),  # VLLM_ALLOW_RUNTIME_LORA_UPDATING
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/start_profile"),  # the profiler
    ("POST", "/stop_profile"),
    ("POST", "/scale_elastic_ep"),  # elastic expert parallelism
    ("POST", "/is_scaling_elastic_ep"),
    ("GET", "/v1/responses/resp_0123"),  # a stored response, by its id
    ("POST", "/v1/responses/resp_0123/cancel"),
    ("POST", "/reset_prefix_cache"),  # VLLM_SERVER_DEV_MODE
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("GET", "/is_sleeping"),
    ("POST", "/collective_rpc"),
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("GET", "/metrics"),  # the servers' metrics: Prometheus reads them directly
    ("GET", "/server_info"),
    ("GET", "/load"),
    ("POST", "/invocations"),  # SageMaker's: any task, by the body
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/v1/chat/completions"),  # a client route, with another method
    ("POST", "/v1/models"),
    ("DELETE", "/v1/models"),
    ("PUT", "/v1/completions"),
    ("POST", "/v1/chat/completions/"),  # not the route as written
    ("POST", "/v1//chat/completions"),
    ("POST", "/v1/%63hat/completions"),  # vLLM would decode it: refused, never admitted
    ("POST", "/V1/chat/completions"),
]


@pytest.mark.parametrize(("method", "path"), REFUSED)
def test_a_named_key_is_refused_every_route_but_a_clients(method: str, path: str) -> None:
    assert not admits(method, path)


@pytest.mark.parametrize("route", CLIENT_ROUTES, ids=lambda route: f"{route.method} {route.path}")
def test_every_client_route_is_admitted_with_its_method_alone(route: ClientRoute) -> None:
    assert admits(route.method, route.path)
    other = "POST" if route.method == "GET" else "GET"
    assert not admits(other, route.path)


def test_head_is_admitted_where_get_is() -> None:
    assert admits("HEAD", "/health") and not admits("HEAD", "/v1/completions")


def test_one_model_speaks_http1_only_too() -> None:
    """No body is read with one model, but the bind is the same: HTTP/1.1 only."""
    route = Route("alpha", "org/alpha", None, (("s", "127.0.0.1:2"),))
    text = router_config("127.0.0.1:1", "/k/bearer", [route], "/f/models.json")
    assert "    bind 127.0.0.1:1 proto h1" in text.splitlines()
    assert "lua-load" not in text  # no body to check


def test_several_models_need_the_body_check() -> None:
    routes = [
        Route(name, f"org/{name}", None, (("s", f"127.0.0.1:{port}"),))
        for name, port in (("alpha", 2), ("beta", 3))
    ]
    with pytest.raises(ValueError, match="body_lua"):
        router_config("127.0.0.1:1", "/k/bearer", routes, "/f/models.json")
    text = router_config("127.0.0.1:1", "/k/bearer", routes, "/f/m.json", body_lua="/f/b.lua")
    lines = text.splitlines()
    assert "    lua-load /f/b.lua" in lines
    # The check comes before `model` is read to route the request.
    check = next(i for i, line in enumerate(lines) if "lua.model_check" in line)
    assert check < next(i for i, line in enumerate(lines) if "json_query" in line)


# --- the real HAProxy ---------------------------------------------------------------------------


def echo_server(name: str) -> ThreadingHTTPServer:
    """A stand-in model that answers any method and path with its name, the path and the
    headers that reached it (the operator's key, as vLLM's --api-key wants, or a 401)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            admitted = self.headers.get("Authorization") == f"Bearer {OPERATOR}"
            headers = {key.lower(): value for key, value in self.headers.items()}
            reply = {"served_by": name, "path": self.path, "headers": headers}
            body = json.dumps(reply if admitted else {"error": "vLLM's 401"}).encode()
            self.send_response(200 if admitted else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Answer:
    status: int
    body: dict


@dataclass
class Front:
    port: int

    def ask(
        self,
        method: str,
        path: str,
        key: str | None,
        body: bytes | None = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> Answer:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        sent = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
        if body is not None:
            sent["Content-Type"] = content_type
        try:
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        return Answer(response.status, json.loads(raw) if raw else {})


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    if HAPROXY is None:
        if os.environ.get("CI") == "true":
            pytest.fail("HAProxy (Debian's, lab/install-deps.sh) is not installed")
        pytest.skip("HAProxy (Debian's, lab/install-deps.sh) is not installed")
    workdir = tmp_path_factory.mktemp("front")
    servers = [echo_server("alpha"), echo_server("beta")]
    routes = [
        Route(name, f"org/{name}", None, (("s", f"127.0.0.1:{server.server_address[1]}"),))
        for name, server in zip(("alpha", "beta"), servers, strict=True)
    ]
    (workdir / "bearer").write_text(f"Bearer {OPERATOR}\n")
    (workdir / "keys.map").write_text(keys_map([("alice", ALICE), ("carol", CAROL)]))
    (workdir / "upstream.map").write_text(f"operator Bearer {OPERATOR}\n")
    make_handover_pair(workdir / "handover.pem")
    keys = (Key("alice", ("beta",)), Key("carol"))
    (workdir / "keys.lua").write_text(keys_lua(keys, str(workdir / "keys.map")))
    (workdir / BODY_LUA_NAME).write_text(BODY_LUA)
    (workdir / "models.json").write_text(models_document(routes))
    (workdir / "models-alice.json").write_text(models_document(routes, ["beta"]))
    port, metrics = free_port(), free_port()
    config = workdir / "haproxy.cfg"
    config.write_text(
        router_config(
            f"127.0.0.1:{port}",
            str(workdir / "bearer"),
            routes,
            str(workdir / "models.json"),
            f"127.0.0.1:{metrics}",
            keys=(Key("alice", ("beta",)), Key("carol")),
            keys_map=str(workdir / "keys.map"),
            keys_lua=str(workdir / "keys.lua"),
            handover=handover_address(metrics),
            body_lua=str(workdir / BODY_LUA_NAME),
            handover_cert=str(workdir / "handover.pem"),
        )
    )
    check = subprocess.run(
        [HAPROXY, "-dW", "-c", "-f", str(config)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    process = subprocess.Popen(
        [HAPROXY, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    running = Front(port)
    deadline = time.monotonic() + 20
    while True:
        try:
            running.ask("GET", "/health", OPERATOR)
            break
        except OSError:
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.1)
    try:
        yield running
    finally:
        process.terminate()
        process.wait(timeout=10)
        for server in servers:
            server.shutdown()


def ask_with_body(front: Front, method: str, path: str, key: str) -> Answer:
    body = json.dumps({"model": "beta", "prompt": "hi"}).encode() if method == "POST" else None
    return front.ask(method, path, key, body)


@pytest.mark.parametrize(("method", "path"), REFUSED)
def test_a_named_key_on_any_other_route_is_a_403_and_the_operators_key_is_not(
    front: Front, method: str, path: str
) -> None:
    refused = ask_with_body(front, method, path, CAROL)
    assert refused.status == 403, refused
    error = refused.body["error"]
    assert (error["type"], error["code"], error["param"]) == ("PermissionDeniedError", 403, None)
    assert f"`{method} {path}` is not open to this key" in error["message"]
    # The operator's key reaches vLLM on every route (an operator's tools, the lab's probes).
    reached = ask_with_body(front, method, path, OPERATOR)
    assert reached.status == 200 and reached.body["path"] == path, reached


@pytest.mark.parametrize("route", CLIENT_ROUTES, ids=lambda route: f"{route.method} {route.path}")
def test_a_named_key_reaches_every_client_route(front: Front, route: ClientRoute) -> None:
    method, path = route.method, route.path
    answer = ask_with_body(front, method, path, CAROL)
    assert answer.status == 200, answer
    if path != "/v1/models":  # the front's own list, with several models
        assert answer.body["path"] == path
        # On to vLLM with the operator's key, never the named one.
        assert answer.body["headers"]["authorization"] == f"Bearer {OPERATOR}"
    # A query string is not part of the path the list matches.
    assert ask_with_body(front, method, path + "?x=1", CAROL).status == 200
    assert front.ask("HEAD", "/health", CAROL).status == 200


# Bodies the front and vLLM (Python's json: the last key named model, decoded) could read as
# two models, each with the refusal it gets.
CONFUSING = [
    (b'{"model": "beta", "model": "alpha", "prompt": "hi"}', "more than once"),
    (b'{"model": null, "model": "alpha"}', "more than once"),
    (b'{"model": "beta", "prompt": "hi", "mod\\u0065l": "alpha"}', "more than once"),
    (b'{"mod\\u0065l": "alpha"}', "written with escapes"),
    (b'{"\\u006D\\u006f\\u0064\\u0065\\u006c": "alpha"}', "written with escapes"),
    (b'{"model": null, "prompt": "hi"}', "must be a string"),
    (b'{"model": ["beta"]}', "must be a string"),
    (b'{"model": {"name": "beta"}}', "must be a string"),
    (b'{"model": 5}', "must be a string"),
    (b'{"model": true}', "must be a string"),
    (b'\n {"prompt": "a \\" b", "model"\t:\n"beta" , "model":"beta"}', "more than once"),
]


@pytest.mark.parametrize(("body", "why"), CONFUSING)
def test_a_body_whose_model_could_be_read_two_ways_is_a_400(
    front: Front, body: bytes, why: str
) -> None:
    for key in (OPERATOR, CAROL, ALICE):
        refused = front.ask("POST", "/v1/completions", key, body)
        assert refused.status == 400, (key, refused)
        error = refused.body["error"]
        assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, "model")
        assert why in error["message"], error


# Bodies both read as one model: served by it.
PLAIN = [
    (b'{"model": "beta", "prompt": "hi"}', "beta"),
    (b'{"prompt": "say \\"model\\": \\"alpha\\"", "model": "beta"}', "beta"),  # in a string
    (b'{"model": "beta", "tools": [{"parameters": {"model": {"type": "string"}}}]}', "beta"),
    (b'{"model": "beta", "response_format": {"model": null, "x": [1, {"model": 2}]}}', "beta"),
    (b'{"model": "be\\u0074a", "max_tokens": 5}', "beta"),  # escapes in the value are fine
    (b'{"max_tokens": 5, "stream": false, "model": "beta"}', "beta"),
    (b'{"prompt": "hi"}', "alpha"),  # no model: the first one's, as before
]


@pytest.mark.parametrize(("body", "served"), PLAIN)
def test_a_body_with_one_model_is_served_by_it(front: Front, body: bytes, served: str) -> None:
    answer = front.ask("POST", "/v1/completions", OPERATOR, body)
    assert answer.status == 200 and answer.body["served_by"] == served, answer


def test_a_key_limited_to_one_model_cannot_reach_another_through_a_second_model_key(
    front: Front,
) -> None:
    assert front.ask("POST", "/v1/completions", ALICE, b'{"model": "beta"}').status == 200
    for body in (b'{"model": "beta", "model": "alpha"}', b'{"model":"beta","mod\\u0065l":"alpha"}'):
        assert front.ask("POST", "/v1/completions", ALICE, body).status == 400


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def test_http2_prior_knowledge_is_not_spoken(front: Front) -> None:
    """HTTP/2 in clear text from the preface on: HAProxy would answer with its SETTINGS frame
    (type 4) and take up to 100 streams on the connection; the front speaks HTTP/1.1 only."""
    with socket.create_connection(("127.0.0.1", front.port), timeout=10) as sock:
        # An empty SETTINGS frame after the preface, as a client that knows HTTP/2 sends it.
        sock.sendall(H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    is_settings = len(received) >= 9 and received[3] == 0x04
    assert not is_settings, received[:64]
    assert received == b"" or received.startswith(b"HTTP/1.1 400"), received[:64]


def test_an_h2c_upgrade_reaches_no_server(front: Front) -> None:
    """curl --http2 asks for h2c with Upgrade on a request without a body (HAProxy itself
    drops Upgrade from one with a body): the front drops the offer before any server sees it
    (a server that took it would get a 101 tunnel), and the request is served in HTTP/1.1."""
    upgrade = {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c",
               "HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA"}  # fmt: skip
    for method, path, body in (
        ("GET", "/health", None),
        ("POST", "/v1/completions", b'{"model": "beta"}'),
    ):
        answer = front.ask(method, path, CAROL, body, headers=upgrade)
        assert answer.status == 200, answer
        assert "upgrade" not in answer.body["headers"], (method, answer.body["headers"])
        assert "http2-settings" not in answer.body["headers"], (method, answer.body["headers"])


@pytest.mark.parametrize(
    "content_type", ["application/json", "Application/JSON", "APPLICATION/JSON; charset=utf-8"]
)
def test_a_large_json_body_without_model_is_a_413_whatever_the_case_of_its_type(
    front: Front, content_type: str
) -> None:
    """Past what the front reads, a JSON body that named no model in the part read would go to
    the first model: refused (413), whether the client wrote its media type in lower case or
    not (media types are case-insensitive)."""
    body = json.dumps({"prompt": "x" * (BODY_BUFFER_BYTES + 1000), "model": "beta"}).encode()
    refused = front.ask("POST", "/v1/completions", OPERATOR, body, content_type=content_type)
    assert refused.status == 413, refused
    assert "put `model` first" in refused.body["error"]["message"]
