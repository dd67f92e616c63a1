"""The stand-in's `vllm bench serve` against a stand-in server: vLLM's flags, its result file's
keys, real measures from the streams, the key from OPENAI_API_KEY, and a refused key failing
every request without failing the tool (as vLLM's: the caller must check `completed`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .helpers import TINY_MODEL, StandinFactory

KEY = "bench-key"


def bench(standin_bin: Path, base_url: str, result_dir: Path, key: str, concurrency: int,
          tokenizer: Path) -> tuple[subprocess.CompletedProcess[str], dict]:  # fmt: skip
    argv = [
        str(standin_bin / "vllm"), "bench", "serve", "--backend", "openai",
        "--base-url", base_url, "--endpoint", "/v1/completions", "--model", "tiny",
        "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", "32",
        "--random-output-len", "16", "--ignore-eos", "--num-prompts", str(4 * concurrency),
        "--max-concurrency", str(concurrency), "--request-rate", "inf", "--temperature", "0",
        "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99", "--disable-tqdm", "--ready-check-timeout-sec", "5",
        "--save-result", "--result-dir", str(result_dir),
        "--result-filename", f"c{concurrency}.json",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OPENAI_API_KEY": key})  # fmt: skip
    path = result_dir / f"c{concurrency}.json"
    return done, json.loads(path.read_text()) if path.exists() else {}


def test_bench_serve_measures_the_server_as_vllms_does(
    standin: StandinFactory, standin_bin: Path, tmp_path: Path
) -> None:
    server = standin(TINY_MODEL, "--served-model-name", "tiny", "--api-key", KEY,
                     "--max-model-len", "1024")  # fmt: skip
    server.wait_ready(timeout_s=60)
    done, result = bench(standin_bin, server.base_url, tmp_path, KEY, 4, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Serving Benchmark Result" in done.stdout
    assert result["completed"] == result["num_prompts"] == 16 and result["failed"] == 0
    assert result["max_concurrency"] == 4 and result["request_rate"] == "inf"
    assert result["total_output_tokens"] == 16 * 16 and result["total_input_tokens"] == 16 * 32
    assert result["output_throughput"] > 0 and result["duration"] > 0
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99"):
            assert f"{stat}_{metric}_ms" in result, (stat, metric)
    assert 0 < result["median_ttft_ms"] <= result["p99_ttft_ms"] <= result["p99_e2el_ms"]
    assert "errors" not in result  # only with --save-detailed

    refused, _ = bench(standin_bin, server.base_url, tmp_path / "bad", "wrong", 1, tmp_path)
    assert refused.returncode != 0 and "Initial test run failed" in refused.stderr
