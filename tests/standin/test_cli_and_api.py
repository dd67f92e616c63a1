"""The stand-in's command line and OpenAI API, on the single-process (uni) backend: no Ray."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import TINY_MODEL, StandinFactory, StandinProcess, clean_env, free_port, http

API_KEY = "lab-secret-key"
SERVED_NAME = "tiny"


def run_cli(standin_bin: Path, hf_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(standin_bin / "vllm"), *args],
        env=clean_env(standin_bin, hf_home),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version_names_the_test_double(standin_bin: Path, driver_hf_home: Path) -> None:
    result = run_cli(standin_bin, driver_hf_home, "--version")
    assert result.returncode == 0
    assert result.stdout.strip() == "0.0.0+spark-vllm-lab-standin"


def test_serve_help_lists_the_program_flags(standin_bin: Path, driver_hf_home: Path) -> None:
    result = run_cli(standin_bin, driver_hf_home, "serve", "--help")
    assert result.returncode == 0
    for flag in ("--tensor-parallel-size", "--distributed-executor-backend", "--api-key"):
        assert flag in result.stdout


def test_unknown_flag_is_rejected_like_argparse(standin_bin: Path, driver_hf_home: Path) -> None:
    result = run_cli(standin_bin, driver_hf_home, "serve", TINY_MODEL, "--not-a-vllm-flag", "1")
    assert result.returncode == 2
    assert "unrecognized arguments: --not-a-vllm-flag" in result.stderr


def test_bad_choice_is_rejected(standin_bin: Path, driver_hf_home: Path) -> None:
    result = run_cli(standin_bin, driver_hf_home, "serve", TINY_MODEL, "--dtype", "x")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_an_unknown_executor_fails_at_start_as_vllms(
    standin_bin: Path, driver_hf_home: Path
) -> None:
    """No argparse choices for it in vLLM 0.32: its config's validation refuses it, exit 1."""
    result = run_cli(
        standin_bin, driver_hf_home, "serve", TINY_MODEL, "--distributed-executor-backend", "x"
    )
    assert result.returncode == 1
    assert "1 validation error for VllmConfig" in result.stderr


@pytest.fixture(scope="module")
def uni_server(
    standin_bin: Path, driver_hf_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StandinProcess]:
    """One server for the API tests: key from VLLM_API_KEY, as the program's launcher does."""
    port = free_port()
    env = clean_env(standin_bin, driver_hf_home) | {"VLLM_API_KEY": API_KEY}
    command = [
        str(standin_bin / "vllm"),
        "serve",
        TINY_MODEL,
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "1024",
        "--gpu-memory-utilization",
        "0.8",
        "--revision",
        "main",
        "--kv-cache-dtype",
        "fp8",
        "--enable-prefix-caching",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "qwen3_coder",
        "--reasoning-parser",
        "qwen3",
    ]
    log = tmp_path_factory.mktemp("uni") / "standin.log"
    server = StandinProcess(command, env, log, port).start()
    try:
        server.wait_ready(timeout_s=60)
        yield server
    finally:
        server.stop()


def test_health_needs_no_key(uni_server: StandinProcess) -> None:
    assert http("GET", uni_server.base_url + "/health") == (200, b"")


def test_v1_routes_need_the_key(uni_server: StandinProcess) -> None:
    status, body = http("GET", uni_server.base_url + "/v1/models")
    assert status == 401
    assert json.loads(body) == {"error": "Unauthorized"}
    status, _ = http("GET", uni_server.base_url + "/v1/models", api_key="wrong")
    assert status == 401
    assert http("GET", uni_server.base_url + "/v1/models", api_key=API_KEY)[0] == 200


def test_the_routes_outside_v1_answer_without_the_key_as_vllms_do(
    uni_server: StandinProcess,
) -> None:
    """vLLM's AuthenticationMiddleware checks /v1 only: /invocations runs a completion, and
    /tokenize and /metrics answer, for anyone who reaches the port (why spark-vllm's front
    exists)."""
    status, body = http("POST", uni_server.base_url + "/invocations",
                        {"prompt": "Hello there", "max_tokens": 3})  # fmt: skip
    assert status == 200 and json.loads(body)["object"] == "text_completion"
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    status, body = http("POST", uni_server.base_url + "/invocations", chat)
    assert status == 200 and json.loads(body)["object"] == "chat.completion"
    status, body = http("POST", uni_server.base_url + "/tokenize", {"prompt": "one two three"})
    assert status == 200 and json.loads(body)["count"] == 3
    status, body = http("GET", uni_server.base_url + "/metrics")
    assert status == 200 and b"vllm:request_success_total" in body


def test_models_lists_the_served_name(uni_server: StandinProcess) -> None:
    _, body = http("GET", uni_server.base_url + "/v1/models", api_key=API_KEY)
    models = json.loads(body)
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [SERVED_NAME]
    assert models["data"][0]["root"] == TINY_MODEL
    assert models["data"][0]["max_model_len"] == 1024


def test_completion_returns_tokens_and_usage(uni_server: StandinProcess) -> None:
    request = {"model": SERVED_NAME, "prompt": "Say hello to the lab", "max_tokens": 5}
    status, body = http("POST", uni_server.base_url + "/v1/completions", request, API_KEY)
    assert status == 200, body
    completion = json.loads(body)
    assert completion["model"] == SERVED_NAME
    assert completion["object"] == "text_completion"
    text = completion["choices"][0]["text"]
    assert len(text.split()) == 5
    assert completion["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    again = json.loads(http("POST", uni_server.base_url + "/v1/completions", request, API_KEY)[1])
    assert again["choices"][0]["text"] == text  # deterministic


def test_chat_completion_returns_an_assistant_message(uni_server: StandinProcess) -> None:
    request = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}]}
    status, body = http("POST", uni_server.base_url + "/v1/chat/completions", request, API_KEY)
    assert status == 200, body
    chat = json.loads(body)
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert len(chat["choices"][0]["message"]["content"].split()) == 16  # default max_tokens
    assert chat["usage"]["completion_tokens"] == 16


def test_unknown_model_is_404_like_vllm(uni_server: StandinProcess) -> None:
    request = {"model": "nope", "prompt": "x"}
    status, body = http("POST", uni_server.base_url + "/v1/completions", request, API_KEY)
    assert status == 404
    assert json.loads(body)["error"] == {
        "message": "The model `nope` does not exist. Valid aliases: tiny.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


def test_context_length_is_enforced_as_vllm_032_does(uni_server: StandinProcess) -> None:
    """max_tokens above the context and a prompt that fills it are refused (`param` names
    which); a prompt and max_tokens that overflow it together are cut to fit."""
    url = uni_server.base_url + "/v1/completions"
    request = {"model": SERVED_NAME, "prompt": "x", "max_tokens": 5000}
    status, body = http("POST", url, request, API_KEY)
    assert status == 400
    error = json.loads(body)["error"]
    assert error["param"] == "max_tokens"
    assert "max_tokens=5000 cannot be greater than max_model_len=1024" in error["message"]
    request = {"model": SERVED_NAME, "prompt": "x " * 1100, "max_tokens": 4}
    status, body = http("POST", url, request, API_KEY)
    assert status == 400 and json.loads(body)["error"]["param"] == "input_tokens"
    request = {"model": SERVED_NAME, "prompt": "x " * 1000, "max_tokens": 100}
    status, body = http("POST", url, request, API_KEY)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 24


def test_streaming_is_server_sent_events(uni_server: StandinProcess) -> None:
    request = {"model": SERVED_NAME, "prompt": "x", "max_tokens": 3, "stream": True}
    status, body = http("POST", uni_server.base_url + "/v1/completions", request, API_KEY)
    assert status == 200
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert len(events) == 4


def test_version_route(uni_server: StandinProcess) -> None:
    status, body = http("GET", uni_server.base_url + "/version")
    assert status == 200
    assert json.loads(body) == {"version": "0.0.0+spark-vllm-lab-standin"}


def test_sigterm_stops_the_server_promptly(standin: StandinFactory) -> None:
    server = standin(TINY_MODEL)
    server.wait_ready(timeout_s=60)
    assert server.process is not None
    server.process.terminate()
    assert server.wait_exit(10) == 0
    assert "vllm-standin (spark-vllm lab test double, not vLLM)" in server.log
    assert "Application startup complete." in server.log


def test_uni_backend_needs_world_size_one(standin: StandinFactory) -> None:
    server = standin(
        TINY_MODEL, "--tensor-parallel-size", "2", "--distributed-executor-backend", "uni"
    )
    assert server.wait_exit(60) == 1
    assert "lab hosts have none" in server.log


def test_model_missing_on_the_api_server_fails_clearly(standin: StandinFactory) -> None:
    server = standin("spark-vllm-lab/absent-model")
    assert server.wait_exit(60) == 1
    assert "no local snapshot of spark-vllm-lab/absent-model@main" in server.log


def test_max_model_len_above_the_model_limit_fails(standin: StandinFactory) -> None:
    server = standin(TINY_MODEL, "--max-model-len", "64k")
    assert server.wait_exit(60) == 1
    assert "User-specified max_model_len (64000)" in server.log


def test_the_compile_cache_is_keyed_like_vllms(standin: StandinFactory, tmp_path: Path) -> None:
    """Each rank compiles into <VLLM_CACHE_ROOT>/torch_compile_cache/<key>/rank_<r>_0 and loads
    from there next time: a start that changes only --gpu-memory-utilization (not in vLLM's
    key) is warm, one that changes --max-model-len is cold. The model given with `--model`
    (deprecated, still accepted) is the same model, so the same key."""
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "cache"), "VLLM_STANDIN_COMPILE_SECONDS": "2"}

    def start(*args: str) -> str:
        server = standin(TINY_MODEL, *args, env=env)
        server.wait_ready(timeout_s=60)
        server.stop()
        return server.log

    cold = start("--max-model-len", "1024", "--gpu-memory-utilization", "0.5")
    assert "rank 0: Compiling a graph for dynamic shape takes 2.0" in cold
    keys = list((tmp_path / "cache" / "torch_compile_cache").iterdir())
    assert len(keys) == 1 and (keys[0] / "rank_0_0" / "computation_graph.py").is_file()
    warm = start("--max-model-len", "1024", "--gpu-memory-utilization", "0.7")
    assert "rank 0: Directly load the compiled graph(s) for dynamic shape from the cache" in warm
    assert "init engine (profile, create kv cache, warmup model) took" in warm
    cold_again = start("--max-model-len", "512")
    assert "rank 0: Compiling a graph" in cold_again
    assert len(list((tmp_path / "cache" / "torch_compile_cache").iterdir())) == 2


def test_the_model_flag_is_deprecated_but_accepted(standin: StandinFactory) -> None:
    server = standin(f"--model={TINY_MODEL}")  # `vllm serve --model=M`: no positional model
    server.wait_ready(timeout_s=60)
    assert "you should provide the model as a positional argument" in server.log
    _, body = http("GET", server.base_url + "/v1/models")
    assert [m["root"] for m in json.loads(body)["data"]] == [TINY_MODEL]


def test_kv_cache_bytes_are_taken_as_given_and_must_hold_one_full_request(
    standin: StandinFactory,
) -> None:
    """--kv-cache-memory-bytes (vLLM 0.10.2 on): the tiny model (2 layers, 4 KV heads of 16,
    float32) takes 1 KiB a token; 2 MiB hold 2048 tokens, two requests of 1024; 512 KiB
    cannot hold one, which vLLM refuses at start naming the length that would fit."""
    server = standin(TINY_MODEL, "--max-model-len", "1024", "--kv-cache-memory-bytes", "2M")
    server.wait_ready(timeout_s=60)
    assert "Reserved 0.00 GiB memory for KV Cache as specified by kv_cache_memory_bytes" in (
        server.log
    )
    assert "GPU KV cache size: 2,048 tokens" in server.log
    assert "Maximum concurrency for 1,024 tokens per request: 2.00x" in server.log
    server.stop()
    server = standin(TINY_MODEL, "--max-model-len", "1024", "--kv-cache-memory-bytes", "512K")
    assert server.wait_exit(60) == 1
    assert "the estimated maximum model length is 512" in server.log
