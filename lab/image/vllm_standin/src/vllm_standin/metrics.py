"""vLLM's Prometheus metrics, filled by the stand-in's own serving.

Names, label names and histogram buckets are vLLM's (vllm/v1/metrics/loggers.py,
PrometheusStatLogger: labels `model_name` and `engine`; counters exposed with `_total`). The
values are what this process really did: each answered request's time to first token, the gaps
between the tokens it wrote, its end-to-end time, its prompt and generated tokens, the requests
running now, the KV cache those requests hold, and prefix-cache hits (a prompt's leading blocks
that an earlier prompt already had). The stand-in never preempts: that counter stays 0.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
BLOCK_TOKENS = 16  # vLLM's default KV block size: the prefix cache matches whole blocks
KV_CACHE_SEQUENCES = 4  # the stand-in's KV cache holds this many full-length sequences
PREFIX_BLOCKS_KEPT = 4096


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> Iterator[str]:
        for bound, count in zip(self.buckets, self.counts, strict=True):
            yield f'{name}_bucket{{{labels},le="{bound}"}} {count}'
        yield f'{name}_bucket{{{labels},le="+Inf"}} {self.count}'
        yield f"{name}_sum{{{labels}}} {self.total}"
        yield f"{name}_count{{{labels}}} {self.count}"


def prompt_blocks(prompt: str) -> list[str]:
    """The prompt's full KV blocks, each named by everything up to its end (as vLLM's block
    hashes chain the blocks before them)."""
    words = prompt.split()
    chain = hashlib.sha256()
    blocks = []
    for start in range(0, len(words) - len(words) % BLOCK_TOKENS, BLOCK_TOKENS):
        chain.update("\0".join(words[start : start + BLOCK_TOKENS]).encode())
        blocks.append(chain.copy().hexdigest())
    return blocks


class Metrics:
    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.labels = f'model_name="{model_name}",engine="0"'
        self.kv_capacity_tokens = max_model_len * KV_CACHE_SEQUENCES
        self.lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = 0
        self.running: dict[int, int] = {}  # request -> tokens it holds in the KV cache
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.cached_blocks: dict[str, None] = {}  # insertion-ordered: the oldest go first
        self.handles = itertools.count()

    def started(self, prompt: str, prompt_tokens: int) -> int:
        """A request admitted; its prefix-cache lookup. Returns its handle."""
        blocks = prompt_blocks(prompt)
        with self.lock:
            hits = 0
            for block in blocks:
                if block not in self.cached_blocks:
                    break
                hits += BLOCK_TOKENS
            for block in blocks:
                self.cached_blocks.pop(block, None)
                self.cached_blocks[block] = None
            while len(self.cached_blocks) > PREFIX_BLOCKS_KEPT:
                del self.cached_blocks[next(iter(self.cached_blocks))]
            self.prefix_queries += prompt_tokens
            self.prefix_hits += min(hits, prompt_tokens)
            handle = next(self.handles)
            self.running[handle] = prompt_tokens
            return handle

    def finished(
        self, handle: int, token_times: Sequence[float], started: float, prompt_tokens: int
    ) -> None:
        """A request answered: `token_times` are when each generated token was written."""
        with self.lock:
            self.running.pop(handle, None)
            if token_times:
                self.ttft.observe(token_times[0] - started)
            for before, after in itertools.pairwise(token_times):
                self.itl.observe(after - before)
            self.e2e.observe((token_times[-1] if token_times else time.monotonic()) - started)
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += len(token_times)
            self.success += 1

    def abandoned(self, handle: int) -> None:
        with self.lock:
            self.running.pop(handle, None)

    def exposition(self) -> str:
        with self.lock:
            held = sum(self.running.values())
            usage = min(1.0, held / self.kv_capacity_tokens) if self.kv_capacity_tokens else 0.0
            labels = self.labels
            lines = [
                *typed("vllm:num_requests_running", "gauge", labels, len(self.running)),
                *typed("vllm:num_requests_waiting", "gauge", labels, 0),
                *typed("vllm:kv_cache_usage_perc", "gauge", labels, usage),
                *typed("vllm:prefix_cache_queries", "counter", labels, self.prefix_queries),
                *typed("vllm:prefix_cache_hits", "counter", labels, self.prefix_hits),
                *typed("vllm:num_preemptions", "counter", labels, 0),
                *typed("vllm:prompt_tokens", "counter", labels, self.prompt_tokens),
                *typed("vllm:generation_tokens", "counter", labels, self.generation_tokens),
                "# TYPE vllm:request_success counter",
                f'vllm:request_success_total{{{labels},finished_reason="length"}} {self.success}',
            ]
            for name, histogram in (
                ("vllm:time_to_first_token_seconds", self.ttft),
                ("vllm:inter_token_latency_seconds", self.itl),
                ("vllm:e2e_request_latency_seconds", self.e2e),
            ):
                lines.append(f"# TYPE {name} histogram")
                lines.extend(histogram.lines(name, labels))
        return "\n".join(lines) + "\n"


def typed(family: str, kind: str, labels: str, value: float) -> Iterable[str]:
    """One sample with its family's TYPE line; a counter's sample is `<family>_total`, as
    prometheus_client writes it."""
    yield f"# TYPE {family} {kind}"
    sample = f"{family}_total" if kind == "counter" else family
    yield f"{sample}{{{labels}}} {value}"
