"""Real vLLM in the lab: vLLM's CPU build (`python -m lab up --vllm real`, lab/image.py) serves
a tiny real Llama across two lab hosts with the default executor (mp: vLLM's own multi-node
mode, TP=2, one rank a host, meeting over gloo on the lab's fabric), through the bastion,
deployed and changed by the real Pulumi CLI and engine as the README's lab flow runs them
(tests/lab/cli_stack.py).

Nothing here is the stand-in: the flags, the log lines the readiness wait reads, `/metrics`,
`vllm bench serve`, vLLM's own refusals and its compile cache are vLLM's. The image is a real
size too (about 4 GB): its copy to the worker in the first `up` is a figure (beside a raw
`docker save | ssh | docker load`: `python -m lab bench --real-image`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from openai import AuthenticationError, OpenAI

from lab import HF_MODEL, HF_MORE_MODELS, Lab
from lab.image import REAL_VLLM_VERSION
from lab.stack import PROJECT, SERVED_NAME
from stacks.plan.image import pinned_image
from tests.lab import attacker
from tests.lab.cli_stack import CliStack, cli_deployed, cli_next_up
from tests.lab.deploying import (
    API_KEY,
    PREFIX,
    as_fleet,
    benchmark_figure,
    cold_start_figure,
    complete,
    copy_report,
    default_lab_config,
    host_sh,
    image_identity,
)
from tests.lab.realcli import PulumiFailed
from tests.lab.timings import record_figure, record_timing

pytestmark = pytest.mark.lab

WORKER = "spark2"
# Figures of the first `up` that later rows compare with: its readiness (cold compile cache),
# and the image copy's (bytes sent, seconds).
COLD_READINESS: list[str] = []
COPY: dict[str, tuple[int, float]] = {}
COMPRESSION: list[str] = []  # what fabric.compress auto chose for the real image, and why
Stack = CliStack
BENCHMARK = {"concurrencies": [1, 2], "inputTokens": 32, "outputTokens": 16, "requestsPerStream": 2}


def real_config(lab: Lab, **vllm: Any) -> dict[str, Any]:
    """The lab stack as committed, on real vLLM (lab/stack.py real_vllm_settings): every
    default, executor mp, TP=2 over both hosts; with vLLM's own benchmark once ready."""
    config = default_lab_config(lab)
    assert "executor" not in config[f"{PROJECT}:vllm"]
    config[f"{PROJECT}:vllm"] = {**config[f"{PROJECT}:vllm"], "benchmark": BENCHMARK, **vllm}
    return config


@pytest.fixture(scope="module")
def stack(
    lab_factory: Callable[..., Lab], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    lab = lab_factory("real", hosts=2, topology="bastion", vllm="real")
    started = time.monotonic()
    with cli_deployed(lab, real_config(lab), tmp_path_factory.mktemp("cli")) as stack:
        took = time.monotonic() - started
        record_timing("real vLLM: first up (bastion, 2 hosts, mp TP=2)", took)
        COLD_READINESS.append(stack.outputs["readiness"])
        yield stack
    lab.down()


def ready_seconds(readiness: str) -> float:
    found = re.search(r"ready after (\d+(?:\.\d+)?)\s*s", readiness)
    assert found, readiness
    return float(found.group(1))


def test_real_vllm_serves_across_both_hosts(stack: Stack) -> None:
    lab, outputs = stack.lab, stack.outputs
    assert outputs["executor"] == "mp"
    assert outputs["vllmVersion"].startswith("0.32.0"), outputs["vllmVersion"]
    record_figure(
        "real vLLM: time to ready (mp TP=2 across two hosts, cold compile cache)",
        f"{ready_seconds(outputs['readiness']):.0f} s ({outputs['readiness'].splitlines()[0]})",
    )
    (model,) = outputs["models"]
    record_figure(
        "real vLLM: cold start (mp TP=2, cold compile cache)", cold_start_figure(model["coldStart"])
    )
    worker_log = host_sh(lab, WORKER, f"docker logs {PREFIX}-vllm 2>&1")
    # vLLM's own lines: the headless node's executor, and its rank in a gloo group of two.
    assert "headless" in worker_log.lower(), worker_log[-3000:]
    assert re.search(r"world_size=2 rank=1 .*backend=gloo", worker_log), worker_log[-3000:]
    head_log = host_sh(lab, "spark1", f"docker logs {PREFIX}-vllm 2>&1")
    assert re.search(r"world_size=2 rank=0 .*backend=gloo", head_log), head_log[-3000:]
    assert REAL_VLLM_VERSION.split("+")[0] in head_log


def test_the_openai_client_through_the_bastion(stack: Stack) -> None:
    """Models, chat, streaming and completions with the official client; a wrong key is 401."""
    client = OpenAI(base_url=stack.endpoint, api_key=API_KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list()] == [SERVED_NAME]
    chat = client.chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    assert chat.choices[0].message.content and chat.usage and chat.usage.completion_tokens == 8
    text = client.completions.create(model=SERVED_NAME, prompt="Hello", max_tokens=8)
    assert text.choices[0].text and text.usage and text.usage.completion_tokens == 8
    attacker.assert_the_openai_client_streams(stack.endpoint, API_KEY, SERVED_NAME)
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=stack.endpoint, api_key=f"{API_KEY}x", max_retries=0).models.list()
    status, _ = complete(stack.endpoint, SERVED_NAME, key=None)
    assert status == 401


def test_the_readiness_wait_and_the_benchmark_read_real_vllm(stack: Stack) -> None:
    """The wait's real completion and its speed line (labelled with the server's own
    /version), and `vllm bench serve` of the image's own vLLM: its flags taken, its result
    keys read, one row per concurrency."""
    outputs = stack.outputs
    speed = re.search(
        r"speed: time to first token ([\d.]+) s, decode ([\d.]+) tokens/s \(median of 3 "
        r"streamed completions of \d+ tokens; server version ([^)]+)\)",
        outputs["readiness"],
    )
    assert speed and speed.group(3).startswith("0.32.0"), outputs["readiness"]
    (model,) = outputs["models"]
    assert model["timeToFirstTokenSeconds"] > 0 and model["tokensPerSecond"] > 0
    rows = outputs["benchmark"]
    assert [(r["concurrency"], r["requests"]) for r in rows] == [(1, 2), (2, 4)], rows
    assert all(r["outputTokensPerSecond"] > 0 and r["medianTtftMs"] > 0 for r in rows), rows
    record_figure(
        "real vLLM: benchmark (mp TP=2 over the lab fabric, 32 tokens in, 16 out)",
        benchmark_figure(rows),
    )


def test_the_real_size_image_copy(stack: Stack) -> None:
    """The real image went to the worker with the copy engine (image-sync.sh) in the first
    `up`: its bytes and time are the figure, recorded once the stack is torn down."""
    outputs = stack.outputs
    report = copy_report(stack.resource_outputs(f"image-{WORKER}-sync"), "image")
    COPY["engine"] = (report["bytes"], stack.cli.step_seconds("create", f"image-{WORKER}-sync"))
    assert report["bytes"] > 1_000_000_000, report  # a real-size image, not the stand-in's
    # fabric.compress auto (the default) measured before it sent, and said what it chose.
    chosen = report["compress"]
    assert chosen["setting"] == "auto" and chosen["chosen"] in ("zstd", "none"), chosen
    assert chosen["linkMBps"] > 0 and 0 < chosen["ratio"] < 1, chosen
    COMPRESSION.append(chosen["why"])
    assert image_identity(stack.lab, WORKER, pinned_image(outputs["imageId"])) == image_identity(
        stack.lab, "spark1", outputs["imageId"]
    )


def test_an_unknown_flag_is_named_by_the_image_check_from_real_vllms_help(stack: Stack) -> None:
    """vllm.extraArgs checked against the image's own `vllm serve --help` before any container
    changes: a flag this vLLM lacks is named with its nearest real one."""
    config = real_config(stack.lab)
    vllm = config[f"{PROJECT}:vllm"]
    config[f"{PROJECT}:vllm"] = {**vllm, "extraArgs": [*vllm["extraArgs"], "--max-num-seq", "4"]}
    with pytest.raises(PulumiFailed) as caught:
        cli_next_up(stack, "real vLLM: an unknown flag in extraArgs", config)
    error = str(caught.value)
    assert "--max-num-seq" in error and "--max-num-seqs" in error, error[-3000:]
    assert complete(stack.endpoint, SERVED_NAME)[0] == 200  # nothing that serves changed


def test_a_refused_value_reaches_the_user_as_vllms_own_message(stack: Stack) -> None:
    """A flag vLLM knows with a value it refuses passes the image check; vLLM's own parser
    refuses it at start, and the readiness wait shows its message, naming the node."""
    config = real_config(stack.lab)
    vllm = config[f"{PROJECT}:vllm"]
    config[f"{PROJECT}:vllm"] = {**vllm, "extraArgs": ["--dtype", "float64"]}
    started = time.monotonic()
    with pytest.raises(PulumiFailed) as caught:
        cli_next_up(stack, "real vLLM: a refused --dtype", config)
    record_timing("real vLLM: a refused flag value, until the error", time.monotonic() - started)
    error = str(caught.value)
    assert "spark1: vllm-ready:" in error, error[-3000:]
    assert "argument --dtype: invalid choice: 'float64'" in error, error[-3000:]


SECOND = "tiny-chat-b"  # a second lab model (HF_MORE_MODELS[0]), the same real weights


def two_models(lab: Lab) -> dict[str, Any]:
    """The stack with a second real server beside the first (each on both hosts): the first
    keeps its settings (its resources keep their names); the second starts eager (no compile:
    it is the module's cheap one), with a fixed share, without the benchmark."""
    models = ((HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[0], SECOND))
    config = as_fleet(real_config(lab), *models)
    entry = config[f"{PROJECT}:models"][1]
    entry.pop("benchmark", None)
    entry.update(
        gpuMemoryUtilization=0.15,
        extraArgs=[*entry["extraArgs"], "--enforce-eager"],
    )
    return config


def test_a_clean_rerun_starts_warm_beside_a_second_real_server(stack: Stack) -> None:
    """The re-run after the refusal serves the first run's arguments again and adds a second
    real server beside it, in one `up`: torch.compile's artifacts are in each node's
    compile-cache directory (VLLM_CACHE_ROOT), so the first starts warm (cold, the first `up`,
    and warm side by side in the figures), and two real servers share both hosts (ports,
    rendezvous, memory). That adding a server leaves a serving one untouched, with no request
    failed, is the stand-in's (test_several_models.py): the same plan, in seconds of CI where
    real vLLM takes minutes."""
    cold = ready_seconds(COLD_READINESS[0])
    started = time.monotonic()
    cli_next_up(
        stack,
        "real vLLM: clean re-run (warm compile cache) and a second server",
        two_models(stack.lab),
    )
    took = time.monotonic() - started
    warm = ready_seconds(stack.outputs["readiness"])
    record_figure(
        "real vLLM: time to ready, cold vs warm compile cache (mp TP=2, two hosts)",
        f"cold {cold:.0f} s, warm {warm:.0f} s beside a second server starting (warm/cold "
        f"{warm / cold:.2f}x; the re-run's whole `up` {took:.0f} s)",
    )
    log = host_sh(stack.lab, "spark1", f"docker logs {PREFIX}-vllm 2>&1")
    assert "Directly load" in log or "loading AOT compiled" in log.lower() or warm < cold, log[
        -3000:
    ]
    client = OpenAI(base_url=stack.endpoint, api_key=API_KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list()] == [SERVED_NAME, SECOND]
    assert complete(stack.endpoint, SERVED_NAME)[0] == 200
    attacker.assert_the_openai_client_streams(stack.endpoint, API_KEY, SECOND)
    reply = client.completions.create(model=SECOND, prompt="Hello", max_tokens=8)
    assert reply.choices[0].text and reply.usage and reply.usage.completion_tokens == 8


def test_teardown_leaves_no_container(stack: Stack) -> None:
    """The destroy removes every container (the image stays on each host: keepOnDestroy). The
    real-size copy's side by side with `docker save | ssh | docker load` is the benchmark's
    (`python -m lab bench --real-image`, lab/bench.py): about five minutes of CI for a figure;
    the first `up`'s own copy is in the figures here."""
    lab = stack.lab
    assert set(stack.destroy().values()) == {"delete"}
    for host in lab.spec.host_names:
        assert host_sh(lab, host, "docker ps -aq") == "", f"{host}: containers left"
    sent, first_up = COPY["engine"]
    record_figure(
        "real-size image copy (the real vLLM image, head to one worker over the fabric)",
        f"in the first `up`, beside its other steps: {first_up:.0f} s, {sent / 1e9:.2f} GB sent "
        f"(fabric.compress auto: {COMPRESSION[0]}; side by side with docker save | load: "
        "python -m lab bench --real-image)",
    )
