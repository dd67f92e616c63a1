"""The front: HAProxy on the head publishes `vllm.port` and admits only requests that carry the
API key, on every path; vLLM itself listens on loopback only (`vllm.serverPort`).

Why a front at all: vLLM checks the key only on paths under /v1 (and /v2, /inference, /cohere:
its AuthenticationMiddleware), so /invocations, /tokenize, /pooling, /score, /metrics... answer
whoever reaches its port. Why HAProxy (docs/design.md, "The front"): a small, long-kept proxy in
every distribution and as an official multi-arch image, it streams responses unbuffered (SSE),
checks a header against a pattern file (the key never in its configuration), and can route by
the request body's `model` field and balance replicas when several models share the endpoint.

The configuration is a pure function of the plan; the key stays in the front's own secrets
directory (ClusterPlan.front_secrets_dir, mounted into the front's container alone) as a
pattern file (`Bearer <key>`, written by api-key-file.sh). The named keys (`keys`) are a map
file beside it (`<key> <entry>`: the name and a tag of the value, stacks/settings.py key_entry;
front-keys-file.sh): the configuration names the keys, never their values; a stick table
counts each key's requests and bytes and bounds its rate, and a reload hands it over to the
new workers (HANDOVER_PEERS), over TLS with a key pair of the deployment's own
(HANDOVER_CERT_NAME).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass

from stacks.plan.client_routes import client_paths
from stacks.plan.cluster import ClusterPlan
from stacks.plan.front_body import BODY_LUA, BODY_LUA_NAME, BODY_REFUSALS, MODEL_CHECK_FETCH
from stacks.plan.server_plan import ServerPlan, per_server
from stacks.settings import KEY_ENTRY_SEPARATOR

CONTAINER_FRONT_DIR = "/spark-vllm/front"  # the host's <state>/front, read-only
# The host's <state>/front-secrets, read-only: no other container mounts it.
CONTAINER_FRONT_SECRETS_DIR = "/run/spark-vllm-front"
FRONT_CONFIG_NAME = "haproxy.cfg"
BEARER_FILE_NAME = "bearer"  # `Bearer <key>`: the one Authorization header the front admits
UNAUTHORIZED_BODY = json.dumps({"error": "Unauthorized"})  # what vLLM itself answers
MODELS_FILE_NAME = "models.json"  # /v1/models when several models share the front
KEYS_MAP_NAME = "keys.map"  # `<key> <name>` per named key, beside `bearer` (front-keys-file.sh)
# `operator Bearer <apiKey>`, beside it: what a named key's request carries on to vLLM, whose own
# --api-key check knows only the operator's key. A map of its own, so that no client's token can
# ever look this entry up.
UPSTREAM_MAP_NAME = "upstream.map"
KEYS_TABLE = "keys"  # the stick table that counts each named key's requests and bytes
# Its entries' length: a name (32 characters at most) and its key's tag (key_entry).
KEY_ENTRY_LENGTH = 48
KEYS_LUA_NAME = "keys.lua"  # the per-key metrics (KEY_METRICS_PATH), read from that table
KEY_METRICS_PATH = "/metrics/keys"
# A key's rate is counted over a sliding minute: LLM services state their limits per minute
# (requests and tokens per minute), and one request can take longer than 10 s, so a shorter
# window would turn a client's short burst (a batch sent at once) into refusals it cannot plan
# for. A refused request counts too: a client that ignores Retry-After stays refused.
KEY_WINDOW_SECONDS = 60
# A reload (front-reload.sh: SIGUSR2, master-worker) starts workers with empty stick tables: a
# key over its rate would be admitted again after any key change, and its counters would start
# afresh. HAProxy's own remedy is a `peers` section holding only the local peer: "during a soft
# restart, the old process connects to the new one [at the local peer's address] to push all its
# entries" (HAProxy's configuration manual, 3.5 "Peers", and `localpeer` in 3.1). The local
# peer's name is set by `localpeer` in `global`: the container runs `haproxy -W -db -f ...`, no
# `-L`, and the default (the host name) is not the plan's to know. Its address is the head's
# loopback only, 127.0.0.2 at front.metricsPort: a port the stack already owns (its metrics
# listener holds it on 127.0.0.1, checked against every other port of the plan), on an address
# nothing else of the stack binds, so it adds no port to collide with. A worker hands over once
# its own start-up resync is done: after a cold start HAProxy waits for a former worker up to
# PEER_RESYNC_TIMEOUT (5 s, src/peers.c), and a reload within it carries nothing over.
# The peers protocol itself has no authentication: any process on the head (or host-network
# container) that connects there and says it is the local peer is sent every key's counters
# and may write any entry (a key's rate cleared: its 429 a 200 again; an entry of its own). So
# the handover is TLS with client certificates (`ssl ... verify required` on both the peer's
# `bind` and its `server`, configuration manual 3.5): the old workers present, and the new ones
# require, a certificate from HANDOVER_CERT_NAME, a self-signed pair made on the head for this
# deployment (front-keys-file.sh) and trusted alone (the file is its own `ca-file`), in the
# front's secrets directory, which only the front's container mounts. A client without it, or
# with a certificate of its own, fails the handshake. (A unix socket would do without a
# certificate, but a peer's address is TCP only.)
HANDOVER_PEERS = "handover"
LOCAL_PEER = "front"
HANDOVER_HOST = "127.0.0.2"
HANDOVER_CERT_NAME = "handover.pem"  # the certificate, then its private key (PEM)
# With several models the front reads a request body up to this many bytes to find its
# `model` (a 1 MiB prompt). HAProxy holds a request and a response buffer per connection (more
# while it checks servers), so at ROUTER_MAX_CONNECTIONS its buffers can reach a few GiB in
# the worst case, from the head's unified memory.
BODY_BUFFER_BYTES = 1048576
ROUTER_MAX_CONNECTIONS = 512
MAX_CONNECTIONS = 4096  # one model: HAProxy's default 16 kB buffers
# The front speaks HTTP/1.1 only (`proto h1` on its bind): HAProxy would otherwise take HTTP/2
# in clear text from any client that opens with its preface (h2c "prior knowledge"), up to 100
# streams per connection, each holding a buffer (BODY_BUFFER_BYTES with several models): one
# connection could hold 100 MiB, past the `maxconn` and per-client bounds that count
# connections. vLLM itself serves HTTP/1.1 only, and its clients (OpenAI's and Anthropic's
# SDKs, curl, vllm bench) use HTTP/1.1 unless told otherwise: nothing is lost.
H1_ONLY = "proto h1"
# front.tls: the certificate the front serves, then its private key (PEM, the `crt` HAProxy
# reads), in the front's secrets beside `bearer` (front-tls-file.sh). ALPN offers HTTP/1.1 alone,
# so a TLS client asking for h2 gets HTTP/1.1 as over clear text (H1_ONLY stays on the bind);
# TLS 1.2 is the oldest it accepts (HAProxy 2.6's default too, kept whatever a build says), and
# the ciphers are HAProxy's and OpenSSL's defaults: nothing here to keep up to date.
TLS_CERT_NAME = "tls.pem"
TLS_BIND = "ssl crt {crt} alpn http/1.1 ssl-min-ver TLSv1.2"

# A generation can stream for many minutes: the client and server timeouts bound idle time
# between bytes, not the whole request. A request's headers must arrive within
# HEADERS_SECONDS, and an idle kept-alive connection closes after it: a client without the key
# (the 401 comes once its headers are in) holds a connection that long at most.
IDLE_SECONDS = 3600
HEADERS_SECONDS = 10
# A reload (a key added, changed or revoked) leaves the previous workers serving what they hold:
# a request in flight, a stream, and then its connection, checked against the keys they loaded.
# HAProxy closes their idle kept-alive connections at once, and a busy one once its request is
# answered (configuration manual 2.6, `close-spread-time` unset), but a stream runs on for as
# long as it lasts, its key revoked or not. `hard-stop-after` ends the previous workers, and
# every connection they still hold, this long after the reload: a revoked key's last stream ends
# within it, and so does any other stream longer than that which is under way at a reload.
RELOAD_DRAIN_SECONDS = 300


def front_bind(plan: ClusterPlan) -> str:
    """HAProxy's `bind` address for `vllm.listen`: every interface (IPv4 and IPv6), the head's
    fabric IP, or loopback (reached through an SSH tunnel)."""
    port = plan.config.vllm.port
    return {
        "all": f":::{port} v4v6",
        "fabric": f"{plan.head.fabric_ip}:{port}",
        "loopback": f"127.0.0.1:{port}",
    }[plan.config.vllm.listen]


def subject_alt_name(host: str) -> str:
    """openssl's subjectAltName for the address clients use: an IP address or a DNS name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"


def tls_cert_of(plan: ClusterPlan) -> str | None:
    """The front's certificate and key as its container reads them, with front.tls on."""
    if not plan.config.front.tls.enabled:
        return None
    return f"{CONTAINER_FRONT_SECRETS_DIR}/{TLS_CERT_NAME}"


@dataclass(frozen=True)
class Route:
    """One served name behind the front, and the servers that answer it (replicas, balanced)."""

    served_name: str
    model_id: str
    max_model_len: int | None
    servers: tuple[tuple[str, str], ...]  # (label, host:port)


@dataclass(frozen=True)
class Key:
    """A named key as the front sees it: its name, the served names it may use (None: every
    one) and the requests it may make in KEY_WINDOW_SECONDS (None: no limit)."""

    name: str
    models: tuple[str, ...] | None = None
    requests_per_minute: int | None = None


def keys_of(plan: ClusterPlan) -> tuple[Key, ...]:
    """`keys`, as the front checks them (their values are in the map file, not here)."""
    return tuple(
        Key(key.name, tuple(key.models) if key.models else None, key.requests_per_minute)
        for key in plan.config.keys or ()
    )


def routes_of(plan: ClusterPlan) -> tuple[Route, ...]:
    """One route per served name, in the fleet's order (the first is where a request without
    `model` goes); entries sharing a name are its replicas. Each server listens at its slot's
    port on the head's loopback, or on its worker's fabric IP."""
    servers: dict[str, list[ServerPlan]] = {}
    for server in per_server(plan):
        servers.setdefault(server.served.served_name, []).append(server)
    return tuple(
        Route(
            name,
            replicas[0].served.id,
            replicas[0].served.settings.max_model_len,
            tuple((r.slot.named("vllm"), f"{r.server_address}:{r.server_port}") for r in replicas),
        )
        for name, replicas in servers.items()
    )


def handover_address(metrics_port: int) -> str:
    """Where the front's local peer listens: the old workers push the keys' table there at a
    reload (HANDOVER_PEERS)."""
    return f"{HANDOVER_HOST}:{metrics_port}"


def front_config(plan: ClusterPlan) -> str:
    """haproxy.cfg for the plan's routes (router_config)."""
    bearer = f"{CONTAINER_FRONT_SECRETS_DIR}/{BEARER_FILE_NAME}"
    models = f"{CONTAINER_FRONT_DIR}/{MODELS_FILE_NAME}"
    metrics_port = plan.config.front.metrics_port
    metrics = f"127.0.0.1:{metrics_port}"
    per_client = plan.config.front.max_connections_per_client
    keys = keys_of(plan)
    return router_config(
        front_bind(plan),
        bearer,
        routes_of(plan),
        models,
        metrics,
        per_client=per_client,
        keys=keys,
        keys_map=f"{CONTAINER_FRONT_SECRETS_DIR}/{KEYS_MAP_NAME}",
        keys_lua=f"{CONTAINER_FRONT_DIR}/{KEYS_LUA_NAME}",
        handover=handover_address(metrics_port),
        handover_cert=f"{CONTAINER_FRONT_SECRETS_DIR}/{HANDOVER_CERT_NAME}",
        body_lua=f"{CONTAINER_FRONT_DIR}/{BODY_LUA_NAME}",
        tls_cert=tls_cert_of(plan),
    )


def upstream_map(keys_map: str) -> str:
    """The operator's header map, beside the named keys' map."""
    return keys_map.rsplit("/", 1)[0] + f"/{UPSTREAM_MAP_NAME}"


def error_body(status: int, kind: str, message: str, param: str | None = "model") -> str:
    """vLLM's error shape (ErrorResponse: message, type, param, code), as a config string."""
    error = {"message": message, "type": kind, "param": param, "code": status}
    return haproxy_string(json.dumps({"error": error}))


def haproxy_string(text: str) -> str:
    """`text` as one double-quoted HAProxy configuration word."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def router_config(
    bind: str,
    bearer: str,
    routes: Sequence[Route],
    models_file: str,
    metrics_bind: str | None = None,
    per_client: int = 64,
    max_connections: int | None = None,
    keys: Sequence[Key] = (),
    keys_map: str = "",
    keys_lua: str | None = None,
    handover: str | None = None,
    body_lua: str | None = None,
    handover_cert: str | None = None,
    drain_seconds: int = RELOAD_DRAIN_SECONDS,
    tls_cert: str | None = None,
) -> str:
    """haproxy.cfg: the key on every path (vLLM's own 401 without it), then each request to
    its model's servers by the JSON body's `model` (json_query, HAProxy 2.4 on); no model:
    the first route (vLLM treats `model` as optional); /v1/models is `models_file`, the list
    the plan serves. One route: everything to its server, which answers for itself. Valid
    for HAProxy 2.6 (the lab's Debian package) and 3.2 (the official image). Measured on 2.6
    (docs/design.md, The front): `tune.bufsize` in bytes (2.6 reads "1m" with atol and
    crashes), a body past the buffer without `model` in the part read is refused (413)
    rather than sent to the first model, and `http-no-delay` lets each SSE event out at once
    (50-200 ms late without). No client address holds more than `per_client` connections at
    once (counted as they arrive, before any header: clients without the key cannot hold
    every connection, slowly sending headers that never end). With `keys`, `handover` (the
    local peer's address) and `handover_cert` (its key pair), a reload keeps the keys'
    table, over TLS (HANDOVER_PEERS). Several routes need `body_lua`
    (front_body.BODY_LUA's path): a body whose `model` the front and vLLM could
    read differently is refused before it is routed. HTTP/1.1 only (H1_ONLY). A reload ends
    the previous workers' connections within `drain_seconds` (RELOAD_DRAIN_SECONDS). With
    `tls_cert` (a certificate then its key), HTTPS only on `bind` (TLS_BIND)."""
    unauthorized = haproxy_string(UNAUTHORIZED_BODY)
    unknown = error_body(404, "NotFoundError", "The model `MODEL` does not exist.").replace(
        "MODEL", "%[var(txn.model),json(utf8s)]"
    )
    too_large = error_body(
        413,
        "BadRequestError",
        f"the request body is larger than the front reads ({BODY_BUFFER_BYTES} bytes) and "
        "the part read names no model: put `model` first in the body",
    )
    routing = len(routes) > 1
    if keys and handover is not None and handover_cert is None:
        raise ValueError("the keys' handover is TLS only: handover_cert is required")
    if routing and body_lua is None:
        raise ValueError("several routes read `model` from the body: body_lua is required")
    # Several routes read each body to find its model: large buffers, fewer connections. One
    # route reads no body: HAProxy's default buffers, and the connections it always had.
    most = max_connections or (ROUTER_MAX_CONNECTIONS if routing else MAX_CONNECTIONS)
    limits = [
        f"    maxconn {most}",
        *([f"    tune.bufsize {BODY_BUFFER_BYTES}"] if routing else []),
    ]
    lines = [
        "# Written by spark-vllm (stacks/plan/front.py): changes are replaced on the next up.",
        "global",
        *limits,
        # Root only to read the key's pattern file and bind; then `nobody`.
        "    uid 65534",
        "    gid 65534",
        "    log stdout format raw local0 notice",
        f"    hard-stop-after {drain_seconds}s",
        "defaults",
        "    mode http",
        "    log global",
        "    option dontlognull",
        "    option http-no-delay",
        "    timeout connect 5s",
        f"    timeout http-request {HEADERS_SECONDS}s",
        f"    timeout http-keep-alive {HEADERS_SECONDS}s",
        f"    timeout client {IDLE_SECONDS}s",
        f"    timeout server {IDLE_SECONDS}s",
        "    timeout check 5s",
        # A connection refused (a server that is down, a replica gone) is tried again, on
        # another replica when there is one.
        "    retries 2",
        "    option redispatch",
        "frontend api",
        f"    bind {bind} {TLS_BIND.format(crt=tls_cert) + ' ' if tls_cert else ''}{H1_ONLY}",
        "    stick-table type ipv6 size 100k expire 60s store conn_cur",
        "    tcp-request connection track-sc0 src",
        f"    tcp-request connection reject if {{ sc0_conn_cur gt {per_client} }}",
        # An h2c upgrade is not the front's to offer (H1_ONLY): dropped, so no server behind it
        # can switch the connection to HTTP/2 (HAProxy would tunnel its 101); the request is
        # answered over HTTP/1.1, as RFC 9110 lets a server ignore Upgrade. HTTP2-Settings
        # means nothing without it (HAProxy itself drops Upgrade from a request with a body).
        "    http-request del-header upgrade if { req.hdr(upgrade) -i -m sub h2c }",
        "    http-request del-header http2-settings",
        f"    acl has_key req.hdr(authorization) -m str -f {bearer}",
        *(
            [
                f"    http-request set-var(txn.key) http_auth_bearer,map_str({keys_map})"
                " unless has_key",
                "    acl named_key var(txn.key) -m found",
            ]
            if keys
            else []
        ),
        "    http-request return status 401 content-type application/json"
        f" string {unauthorized} hdr www-authenticate Bearer unless has_key"
        + (" || named_key" if keys else ""),
        *key_lines(keys, keys_map),
    ]
    if keys and handover is not None:
        # In `global`, before the `peers` section that names it (HAProxy ignores it after).
        lines.insert(lines.index("defaults"), f"    localpeer {LOCAL_PEER}")
    lua = [
        *([keys_lua] if keys and keys_lua is not None and metrics_bind is not None else []),
        *([body_lua] if routing and body_lua is not None else []),
    ]
    if lua:
        # HAProxy 3.2 (the official image) warns at every start unless the way Lua receives
        # boolean samples is set before `lua-load` (configuration manual 3.2,
        # tune.lua.bool-sample-conversion; `normal` is the one it recommends). keys.lua reads only
        # the stick table's integers and body.lua the body, so either value serves them; 2.6
        # (Debian, the tests) knows no such keyword, hence the conditional block (manual 2.4,
        # "Conditional blocks").
        at = lines.index("defaults")
        lines[at:at] = [
            ".if version_atleast(3.2)",
            "    tune.lua.bool-sample-conversion normal",
            ".endif",
            *(f"    lua-load {path}" for path in lua),
        ]
    if metrics_bind is not None:
        # HAProxy's Prometheus exporter (built in: Debian's 2.6, the official images' USE_PROMEX)
        # on loopback only: requests, errors, queue and response times per backend (model).
        lines[lines.index("frontend api") : lines.index("frontend api")] = [
            "frontend metrics",
            f"    bind {metrics_bind}",
            "    no log",
            *(
                [f"    http-request use-service lua.key_metrics if {{ path {KEY_METRICS_PATH} }}"]
                if keys and keys_lua is not None
                else []
            ),
            "    http-request use-service prometheus-exporter if { path /metrics }",
            "    http-request return status 404",
        ]
    if not routing:
        # One model: every request to its server, which answers for its name itself (vLLM's
        # 404 for another); the configuration does not name it, so a new name leaves the
        # front as it is.
        lines += ["    default_backend model_0", *backend_lines(0, routes[0], named=False)]
        return "\n".join([*lines, *keys_table(keys, handover, handover_cert), ""])
    served = [route.served_name for route in routes]
    lines += [
        *(
            "    http-request return status 200 content-type application/json"
            f" file {key_models_file(models_file, key.name)} if METH_GET {{ path /v1/models }}"
            f" key_{index}"
            for index, key in enumerate(keys)
            if limited_models(key, served)
        ),
        "    http-request return status 200 content-type application/json"
        f" file {models_file} if METH_GET {{ path /v1/models }}",
        "    http-request wait-for-body time 30s if METH_POST",
        *body_check_lines(),
        "    http-request set-var(txn.model) req.body,json_query('$.model') if METH_POST",
        "    http-request set-var(txn.body_read) req.body_len if METH_POST",
        "    acl body_cut req.body_size,sub(txn.body_read) gt 0",
        # Media types are case-insensitive (RFC 9110, 8.3.1): `Application/JSON` is JSON too.
        "    acl json_body req.hdr(content-type) -i -m beg application/json",
        *(
            f"    acl model_{index} var(txn.model) -m str {haproxy_string(route.served_name)}"
            for index, route in enumerate(routes)
        ),
        *forbidden_lines(keys, served),
        "    http-request return status 413 content-type application/json"
        f" string {too_large} if METH_POST json_body !{{ var(txn.model) -m found }} body_cut",
        "    http-request return status 404 content-type application/json"
        f" lf-string {unknown} if {{ var(txn.model) -m found }} "
        + " ".join(f"!model_{index}" for index in range(len(routes))),
        *(f"    use_backend model_{index} if model_{index}" for index in range(len(routes))),
        "    default_backend model_0",
    ]
    for index, route in enumerate(routes):
        lines += backend_lines(index, route, named=True)
    return "\n".join([*lines, *keys_table(keys, handover, handover_cert), ""])


def body_check_lines() -> list[str]:
    """A POST body whose `model` the front and vLLM could read differently: a JSON 400 naming
    why (front_body.py), before the front reads `model` to route it."""
    return [
        f"    http-request set-var(txn.model_check) lua.{MODEL_CHECK_FETCH} if METH_POST",
        *(
            "    http-request return status 400 content-type application/json string "
            + error_body(400, "BadRequestError", refusal.message)
            + f" if METH_POST {{ var(txn.model_check) -m str {refusal.code} }}"
            for refusal in BODY_REFUSALS
        ),
    ]


def route_lines() -> list[str]:
    """A named key on a route that is not a client's (client_routes.py): a JSON 403 naming the
    method and path asked for."""
    refused = error_body(
        403,
        "PermissionDeniedError",
        "`METHOD PATH` is not open to this key: named keys reach the models' client routes "
        "only (/v1/chat/completions, /v1/completions, /v1/models...).",
        param=None,
    ).replace("METHOD PATH", "%[method,json(utf8s)] %[path,json(utf8s)]")
    return [
        f"    acl client_get path {' '.join(client_paths('GET'))}",
        f"    acl client_post path {' '.join(client_paths('POST'))}",
        "    http-request return status 403 content-type application/json"
        f" lf-string {refused} if named_key !METH_GET !METH_POST"
        " || named_key METH_GET !client_get || named_key METH_POST !client_post",
    ]


def key_lines(keys: Sequence[Key], keys_map: str) -> list[str]:
    """After the key check: a named key's request goes on to vLLM with the operator's key (vLLM
    checks its own); each named key's requests tracked in KEYS_TABLE (its counters, its rate),
    and a JSON 429 with Retry-After past its limit, before any body is read."""
    if not keys:
        return []
    too_many = error_body(
        429,
        "RateLimitError",
        f"This key's requests per minute are used up; retry after {KEY_WINDOW_SECONDS} s.",
        param=None,
    )
    lines = [
        "    http-request set-header authorization"
        f" %[str(operator),map_str({upstream_map(keys_map)})] if named_key",
        f"    http-request track-sc1 var(txn.key) table {KEYS_TABLE} if named_key",
    ]
    for index, key in enumerate(keys):
        # The map gives the key's entry (stacks/settings.py key_entry): its name, then a tag.
        lines.append(f"    acl key_{index} var(txn.key) -m beg {key.name}{KEY_ENTRY_SEPARATOR}")
        if key.requests_per_minute is not None:
            lines.append(
                "    http-request return status 429 content-type application/json"
                f" hdr retry-after {KEY_WINDOW_SECONDS} string {too_many}"
                f" if key_{index} {{ sc_http_req_rate(1) gt {key.requests_per_minute} }}"
            )
    return [*lines, *route_lines()]


def limited_models(key: Key, served: Sequence[str]) -> list[str] | None:
    """The served names `key` may use when that is not every one (None: every one)."""
    if key.models is None or set(served) <= set(key.models):
        return None
    return [name for name in served if name in key.models]


def forbidden_lines(keys: Sequence[Key], served: Sequence[str]) -> list[str]:
    """A key limited to some models: any other `model` (served or not: the answer tells it
    nothing of the others) is a JSON 403; a request without `model` goes to the first model,
    so it is refused too when that one is not the key's."""
    forbidden = error_body(
        403, "PermissionDeniedError", "The model `MODEL` is not available with this key."
    ).replace("MODEL", "%[var(txn.model),json(utf8s)]")
    no_model = error_body(
        403,
        "PermissionDeniedError",
        "This key must name its model: the request's `model` is missing.",
    )
    lines = []
    for index, key in enumerate(keys):
        allowed = limited_models(key, served)
        if allowed is None:
            continue
        lines.append(
            "    http-request return status 403 content-type application/json"
            f" lf-string {forbidden} if key_{index} {{ var(txn.model) -m found }} "
            + " ".join(f"!model_{served.index(name)}" for name in allowed)
        )
        if served[0] not in allowed:
            lines.append(
                "    http-request return status 403 content-type application/json"
                f" string {no_model} if key_{index} !{{ var(txn.model) -m found }}"
            )
    return lines


def keys_table(
    keys: Sequence[Key], handover: str | None = None, cert: str | None = None
) -> list[str]:
    """The named keys' stick table: per key (its entry, stacks/settings.py key_entry: a new
    key under a revoked key's name is a new entry), its requests (and their rate over
    KEY_WINDOW_SECONDS) and bytes in and out, since the front started; with `handover`, the
    local peer that carries it over a reload, over TLS with `cert` (HANDOVER_PEERS): the new
    workers listen with it and require it of whoever connects (`bind`), the old ones present it
    and require it of whom they reach (`server`, through `default-server`). No expiry: a table
    far larger than the keys never evicts one."""
    if not keys:
        return []
    size = max(1024, 2 * len(keys))
    tls = f"ssl crt {cert} ca-file {cert} verify required"
    peers = (
        [
            f"peers {HANDOVER_PEERS}",
            f"    bind {handover} {tls}",
            f"    default-server {tls}",
            f"    server {LOCAL_PEER}",
        ]
        if handover
        else []
    )
    return [
        *peers,
        f"backend {KEYS_TABLE}",
        f"    stick-table type string len {KEY_ENTRY_LENGTH} size {size} store http_req_cnt,"
        f"http_req_rate({KEY_WINDOW_SECONDS}s),bytes_in_cnt,bytes_out_cnt"
        + (f" peers {HANDOVER_PEERS}" if handover else ""),
    ]


def key_models_file(models_file: str, name: str) -> str:
    """The /v1/models document of a key limited to some models, beside the whole list."""
    return models_file.removesuffix(".json") + f"-{name}.json"


# The per-key counters in Prometheus's text format: HAProxy's exporter shows a stick table's
# size and use, not its entries, so a Lua service (Lua is built into Debian's HAProxy and the
# official images) reads the entries. A key appears once it has made a request. Only the
# configured keys' current entries are printed, each under its name's label written here,
# already escaped: the table can hold other entries (a peer that pushed one, a later
# configuration's key before the reload that names it, a revoked key's under a name now given
# to a new key), and an entry's name printed as it is could close the label and add a line of
# its own to what Prometheus stores. The current entries are the map's (`<key> <entry>`), read
# when the configuration is loaded (as root, before HAProxy drops to `nobody`), their entries
# kept and the keys dropped.
KEYS_LUA = """\
-- Written by spark-vllm (stacks/plan/front.py): the named keys' counters for Prometheus.
local current = {}
local map = io.open("MAP", "r")
if map ~= nil then
  for line in map:lines() do
    local entry = line:match("^%S+%s+(%S+)$")
    if entry ~= nil then current[entry] = true end
  end
  map:close()
end
local metrics = {
  {"spark_vllm_key_requests_total", "http_req_cnt", "Requests made with the key."},
  {"spark_vllm_key_bytes_in_total", "bytes_in_cnt", "Bytes received from clients with the key."},
  {"spark_vllm_key_bytes_out_total", "bytes_out_cnt", "Bytes sent to clients with the key."},
}
-- Each configured key's entry name, and its label value as Prometheus reads it.
local labels = {
LABELS}
core.register_service("key_metrics", "http", function(applet)
  local entries = core.backends["TABLE"].stktable:dump()
  local names = {}
  local named = {}
  for entry in pairs(entries) do
    local name = entry:match("^(.-)SEPARATOR")
    if current[entry] and name ~= nil and labels[name] ~= nil then
      names[#names + 1] = name
      named[name] = entry
    end
  end
  table.sort(names)
  local out = {}
  for _, metric in ipairs(metrics) do
    out[#out + 1] = "# HELP " .. metric[1] .. " " .. metric[3]
    out[#out + 1] = "# TYPE " .. metric[1] .. " counter"
    for _, name in ipairs(names) do
      local value = entries[named[name]][metric[2]] or 0
      out[#out + 1] = string.format('%s{key="%s"} %d', metric[1], labels[name], value)
    end
  end
  local body = table.concat(out, "\\n") .. "\\n"
  applet:set_status(200)
  applet:add_header("content-type", "text/plain; version=0.0.4")
  applet:add_header("content-length", string.len(body))
  applet:start_response()
  applet:send(body)
end)
""".replace("TABLE", KEYS_TABLE).replace("SEPARATOR", "%" + KEY_ENTRY_SEPARATOR)


def prometheus_label_value(text: str) -> str:
    """`text` as a label value in Prometheus's text format (exposition formats: a backslash, a
    double quote and a line feed are escaped; nothing else is)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def lua_string(text: str) -> str:
    """`text` as a Lua string literal: every byte that is not a printable ASCII character other
    than a backslash or a double quote as a decimal escape (`\\ddd`), which Lua reads back
    byte for byte."""
    return (
        '"'
        + "".join(
            chr(byte) if 32 <= byte < 127 and chr(byte) not in '\\"' else f"\\{byte:03d}"
            for byte in text.encode()
        )
        + '"'
    )


def keys_lua(keys: Sequence[Key], keys_map: str) -> str:
    """KEYS_LUA for `keys`: their current entries only (those of `keys_map`, the map's path
    in the front), each under its name's escaped label."""
    labels = "".join(
        f"  [{lua_string(key.name)}] = {lua_string(prometheus_label_value(key.name))},\n"
        for key in keys
    )
    return KEYS_LUA.replace("LABELS", labels).replace('"MAP"', lua_string(keys_map))


def backend_lines(index: int, route: Route, named: bool) -> list[str]:
    """A route's servers, balanced between replicas, and a JSON 503 in vLLM's shape when none
    is up (naming the model when several share the front). Health-checked (vLLM's /health)
    where the front chooses: between replicas. One server alone is not (no choice to make, each
    check is a line in vLLM's access log, and a check that times out on a busy head would
    mark a serving model down: the lab saw one such 503): a refused connection is the 503."""
    model = f"The model `{route.served_name}`"
    down = f"{model} has no server up" if named else "The server is not up"
    unavailable = f"{model} is unavailable" if named else "The server is unavailable"
    checked = len(route.servers) > 1
    checks = [
        "    option httpchk GET /health",
        "    http-check expect status 200",
        # Every 5 s; a server that is down every second, back after one good check.
        "    default-server check inter 5s fastinter 1s downinter 1s rise 1 fall 2",
        "    http-request return status 503 content-type application/json string "
        + error_body(503, "ServiceUnavailableError", down)
        + " if { nbsrv lt 1 }",
    ]
    return [
        f"backend model_{index}",
        "    balance leastconn",
        *(checks if checked else []),
        "    http-error status 503 content-type application/json string "
        + error_body(503, "ServiceUnavailableError", unavailable),
        *(f"    server {label} {address}" for label, address in route.servers),
    ]


def models_document(routes: Sequence[Route], only: Sequence[str] | None = None) -> str:
    """What /v1/models answers for several routes: vLLM's list, one entry per served name (those
    in `only`, when given: a key's models)."""
    data = [
        {
            "id": route.served_name,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "root": route.model_id,
            "parent": None,
            **({"max_model_len": route.max_model_len} if route.max_model_len else {}),
        }
        for route in routes
        if only is None or route.served_name in only
    ]
    return json.dumps({"object": "list", "data": data})


def front_files(plan: ClusterPlan) -> list[tuple[str, str]]:
    """The files the configuration reads beside it in the front's directory (by name): the
    models list with several models, and each limited key's; the per-key metrics' Lua."""
    routes = routes_of(plan)
    files = []
    if len(plan.servers) > 1:
        files.append((MODELS_FILE_NAME, models_document(routes)))
        served = [route.served_name for route in routes]
        for key in keys_of(plan):
            allowed = limited_models(key, served)
            if allowed is not None:
                name = key_models_file(MODELS_FILE_NAME, key.name)
                files.append((name, models_document(routes, allowed)))
    if len(routes) > 1:
        files.append((BODY_LUA_NAME, BODY_LUA))
    if plan.config.keys:
        keys_map = f"{CONTAINER_FRONT_SECRETS_DIR}/{KEYS_MAP_NAME}"
        files.append((KEYS_LUA_NAME, keys_lua(keys_of(plan), keys_map)))
    return files


def front_config_digest(plan: ClusterPlan) -> str:
    """The configuration's hash (with several models, the models list's too): in the reload
    step's command, so a changed file reloads the front (front-reload.sh). A self-signed
    certificate's name too: a new name makes a new certificate, which the front reloads to
    serve (the user's certificate reloads it through the reload's secret trigger)."""
    served = front_config(plan)
    for _, text in front_files(plan):  # read when the configuration is loaded
        served += text
    if plan.config.front.tls.made_on_head:
        served += subject_alt_name(plan.endpoint_host)
    return hashlib.sha256(served.encode()).hexdigest()[:16]


def first_certificate(text: str) -> str:
    """The first PEM certificate in `text` (a chain's leaf, or what front-tls-file.sh printed);
    empty when there is none."""
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        return ""
    return text[start : stop + len(end)] + "\n"


def certificate_sha256(pem: str) -> str:
    """A PEM certificate's SHA-256 fingerprint as `openssl x509 -fingerprint -sha256` prints it
    (`AB:CD:...`), for clients that pin it; empty without a certificate."""
    body = first_certificate(pem).splitlines()[1:-1]
    if not body:
        return ""
    digest = hashlib.sha256(base64.b64decode("".join(body))).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))
