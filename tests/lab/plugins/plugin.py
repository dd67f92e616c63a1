"""What every plugin process does the same way: the engine's launch protocol and a log file."""

from __future__ import annotations

import logging
import os
import sys
from concurrent import futures
from typing import Any

import grpc

# Large enough for a program's whole state in one message (the engine's own limit is 400 MiB).
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 400 * 1024 * 1024),
    ("grpc.max_send_message_length", 400 * 1024 * 1024),
]


def configure_logging(name: str) -> None:
    """Logs go to $SPARK_VLLM_PLUGIN_LOG (a directory) when set, else stderr, which the engine
    keeps in its own log (`-v=9`, or a failed step's message)."""
    directory = os.environ.get("SPARK_VLLM_PLUGIN_LOG")
    handler: logging.Handler
    if directory:
        os.makedirs(directory, exist_ok=True)
        handler = logging.FileHandler(os.path.join(directory, f"{name}.log"))
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {name}[%(process)d] %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def serve(add_servicer: Any, servicer: Any, workers: int = 32) -> None:
    """The plugin protocol: listen on a loopback port, print it as stdout's first line, serve
    until the engine ends the process."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=GRPC_OPTIONS)
    add_servicer(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:  # the engine ends its plugins with SIGINT: a normal end
        server.stop(grace=None)
