"""One `vllm bench serve` result (its --save-result JSON on stdin) as the `benchmark: {...}` line
the program publishes, or a clear failure: vLLM's tool exits 0 even when requests failed, so
`completed` is checked here. Keys: vllm/benchmarks/serve.py (0.11.0 to 0.34); `failed` exists
from 0.11.1 only, so it is derived.
    python3 bench_summary.py CONCURRENCY EXPECTED_REQUESTS < result.json"""

from __future__ import annotations

import json
import sys
from typing import Any

PREFIX = "benchmark: "


def summary(result: dict[str, Any], concurrency: int, expected: int) -> dict[str, Any]:
    completed = int(result.get("completed", 0))
    if completed < expected:
        raise ValueError(f"{expected - completed} of {expected} requests failed")

    def ms(key: str) -> float | None:
        value = result.get(key)
        return round(float(value), 2) if value is not None else None

    return {
        "concurrency": concurrency,
        "requests": completed,
        "durationSeconds": round(float(result["duration"]), 3),
        "outputTokensPerSecond": round(float(result["output_throughput"]), 2),
        "totalTokensPerSecond": round(float(result["total_token_throughput"]), 2),
        "requestsPerSecond": round(float(result["request_throughput"]), 3),
        "medianTtftMs": ms("median_ttft_ms"),
        "p99TtftMs": ms("p99_ttft_ms"),
        "medianItlMs": ms("median_itl_ms"),
        "medianTpotMs": ms("median_tpot_ms"),
    }


def main() -> None:
    concurrency, expected = int(sys.argv[1]), int(sys.argv[2])
    try:
        line = summary(json.load(sys.stdin), concurrency, expected)
    except (ValueError, KeyError, TypeError) as error:
        print(f"the result at concurrency {concurrency} is unusable: {error}", file=sys.stderr)
        sys.exit(1)
    print(PREFIX + json.dumps(line, sort_keys=True))


if __name__ == "__main__":
    main()
