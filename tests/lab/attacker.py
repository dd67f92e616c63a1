"""Where a hostile neighbour on the management LAN stands: the bastion's own namespace, which
reaches every host's mgmt address (IPv4) and its link-local IPv6 address, but not the fabric.

What it must find on a deployment with the defaults (docs/security.md): SSH, and the published
endpoint, which admits nothing without the key on any route; every other port that listens on
a host's wildcard address (Ray's, vLLM's own, torch's rendezvous) drops its packets; and with
the route to the fabric a neighbour can add, nothing at all on any host's fabric IP.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from openai import AuthenticationError, OpenAI

from lab import Lab
from lab.spec import MGMT_IFNAME

SSH_PORT = 22
WILDCARDS = ("*", "0.0.0.0", "[::]")  # every address, as `ss` prints it
# vLLM's routes (vllm/entrypoints/openai/api_server.py and serve/*): GET, then POST. vLLM's own
# key check covers only /v1 (and /v2, /inference, /cohere): the rest answer anyone.
GET_ROUTES = ("/v1/models", "/health", "/ping", "/version", "/metrics", "/load", "/")
POST_ROUTES = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/invocations",
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
    "/v2/rerank",
    "/v1/responses",
)


@dataclass(frozen=True)
class Listener:
    host: str
    port: int
    bound: str  # the address it listens on, as `ss` prints it (`*`, `0.0.0.0`, `[::]`)


def listening(lab: Lab, host: str) -> list[tuple[str, int]]:
    """Every TCP listener on `host`: (the address it listens on, as `ss` prints it, its port)."""
    found = []
    for line in lab.sh(host, "ss -Hltn").stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            address, _, port = fields[3].rpartition(":")
            found.append((address, int(port)))
    return found


def wildcard_listeners(lab: Lab, host: str) -> list[Listener]:
    """Every TCP port on `host` that listens on every address (IPv4 or IPv6): what the LAN could
    reach without a firewall."""
    found: dict[int, Listener] = {}
    for address, port in listening(lab, host):
        if address in WILDCARDS:
            found.setdefault(port, Listener(host, port, address))
    return sorted(found.values(), key=lambda listener: listener.port)


def fabric_listeners(lab: Lab, host: str, fabric_ip: str) -> list[int]:
    """Every TCP port on `host` that a packet for its fabric IP reaches: sockets bound to that
    address (NCCL's and Gloo's bootstrap, on ports no list names) and to every address."""
    reached = (*WILDCARDS, fabric_ip)
    return sorted({port for address, port in listening(lab, host) if address in reached})


def assert_a_routed_neighbour_reaches_nothing_on_the_fabric(
    lab: Lab, hosts: tuple[str, ...]
) -> dict[str, list[int]]:
    """A neighbour who routes each host's fabric IP through that host's management address
    (Linux delivers a packet for any of its addresses on any interface) reaches no port at all
    there: not SSH, not the endpoint, not a socket bound to the fabric IP alone."""
    probed: dict[str, list[int]] = {}
    for index, host in enumerate(hosts):
        fabric_ip, mgmt_ip = lab.spec.host_fabric_ip(index), lab.spec.host_mgmt_ip(index)
        ports = fabric_listeners(lab, host, fabric_ip)
        probed[host] = ports
        lab.sh("bastion", f"ip route replace {fabric_ip}/32 via {mgmt_ip}")
        try:
            assert open_from_bastion(lab, fabric_ip, ports) == [], f"{host} {fabric_ip}: open"
        finally:
            lab.sh("bastion", f"ip route del {fabric_ip}/32 via {mgmt_ip}")
    return probed


def link_local(lab: Lab, host: str) -> str:
    """`host`'s IPv6 link-local address on the mgmt LAN, scoped for the bastion's side."""
    out = lab.sh(host, f"ip -6 -o addr show dev {MGMT_IFNAME} scope link").stdout.split()
    address = out[out.index("inet6") + 1].split("/")[0]
    return f"{address}%{MGMT_IFNAME}"


def open_from_bastion(lab: Lab, address: str, ports: list[int]) -> list[int]:
    """The ports of `ports` that accept a TCP connection from the bastion (in parallel, 2 s
    each: a dropped SYN times out, a closed port refuses at once)."""
    if not ports:
        return []
    probes = " ".join(
        f"(timeout 2 bash -c 'exec 3<>/dev/tcp/{address}/{port}' 2>/dev/null && echo {port}) &"
        for port in ports
    )
    out = lab.sh("bastion", f"{probes} wait").stdout
    return sorted(int(word) for word in out.split())


def assert_the_lan_reaches_only_ssh_and_the_endpoint(
    lab: Lab, hosts: tuple[str, ...], endpoint_port: int, *more_endpoints: int
) -> dict[str, list[int]]:
    """On every host, every wildcard listener but SSH (and the endpoint on the head: each
    stack's, with several) is closed to the bastion, over IPv4 and IPv6. Returns what was
    probed, so callers can check it holds the ports they expect (a test that probed nothing
    would prove nothing)."""
    probed: dict[str, list[int]] = {}
    for index, host in enumerate(hosts):
        listeners = wildcard_listeners(lab, host)
        published = {SSH_PORT, endpoint_port, *more_endpoints} if index == 0 else {SSH_PORT}
        closed = sorted({item.port for item in listeners} - published)
        probed[host] = closed
        mgmt_ip = lab.spec.host_mgmt_ip(index)
        assert open_from_bastion(lab, mgmt_ip, closed) == [], f"{host} {mgmt_ip}: open"
        scoped = link_local(lab, host)
        assert open_from_bastion(lab, scoped, closed) == [], f"{host} [{scoped}]: open"
        assert open_from_bastion(lab, mgmt_ip, sorted(published)) == sorted(published), host
    routed = assert_a_routed_neighbour_reaches_nothing_on_the_fabric(lab, hosts)
    assert all(SSH_PORT in ports for ports in routed.values()), routed  # it probed something
    return probed


def bastion_request(
    lab: Lab, url: str, method: str, key: str | None, body: dict[str, object] | None = None
) -> int:
    """The HTTP status the bastion gets for `method url` (curl in its namespace)."""
    args = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "20", "-X", method]
    if key is not None:
        args += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data", json.dumps(body)]
    return int(lab.sh("bastion", shlex.join([*args, url])).stdout.strip() or 0)


def assert_every_route_wants_the_key(lab: Lab, base: str, key: str, model: str) -> None:
    """`base`: http://<head mgmt>:<port>. Without the key, or with a wrong one, every route of
    vLLM's answers 401; with it, the routes the server has answer what the server says."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 4}
    for method, routes in (("GET", GET_ROUTES), ("POST", POST_ROUTES)):
        for route in routes:
            for wrong in (None, f"{key}x", key.upper()):
                status = bastion_request(lab, base + route, method, wrong, body)
                assert status == 401, f"{method} {route} with key {wrong!r}: {status}"
    assert bastion_request(lab, base + "/v1/models", "GET", key) == 200
    assert bastion_request(lab, base + "/invocations", "POST", key, body) == 200
    assert bastion_request(lab, base + "/tokenize", "POST", key, body) == 200


def assert_the_openai_client_streams(endpoint: str, key: str, model: str) -> None:
    """The official client, as users call it: refused without the right key, streamed with it
    (SSE passes through the front unbuffered: several chunks, then the end)."""
    try:
        OpenAI(base_url=endpoint, api_key=f"{key}-wrong", max_retries=0).models.list()
    except AuthenticationError:
        pass
    else:
        raise AssertionError("a wrong key listed the models")
    client = OpenAI(base_url=endpoint, api_key=key, max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=8,
        stream=True,
    )
    chunks = [chunk for chunk in stream]
    assert len(chunks) >= 3, chunks
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
