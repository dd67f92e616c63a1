"""What vLLM opens to the network when a user's value asks it to: flags of `vllm serve` and
environment variables that bind a listening socket on an address or port spark-vllm does not
choose (so neither the firewall's port list nor its fabric rule can know it), or that add routes
no key guards. A stack that sets one is refused before anything is declared
(stacks/config_rules.py).

Read from vLLM 0.34.0's source (commit 62d4bc3c7; paths below are in that wheel): each entry
says what it opens. Flags spark-vllm sets itself (--host, --port, --master-port...) are refused
as managed elsewhere (stacks/vllm_flags.py OWNED_VLLM_FLAGS).
"""

from __future__ import annotations

_DATA_PARALLEL = (
    "data parallelism: rank 0 binds a TCPStore on every address and ZMQ handshake, input and "
    "output sockets on --data-parallel-address at ports it picks (engine/arg_utils.py 1256-1311, "
    "v1/engine/utils.py 1120-1364); spark-vllm runs one engine per model: add a model to "
    "`models` instead"
)
_KV_CONNECTOR = (
    "a KV connector binds its side channel (NIXL's ZMQ router on VLLM_NIXL_SIDE_CHANNEL_HOST:"
    "5600, Mooncake's bootstrap HTTP server on 0.0.0.0:8998 with no key, MoRIIO's on tcp://*) "
    "(distributed/kv_transfer/kv_connector/v1/*)"
)

# Each flag (as vLLM's parser names it, long and short) and what it opens.
LISTENER_FLAGS: dict[str, str] = {
    "--kv-events-config": (
        "publishes KV-cache events on a ZMQ socket bound to its endpoint (tcp://*:5557 by "
        "default: every address) (config/kv_events.py 14-27, distributed/kv_events.py 440-482)"
    ),
    "--kv-transfer-config": _KV_CONNECTOR,
    "--ec-transfer-config": (
        "an encoder-cache connector binds a ZMQ router on VLLM_EC_SIDE_CHANNEL_HOST or the "
        "node's IP (distributed/ec_transfer/ec_connector/*)"
    ),
    "--grpc": (
        "serves gRPC on --host (every address) with reflection and no API key check "
        "(entrypoints/launchers/grpc_server.py 196-235)"
    ),
    "--grpc-port": (
        "opens a second gRPC listener beside the HTTP one (entrypoints/cli/serve.py 308)"
    ),
    "--uds": (
        "serves the API on a Unix socket instead of the port the front forwards to "
        "(launchers/launcher.py 359-377)"
    ),
    "--enable-elastic-ep": (
        "binds a coordination TCPStore on every address and TCP handshake sockets "
        "(v1/engine/utils.py 550-567, 1233-1258)"
    ),
    "--enable-fault-tolerance": (
        "binds recovery TCPStores on every address (v1/fault_tolerance/engine_core_sentinel.py)"
    ),
    "--data-parallel-supervisor-port": "serves /health, /ready with no key on every address",
    **dict.fromkeys(
        [
            "--data-parallel-size",
            "-dp",
            "--data-parallel-rank",
            "-dpn",
            "--data-parallel-start-rank",
            "-dpr",
            "--data-parallel-size-local",
            "-dpl",
            "--data-parallel-address",
            "-dpa",
            "--data-parallel-rpc-port",
            "-dpp",
            "--data-parallel-backend",
            "-dpb",
            "--data-parallel-hybrid-lb",
            "-dph",
            "--data-parallel-external-lb",
            "-dpe",
            "--data-parallel-multi-port-external-lb",
            "-dpm",
        ],
        _DATA_PARALLEL,
    ),
}

# Each variable and what it opens (vllm/envs.py unless said otherwise).
LISTENER_ENV: dict[str, str] = {
    "VLLM_SERVER_DEV_MODE": (
        "adds /collective_rpc, /sleep, /update_weights and other routes that run code or change "
        "the server for anyone who reaches its port, with no key check (entrypoints/serve/"
        "__init__.py 43-65, rl/online/api_router.py)"
    ),
    "VLLM_USE_RUST_FRONTEND": "hands the HTTP and gRPC sockets to a separate binary",
    "VLLM_RUST_FRONTEND_PATH": "hands the HTTP and gRPC sockets to a separate binary",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "moves NIXL's side channel (a ZMQ router) to another address",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "moves NIXL's side channel (a ZMQ router) to another port",
    "VLLM_P2P_SIDE_CHANNEL_HOST": "moves the p2p offload tier's ZMQ router to another address",
    "VLLM_P2P_SIDE_CHANNEL_PORT": "moves the p2p offload tier's ZMQ router to another port",
    "VLLM_EC_SIDE_CHANNEL_HOST": "moves the encoder-cache side channel to another address",
    "VLLM_EC_SIDE_CHANNEL_PORT": "moves the encoder-cache side channel to another port",
    "VLLM_MOONCAKE_BOOTSTRAP_PORT": "moves Mooncake's bootstrap HTTP server (0.0.0.0, no key)",
    "VLLM_DP_MASTER_IP": "a data-parallel rendezvous (TCPStore) on that address",
    "VLLM_DP_MASTER_PORT": "a data-parallel rendezvous (TCPStore) on that port",
    "VLLM_DP_SIZE": "data parallelism without the CLI: its rendezvous listens",
    "VLLM_DP_RANK": "data parallelism without the CLI: its rendezvous listens",
    "VLLM_LOOPBACK_IP": "moves a TCP init method off loopback (utils/network_utils.py 104)",
    "NCCL_COMM_ID": "makes NCCL's bootstrap root listen on that address and port",
    "MASTER_ADDR": "torch's env:// rendezvous: rank 0's TCPStore listens on every address",
    "MASTER_PORT": "torch's env:// rendezvous: rank 0's TCPStore listens on that port",
}
