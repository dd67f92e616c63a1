"""The HTTP front end: vLLM's routes on a stdlib ThreadingHTTPServer.

Auth follows vLLM's middleware: with an API key, every path under /v1 needs
`Authorization: Bearer <key>` (401 {"error": "Unauthorized"}); /health, /version, /metrics,
/tokenize and /invocations do not, as in vLLM (they run models for anyone who reaches the port,
which is why spark-vllm puts its front before it).
"""

from __future__ import annotations

import hmac
import json
import logging
import socketserver
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vllm_standin import VERSION
from vllm_standin.metrics import Metrics
from vllm_standin.openai_api import (
    ApiError,
    PlannedResponse,
    ServedModel,
    models_response,
    plan_chat_completion,
    plan_completion,
    plan_invocation,
    plan_tokenize,
)

access_logger = logging.getLogger("uvicorn.access")
MAX_BODY_BYTES = 16 * 1024 * 1024

Planner = Callable[[dict[str, Any], ServedModel], PlannedResponse]
POST_ROUTES: dict[str, Planner] = {
    "/v1/completions": plan_completion,
    "/v1/chat/completions": plan_chat_completion,
    # vLLM's SageMaker route: chat or completion by the body's shape, outside /v1.
    "/invocations": plan_invocation,
    "/tokenize": plan_tokenize,
}
GET_ROUTES = ("/health", "/version", "/v1/models", "/metrics")


class ServerState:
    """What request threads share with the main thread."""

    def __init__(
        self,
        served: ServedModel,
        api_key: str | None,
        access_log: bool,
        engine_check: Callable[[], None],
    ) -> None:
        self.served = served
        self.api_key = api_key
        self.access_log = access_log
        self.engine_check = engine_check  # raises if a rank is gone
        self.engine_dead = threading.Event()
        self.dead_reason = ""
        # /metrics: vLLM's names, filled by what this process serves (metrics.py).
        self.metrics = Metrics(served.served_names[0], served.max_model_len)

    def mark_dead(self, reason: str) -> None:
        if not self.engine_dead.is_set():
            self.dead_reason = reason
            self.engine_dead.set()


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True

    state: ServerState  # set once the engine is up, before the server listens

    def __init__(self, address: tuple[str, int]) -> None:
        # Bind now, listen (server_activate) only when ready: until then connections are
        # refused, as with vLLM, whose port opens only after the engine has started.
        super().__init__(address, ApiHandler, bind_and_activate=False)
        try:
            self.server_bind()
        except OSError:
            self.server_close()
            raise

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the FQDN, which can stall on hosts without DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class ApiHandler(BaseHTTPRequestHandler):
    server: StandinServer
    server_version = "uvicorn"
    sys_version = ""

    # --- plumbing -------------------------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:
        return None  # replaced by uvicorn-style access lines in log_request

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.server.state.access_log:
            status = HTTPStatus(int(code)).phrase if str(code).isdigit() else ""
            client = f"{self.client_address[0]}:{self.client_address[1]}"
            access_logger.info('%s - "%s" %s %s', client, self.requestline, code, status)

    def send_json(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def send_events(self, events: Any) -> list[float]:
        """Streams the events; returns when each event that carried a token was written."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        token_times = []
        for event in events:
            self.wfile.write(event.encode())
            self.wfile.flush()
            if carries_token(event):
                token_times.append(time.monotonic())
        self.close_connection = True
        return token_times

    def send_metrics(self) -> None:
        body = self.server.state.metrics.exposition().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    @property
    def path_only(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def authorized(self) -> bool:
        api_key = self.server.state.api_key
        if not api_key or not self.path_only.startswith("/v1"):
            return True
        supplied = self.headers.get("Authorization", "")
        return hmac.compare_digest(supplied.encode(), f"Bearer {api_key}".encode())

    def read_json_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise ApiError(413, "request body too large", "BadRequestError")
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError as error:
            raise ApiError(400, f"invalid JSON body: {error}", "BadRequestError") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", "BadRequestError")
        return body

    # --- routes ---------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path_only
        if not self.authorized():
            self.send_json(401, {"error": "Unauthorized"})
        elif path == "/health":
            self.send_empty(503 if self.server.state.engine_dead.is_set() else 200)
        elif path == "/version":
            self.send_json(200, {"version": VERSION})
        elif path == "/v1/models":
            self.send_json(200, models_response(self.server.state.served))
        elif path == "/metrics":
            self.send_metrics()
        elif path in POST_ROUTES:
            self.send_json(405, {"detail": "Method Not Allowed"})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path_only
        planner = POST_ROUTES.get(path)
        if not self.authorized():
            self.send_json(401, {"error": "Unauthorized"})
        elif planner is None:
            status = 405 if path in GET_ROUTES else 404
            self.send_json(status, {"detail": HTTPStatus(status).phrase})
        else:
            self.answer(planner)

    def answer(self, planner: Planner) -> None:
        state = self.server.state
        started = time.monotonic()
        try:
            planned = planner(self.read_json_body(), state.served)
            # Like a real generation, a request needs every rank: a dead worker fails it.
            state.engine_check()
        except ApiError as error:
            self.send_json(error.status, error.body)
            return
        except Exception as error:
            state.mark_dead(str(error))
            self.send_json(500, ApiError(500, str(error), "EngineDeadError").body)
            return
        if not planned.completion_tokens:  # /tokenize: no generation to measure
            self.send_json(200, planned.body)
            return
        metrics = state.metrics
        handle = metrics.started(planned.prompt, planned.prompt_tokens)
        try:
            if planned.events is not None:
                token_times = self.send_events(planned.events)
            else:
                # Generated whole: every token is there when the body is.
                token_times = [time.monotonic()] * planned.completion_tokens
                self.send_json(200, planned.body)
        except BaseException:
            metrics.abandoned(handle)
            raise
        metrics.finished(handle, token_times, started, planned.prompt_tokens)


def carries_token(event: str) -> bool:
    """An SSE event with generated text (not the chat role chunk, the usage chunk or [DONE])."""
    if not event.startswith("data: {"):
        return False
    choices = json.loads(event[len("data: ") :]).get("choices") or []
    return any(c.get("text") or (c.get("delta") or {}).get("content") for c in choices)
