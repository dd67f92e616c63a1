"""`vllm bench serve`, the subset spark-vllm runs (TEST DOUBLE, not vLLM's load generator).

The flags, the result file and its keys are vLLM's (vllm/benchmarks/serve.py and
datasets.py, 0.11.0 to 0.34): a closed loop of `--max-concurrency` streams over `--num-prompts`
random prompts of `--random-input-len` tokens asking for `--random-output-len` tokens each,
with the key from OPENAI_API_KEY; one ready-check request first. The measures are real: each
request's time to first token, the gaps between its tokens, its end-to-end time, counted by
this client. The stand-in's tokens are words, and it needs no tokenizer (`--tokenizer` must
name a directory that exists, as vLLM must load one from it).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

METRICS = ("ttft", "tpot", "itl", "e2el")


def add_bench_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="openai", choices=("openai", "vllm"))
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--endpoint", default="/v1/completions", choices=("/v1/completions",))
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--tokenizer-mode", default="auto")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--dataset-name", default="random", choices=("random",))
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--request-rate", default="inf", choices=("inf",))
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--percentile-metrics", default="ttft,tpot,itl")
    parser.add_argument("--metric-percentiles", default="99")
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.add_argument("--ready-check-timeout-sec", type=int, default=600)
    parser.add_argument("--save-result", action="store_true")
    parser.add_argument("--save-detailed", action="store_true")
    parser.add_argument("--result-dir", default=None)
    parser.add_argument("--result-filename", default=None)


@dataclass
class Outcome:
    ok: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""


def stream_one(url: str, model: str, prompt: str, output_len: int, timeout: float) -> Outcome:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "stream": True,
            "ignore_eos": True, "temperature": 0.0}  # fmt: skip
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    request.add_header("Authorization", f"Bearer {os.environ.get('OPENAI_API_KEY')}")
    outcome = Outcome(prompt_tokens=len(prompt.split()))
    started = time.perf_counter()
    last = started
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    outcome.ok = outcome.output_tokens > 0  # a whole stream, not a cut one
                    break
                if not line.startswith("data: "):
                    continue
                choices = json.loads(line[len("data: ") :]).get("choices") or []
                if not any(c.get("text") for c in choices):
                    continue
                now = time.perf_counter()
                if outcome.output_tokens == 0:
                    outcome.ttft = now - started
                else:
                    outcome.itls.append(now - last)
                last = now
                outcome.output_tokens += 1
        outcome.latency = time.perf_counter() - started
        if not outcome.ok:
            outcome.error = "the stream ended before [DONE]"
    except (OSError, ValueError, http.client.HTTPException) as error:
        outcome.error = str(error)
    return outcome


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile's default (linear interpolation), as vLLM computes them."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def metric_key(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def summarize(args: argparse.Namespace, outcomes: list[Outcome], duration: float) -> dict:
    done = [o for o in outcomes if o.ok]
    inputs = sum(o.prompt_tokens for o in done)
    outputs = sum(o.output_tokens for o in done)
    samples = {
        "ttft": [o.ttft for o in done],
        "tpot": [(o.latency - o.ttft) / (o.output_tokens - 1) for o in done if o.output_tokens > 1],
        "itl": [gap for o in done for gap in o.itls],
        "e2el": [o.latency for o in done],
    }
    result = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": args.backend,
        "model_id": args.model,
        "tokenizer_id": args.tokenizer or args.model,
        "num_prompts": args.num_prompts,
        "request_rate": "inf",
        "max_concurrency": args.max_concurrency,
        "duration": duration,
        "completed": len(done),
        "failed": len(outcomes) - len(done),
        "total_input_tokens": inputs,
        "total_output_tokens": outputs,
        "request_throughput": len(done) / duration if duration else 0.0,
        "output_throughput": outputs / duration if duration else 0.0,
        "total_token_throughput": (inputs + outputs) / duration if duration else 0.0,
        "errors": [o.error for o in outcomes if not o.ok][:5],
    }
    percentiles = [float(p) for p in args.metric_percentiles.split(",") if p]
    for metric in args.percentile_metrics.split(","):
        values = [v * 1000 for v in samples.get(metric, [])]
        result[f"mean_{metric}_ms"] = statistics.fmean(values) if values else 0.0
        result[f"median_{metric}_ms"] = statistics.median(values) if values else 0.0
        result[f"std_{metric}_ms"] = statistics.pstdev(values) if values else 0.0
        for p in percentiles:
            result[f"p{metric_key(p)}_{metric}_ms"] = percentile(values, p)
    if not args.save_detailed:  # vLLM keeps the per-request arrays only when asked
        del result["errors"]
    return result


def ready_check(url: str, model: str, output_len: int, timeout_s: int) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = stream_one(url, model, "ready check", min(output_len, 8), 60)
        if outcome.ok:
            return
        if time.monotonic() >= deadline:
            raise SystemExit(f"Initial test run failed - Please make sure benchmark arguments "
                             f"are correctly specified. Error: {outcome.error}")  # fmt: skip
        time.sleep(5)


def run_bench_serve(args: argparse.Namespace) -> int:
    if args.tokenizer and not Path(args.tokenizer).is_dir():
        print(f"OSError: Can't load tokenizer for '{args.tokenizer}'", file=sys.stderr)
        return 1
    base = args.base_url or f"http://{args.host}:{args.port}"
    url = base.rstrip("/") + args.endpoint
    model = args.served_model_name or args.model
    words = [f"w{i}" for i in range(5000)]
    rng = random.Random(args.seed)
    prompts = [
        " ".join(rng.choices(words, k=args.random_input_len)) for _ in range(args.num_prompts)
    ]
    print("Starting initial single prompt test run...")
    if args.ready_check_timeout_sec > 0:
        ready_check(url, model, args.random_output_len, args.ready_check_timeout_sec)
    print(f"Maximum request concurrency: {args.max_concurrency}")
    outcomes: list[Outcome] = [Outcome() for _ in prompts]
    queue = list(enumerate(prompts))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                index, prompt = queue.pop(0)
            outcomes[index] = stream_one(url, model, prompt, args.random_output_len, 600)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.max_concurrency or len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = summarize(args, outcomes, time.perf_counter() - started)
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print("{:<40} {:<10}".format("Successful requests:", result["completed"]))
    print("{:<40} {:<10}".format("Failed requests:", result["failed"]))
    print(
        "{:<40} {:<10.2f}".format("Output token throughput (tok/s):", result["output_throughput"])
    )
    if result["completed"] == 0:
        print("All requests failed. This is likely due to a misconfiguration on the benchmark "
              "arguments.", file=sys.stderr)  # fmt: skip
    if args.save_result:
        directory = Path(args.result_dir or ".")
        directory.mkdir(parents=True, exist_ok=True)
        name = args.result_filename or f"openai-infqps-concurrency{args.max_concurrency}.json"
        (directory / name).write_text(json.dumps(result))
    return 0
