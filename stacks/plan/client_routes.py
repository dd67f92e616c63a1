"""What a named key may ask of vLLM through the front: the routes a client of the served models
needs, and nothing else. vLLM's server carries, beside them, routes that change or read the
server itself, turned on by a flag or a variable of the image or of `extraArgs`/`env`: LoRA
loading (`/v1/load_lora_adapter`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING`), the profiler
(`/start_profile`, `--profiler-config`), sleep mode (`/sleep`, `/wake_up`), `/pause`,
`/reset_prefix_cache`, `/collective_rpc`, `/scale_elastic_ep`, stored responses
(`/v1/responses/{id}`, readable by anyone who has the id), `/metrics`, `/server_info`, the
OpenAPI pages... A named key is handed to someone who uses the models, not to an operator: the
front admits it only on the routes below (a JSON 403 on any other), whatever the image turns
on. The operator's own key (`apiKey`) still reaches every route.

The routes are vLLM's OpenAI-compatible server's client routes (vLLM's docs, "OpenAI-Compatible
Server", Supported APIs, and its api routers): exact paths, no prefix, so that a route a later
vLLM adds under /v1 stays closed until it is listed here. A path is matched as the client wrote
it, before any decoding: a spelling vLLM would route to an admitted route (`/v1//models`,
`%2F`) is refused, never the reverse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Method = Literal["GET", "POST"]


@dataclass(frozen=True)
class ClientRoute:
    """One route a named key may use."""

    method: Method  # GET admits HEAD too (HAProxy's METH_GET)
    path: str


CLIENT_ROUTES: tuple[ClientRoute, ...] = (
    # The list of models: the front's own document with several models, vLLM's with one.
    ClientRoute("GET", "/v1/models"),
    # Liveness and the server's version, which clients and SDKs read.
    ClientRoute("GET", "/health"),
    ClientRoute("GET", "/version"),
    # OpenAI's generation APIs.
    ClientRoute("POST", "/v1/chat/completions"),
    ClientRoute("POST", "/v1/completions"),
    # OpenAI's Responses API: creating one only. Retrieving or cancelling a stored one
    # (/v1/responses/{id}) reads any key's response by its id: not a named key's.
    ClientRoute("POST", "/v1/responses"),
    # Anthropic's Messages API, which vLLM serves beside OpenAI's.
    ClientRoute("POST", "/v1/messages"),
    # Embeddings and the other pooling models' APIs.
    ClientRoute("POST", "/v1/embeddings"),
    ClientRoute("POST", "/pooling"),
    ClientRoute("POST", "/classify"),
    ClientRoute("POST", "/score"),
    ClientRoute("POST", "/v1/score"),
    # Re-ranking: Jina's (/rerank, /v1/rerank) and Cohere's v2 (/v2/rerank) shapes.
    ClientRoute("POST", "/rerank"),
    ClientRoute("POST", "/v1/rerank"),
    ClientRoute("POST", "/v2/rerank"),
    # Speech to text (a multipart body).
    ClientRoute("POST", "/v1/audio/transcriptions"),
    ClientRoute("POST", "/v1/audio/translations"),
    # The model's tokenizer, to count or check tokens before a request.
    ClientRoute("POST", "/tokenize"),
    ClientRoute("POST", "/detokenize"),
)


def client_paths(method: Method) -> tuple[str, ...]:
    """The paths a named key may use with `method`, in the table's order."""
    return tuple(route.path for route in CLIENT_ROUTES if route.method == method)


def admits(method: str, path: str) -> bool:
    """Whether the front lets a named key's `method` on `path` through (HEAD as GET)."""
    wanted = "GET" if method == "HEAD" else method
    return any(route.method == wanted and route.path == path for route in CLIENT_ROUTES)
