"""The front: HAProxy on the head publishes `vllm.port` and admits only requests that carry the
API key, on every path; vLLM itself listens on loopback only (`vllm.serverPort`).

Why a front at all: vLLM checks the key only on paths under /v1 (and /v2, /inference, /cohere:
its AuthenticationMiddleware), so /invocations, /tokenize, /pooling, /score, /metrics... answer
whoever reaches its port. Why HAProxy (docs/design.md, "The front"): a small, long-kept proxy in
every distribution and as an official multi-arch image, it streams responses unbuffered (SSE),
checks a header against a pattern file (the key never in its configuration), and can route by
the request body's `model` field and balance replicas when several models share the endpoint.

The configuration is a pure function of the plan; the key stays in the secrets directory as a
pattern file (`Bearer <key>`), written beside the key by api-key-file.sh.
"""

from __future__ import annotations

import hashlib
import json

from stacks.plan.nodes import CONTAINER_API_KEY_DIR, DeploymentPlan

CONTAINER_FRONT_DIR = "/spark-vllm/front"  # the host's <state>/front, read-only
FRONT_CONFIG_NAME = "haproxy.cfg"
BEARER_FILE_NAME = "bearer"  # `Bearer <key>`: the one Authorization header the front admits
UNAUTHORIZED_BODY = json.dumps({"error": "Unauthorized"})  # what vLLM itself answers

# A generation can stream for many minutes: the client and server timeouts bound idle time
# between bytes, not the whole request. A request's headers must arrive within 30 s.
IDLE_SECONDS = 3600


def front_bind(plan: DeploymentPlan) -> str:
    """HAProxy's `bind` address for `vllm.listen`: every interface (IPv4 and IPv6), the head's
    fabric IP, or loopback (reached through an SSH tunnel)."""
    port = plan.config.vllm.port
    return {
        "all": f":::{port} v4v6",
        "fabric": f"{plan.head.fabric_ip}:{port}",
        "loopback": f"127.0.0.1:{port}",
    }[plan.config.vllm.listen]


def front_config(plan: DeploymentPlan) -> str:
    """haproxy.cfg: one frontend that refuses a request without the key with vLLM's own 401,
    one backend, the server on loopback. Valid for HAProxy 2.6 (the lab's Debian package) on."""
    bearer = f"{CONTAINER_API_KEY_DIR}/{BEARER_FILE_NAME}"
    server = f"127.0.0.1:{plan.config.vllm.server_port}"
    unauthorized = UNAUTHORIZED_BODY.replace('"', '\\"')
    lines = [
        "# Written by spark-vllm (stacks/plan/front.py): changes are replaced on the next up.",
        "global",
        "    maxconn 4096",
        # Root only to read the key's pattern file and bind; then `nobody`.
        "    uid 65534",
        "    gid 65534",
        "    log stdout format raw local0 notice",
        "defaults",
        "    mode http",
        "    log global",
        "    option dontlognull",
        "    timeout connect 5s",
        "    timeout http-request 30s",
        f"    timeout client {IDLE_SECONDS}s",
        f"    timeout server {IDLE_SECONDS}s",
        "frontend api",
        f"    bind {front_bind(plan)}",
        f"    acl has_key req.hdr(authorization) -m str -f {bearer}",
        "    http-request return status 401 content-type application/json"
        f' string "{unauthorized}" hdr www-authenticate Bearer unless has_key',
        "    default_backend vllm",
        "backend vllm",
        f"    server vllm {server}",
        "",
    ]
    return "\n".join(lines)


def front_config_digest(plan: DeploymentPlan) -> str:
    """The configuration's hash, a label on the front: a changed file restarts it."""
    return hashlib.sha256(front_config(plan).encode()).hexdigest()[:16]
