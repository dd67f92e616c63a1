"""Command line of the stand-in: the subset of `vllm` / `vllm serve` that spark-vllm relies on.

Unknown flags are rejected with argparse's exit code 2 and "unrecognized arguments", as real vLLM
does, so a flag the program invents (or misspells) fails in the lab instead of in production.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vllm_standin import VERSION
from vllm_standin.bench import add_bench_serve_arguments, run_bench_serve

EXECUTOR_BACKENDS = ("ray", "mp", "uni", "external_launcher")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def human_readable_int(value: str) -> int:
    """Parse `32768`, `32k` or `1M` like vLLM's --max-model-len does (k = 1000, K = 1024)."""
    multipliers = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}
    text = value.strip()
    try:
        if text and text[-1] in multipliers:
            return int(float(text[:-1]) * multipliers[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer: {value!r}") from None


def normalize_flag_spelling(argv: Sequence[str]) -> list[str]:
    """Accept `--max_model_len` for `--max-model-len`, as vLLM's FlexibleArgumentParser does."""
    normalized = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, sep, value = arg.partition("=")
            normalized.append(name.replace("_", "-") + sep + value)
        else:
            normalized.append(arg)
    return normalized


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="Host name to bind (default: all).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None, help="Require this bearer key on /v1/*.")
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--uvicorn-log-level", choices=UVICORN_LOG_LEVELS, default="info")
    parser.add_argument("--enable-log-requests", action="store_true")
    parser.add_argument("--disable-log-stats", action="store_true")
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--tool-call-parser", default=None)
    parser.add_argument("--reasoning-parser", default=None)
    parser.add_argument("--chat-template", default=None)
    # vllm/entrypoints/openai/cli_args.py: no API server on this node (multi-node followers).
    parser.add_argument("--headless", action="store_true", default=False)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", dest="model_flag", default=None, help="Same as MODEL_TAG.")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--revision", default=None)
    parser.add_argument("--tokenizer-revision", default=None)
    parser.add_argument("--download-dir", default=None)
    parser.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--dtype", choices=DTYPES, default="auto")
    parser.add_argument("--quantization", "-q", default=None)
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    parser.add_argument("--max-model-len", type=human_readable_int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    # vllm/config/cache.py (0.10.2 on): the KV cache per GPU in bytes; profiling is skipped.
    parser.add_argument("--kv-cache-memory-bytes", type=human_readable_int, default=None)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    # No argparse choices in vLLM (0.32): any string parses, and VllmConfig's validation refuses
    # an unknown one at start-up, exit 1 (tests/standin/test_conformance.py).
    parser.add_argument("--distributed-executor-backend", default=None)
    # vllm/engine/arg_utils.py (0.11.1 on): multi-node with the mp executor.
    parser.add_argument("--nnodes", "-n", type=int, default=1)
    parser.add_argument("--node-rank", "-r", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=29501)
    # vllm/config/parallel.py (0.18.0 on, PR #36047): torch.distributed's init timeout, the
    # rendezvous included; unset, torch's default.
    parser.add_argument("--distributed-timeout-seconds", type=int, default=None)
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None
    )
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False)


class FullHelp(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.print_help()
        parser.exit()


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level `vllm` parser and its `serve` sub-parser."""
    parser = argparse.ArgumentParser(
        prog="vllm",
        description="vllm-standin (spark-vllm lab test double, not vLLM): vLLM CLI subset.",
    )
    parser.add_argument("-v", "--version", action="version", version=VERSION)
    commands = parser.add_subparsers(dest="command", metavar="{serve,bench}")
    serve = commands.add_parser(
        "serve",
        help="Start the (stand-in) OpenAI-compatible API server.",
        description="Start the stand-in OpenAI-compatible server (TEST DOUBLE, not vLLM).",
        usage="vllm serve [model_tag] [options]",
        add_help=False,
    )
    # vLLM (0.10 on) takes `--help=all` or `--help=<group>`; the stand-in lists all for any.
    serve.add_argument("-h", "--help", nargs="?", const="", action=FullHelp, help="Show help.")
    serve.add_argument("model_tag", nargs="?", default=None, help="HF model id or local path.")
    add_server_arguments(serve)
    add_engine_arguments(serve)
    bench = commands.add_parser("bench", help="Benchmark (stand-in: `bench serve` only).")
    bench_commands = bench.add_subparsers(dest="bench_command", metavar="{serve}")
    add_bench_serve_arguments(bench_commands.add_parser("serve", help="Load an API server."))
    return parser, serve


def validate_serve_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The argument errors vLLM reports before doing any work (argparse-style, exit code 2)."""
    if args.model_tag and args.model_flag and args.model_tag != args.model_flag:
        parser.error("model_tag and --model differ; give the model once")
    if not (args.model_tag or args.model_flag):
        parser.error("the following arguments are required: model_tag")
    for flag in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        parser.error(
            f"GPU memory utilization must be within (0, 1]. Got {args.gpu_memory_utilization}."
        )
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        parser.error("--enable-auto-tool-choice requires --tool-call-parser to be set")


def warn_about_model_flag(args: argparse.Namespace) -> None:
    """vLLM 0.11.1 on (vllm/entrypoints/cli/serve.py): `--model` still works, with a warning
    (before 0.11.1 it was an error); the model is positional."""
    if args.model_flag and not args.model_tag:
        print(
            "WARNING With `vllm serve`, you should provide the model as a positional argument "
            "or in a config file instead of via the `--model` option. The `--model` option "
            "will be removed in a future version.",
            file=sys.stderr,
        )


def main(argv: Sequence[str] | None = None) -> None:
    raw_args = list(sys.argv[1:] if argv is None else argv)
    parser, serve_parser = build_parsers()
    args = parser.parse_args(normalize_flag_spelling(raw_args))
    if args.command == "bench" and args.bench_command == "serve":
        sys.exit(run_bench_serve(args))
    if args.command != "serve":
        parser.print_help()
        sys.exit(0 if args.command is None and not raw_args else 2)
    validate_serve_args(serve_parser, args)
    warn_about_model_flag(args)

    # Imported late so `--help`, `--version` and flag errors stay fast and need no Ray.
    from vllm_standin.config import ServeConfig
    from vllm_standin.serve import run_serve

    backend = args.distributed_executor_backend
    if backend is not None and backend not in EXECUTOR_BACKENDS:
        # What vLLM 0.32 prints for `--distributed-executor-backend x` (a pydantic error).
        print(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
            "  Value error, not enough values to unpack (expected 2, got 1) [type=value_error]",
            file=sys.stderr,
        )
        sys.exit(1)
    sys.exit(run_serve(ServeConfig.from_args(args)))
