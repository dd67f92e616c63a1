"""vllm.benchmark: the step after readiness (its flags, its order, the key kept off its command
line), vllm-bench.sh driving `vllm bench serve` once per concurrency (Docker a stand-in that
answers as the container would), and bench_summary.py's checks of each result."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from stacks.plan.server import parse_benchmark, trusts_remote_code
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate
from tests.program.scripting import SCRIPTS, fake_docker_path, load

RESULT = {"duration": 2.5, "completed": 8, "total_token_throughput": 900.0,
          "output_throughput": 400.0, "request_throughput": 3.2, "median_ttft_ms": 41.234,
          "p99_ttft_ms": 80.0, "median_itl_ms": 9.5, "median_tpot_ms": 9.8}  # fmt: skip


def test_the_benchmark_runs_after_readiness_and_again_for_a_new_server(
    make_config: ConfigFactory,
) -> None:
    config = make_config(hosts=2)
    assert "vllm-benchmark" not in {r.name for r in evaluate(config, SECRETS).registrations}
    config["vllm"] = {**config["vllm"], "benchmark": {"concurrencies": [1, 8]}}
    ev = evaluate(config, SECRETS)
    step = ev.named("vllm-benchmark")
    assert ev.urn("vllm-ready") in step.dependencies
    assert step.inputs["triggers"] == [ev.state[ev.urn("vllm-container")].id]
    command = step.inputs["create"]
    for flag in ("--concurrencies 1,8", "--port 8001", "--served-name qwen",
                 "--model Qwen/Qwen3.5-122B-A10B-FP8", "--revision main", "--input-tokens 1024",
                 "--key-file /run/spark-vllm/api-key", "--timeout-seconds 1800"):  # fmt: skip
        assert flag in command, flag
    assert SECRETS["apiKey"] not in json.dumps(step.inputs)
    assert "benchmark" in ev.outputs


def test_an_empty_or_oversized_benchmark_is_a_keyed_error(make_config: ConfigFactory) -> None:
    from tests.program.planning import error_of

    config = make_config(hosts=2)
    config["vllm"] = {**config["vllm"], "benchmark": {"concurrencies": []}}
    assert "vllm.benchmark.concurrencies: List should have at least 1 item" in error_of(config)
    config["vllm"]["benchmark"] = {"inputTokens": 32000, "outputTokens": 1000}
    assert (
        "vllm.benchmark.inputTokens: 32000 + outputTokens 1000 is more than vllm.maxModelLen "
        "32768; vLLM refuses such requests"
    ) in error_of(config)
    config["vllm"]["benchmark"] = {"concurrencies": [0]}
    assert "vllm.benchmark.concurrencies[0]: Input should be greater than or equal to 1" in (
        error_of(config)
    )


summary_module = load("bench_summary")


def test_a_result_becomes_one_line_of_figures() -> None:
    line = summary_module.summary(RESULT, 4, 8)
    assert line == {
        "concurrency": 4, "requests": 8, "durationSeconds": 2.5, "outputTokensPerSecond": 400.0,
        "totalTokensPerSecond": 900.0, "requestsPerSecond": 3.2, "medianTtftMs": 41.23,
        "p99TtftMs": 80.0, "medianItlMs": 9.5, "medianTpotMs": 9.8,
    }  # fmt: skip
    with pytest.raises(ValueError, match="2 of 8 requests failed"):
        summary_module.summary({**RESULT, "completed": 6}, 4, 8)


FAKE_DOCKER = """#!/usr/bin/env bash
# docker exec C python3 -c FIND ID REV | docker exec C sh -c BENCH sh KEYFILE ARGS... |
# docker exec C sh -c 'cat "$1" && rm -f "$1"' sh FILE
[ "$1" = exec ] || exit 1
shift 2
snapshot=/root/.cache/huggingface/hub/models--org--m/snapshots/abc
if [ "$1" = python3 ]; then echo "a warning"; echo "$snapshot"; exit 0; fi
if [ "$1" = timeout ]; then shift 4; fi  # timeout -k 10 SECONDS: the bench's own limit
script="$3"; shift 4
case "$script" in
  *"bench serve"*)
    [ "$1" = /run/k/api-key ] || exit 3  # the key file, read in the container
    shift
    echo "$* " >> "$FAKE_LOG"
    while [ $# -gt 0 ]; do
      case "$1" in
        --result-dir) dir="$2" ;; --result-filename) file="$2" ;; --num-prompts) n="$2" ;;
      esac; shift
    done
    mkdir -p "$FAKE_ROOT$dir"
    done="${FAKE_COMPLETED:-$n}"
    printf '{"duration": 1.0, "completed": %s, "total_token_throughput": 10, ' "$done" \
      > "$FAKE_ROOT$dir/$file"
    printf '"output_throughput": 5, "request_throughput": 1, "median_ttft_ms": 3}' \
      >> "$FAKE_ROOT$dir/$file"
    echo "============ Serving Benchmark Result ============" ;;
  *cat*) cat "$FAKE_ROOT$1" ;;
esac
"""


def bench(
    tmp_path: Path, flags_changed: dict[str, str] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    flags = {"host": "spark1", "container": "spark-vllm-vllm", "key-file": "/run/k/api-key",
             "port": "8001", "served-name": "m", "model": "org/m", "revision": "main",
             "concurrencies": "1,4", "input-tokens": "16", "output-tokens": "8",
             "requests-per-stream": "2", "timeout-seconds": "60", "trust-remote-code": "no",
             "tokenizer-mode": ""}  # fmt: skip
    flags.update(flags_changed or {})
    argv = ["bash", str(SCRIPTS / "vllm-bench.sh")]
    argv += [word for key, value in flags.items() for word in (f"--{key}", value)]
    fake = {"PATH": fake_docker_path(tmp_path, FAKE_DOCKER), "FAKE_LOG": str(tmp_path / "calls"),
            "FAKE_ROOT": str(tmp_path / "container"), **env}  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **fake})  # fmt: skip


def test_the_script_runs_each_concurrency_in_turn_with_the_key_off_its_command_line(
    tmp_path: Path,
) -> None:
    done = bench(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = parse_benchmark(done.stdout)
    assert [(line["concurrency"], line["requests"]) for line in lines] == [(1, 2), (4, 8)]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2
    assert "--max-concurrency 1 " in calls[0] and "--num-prompts 8 " in calls[1]
    assert "--tokenizer /root/.cache/huggingface/hub/models--org--m/snapshots/abc" in calls[0]
    assert "--model m " in calls[0] and "--base-url http://127.0.0.1:8001" in calls[0]


def test_failed_requests_fail_the_step_naming_the_concurrency(tmp_path: Path) -> None:
    done = bench(tmp_path, FAKE_COMPLETED="1")
    assert done.returncode == 1
    assert "1 of 2 requests failed" in done.stderr
    assert done.stderr.count("spark-vllm: spark1: ") == 1
    assert "vllm bench serve at concurrency 1" in done.stderr


def test_the_tokenizer_loads_as_the_servers_does(tmp_path: Path) -> None:
    done = bench(tmp_path, {"trust-remote-code": "yes", "tokenizer-mode": "mistral"})
    assert done.returncode == 0, done.stderr
    call = (tmp_path / "calls").read_text().splitlines()[0]
    assert "/snapshots/abc --trust-remote-code --tokenizer-mode mistral --dataset-name" in call
    (tmp_path / "plain").mkdir()
    assert bench(tmp_path / "plain").returncode == 0
    plain = (tmp_path / "plain" / "calls").read_text()
    assert "--trust-remote-code" not in plain and "--tokenizer-mode" not in plain


@pytest.mark.parametrize(
    ("extra_args", "trusted"),
    [([], False), (["--trust-remote-code"], True),
     (["--trust-remote-code", "--no-trust-remote-code"], False)],
)  # fmt: skip
def test_trust_remote_code_is_read_as_vllm_reads_it(extra_args: list[str], trusted: bool) -> None:
    assert trusts_remote_code(extra_args) is trusted


def test_the_benchmark_client_sees_no_proxy(tmp_path: Path) -> None:
    """`vllm bench serve`'s client (aiohttp, trust_env) would send the key to a proxy the image
    or vllm.env names: the script the container runs unsets every proxy variable first."""
    text = (SCRIPTS / "vllm-bench.sh").read_text()
    inner = re.search(r"sh -c \\\n\s+'(.*?)' sh \"\$ARG_KEY_FILE\"", text, re.S)
    assert inner is not None
    fake = tmp_path / "bin"
    fake.mkdir()
    fake_vllm = '#!/bin/sh\nenv | grep -i "^[a-z_]*proxy="; echo "key=$OPENAI_API_KEY"\n'
    (fake / "vllm").write_text(fake_vllm)
    (fake / "vllm").chmod(0o755)
    (tmp_path / "key").write_text("k-0123456789abcdef012345")
    proxies = {name: "http://127.0.0.1:9" for name in ("http_proxy", "HTTPS_PROXY", "ALL_PROXY")}
    done = subprocess.run(
        ["sh", "-c", inner[1], "sh", str(tmp_path / "key"), "--backend", "openai"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, **proxies, "PATH": f"{fake}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["key=k-0123456789abcdef012345"]
