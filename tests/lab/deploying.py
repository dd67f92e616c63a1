"""Deploying the real program onto a lab, and talking to what it deployed (shared by the e2e
and fault tests)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pydantic.alias_generators import to_camel

from lab import Lab
from lab import client as lab_client
from lab.stack import PROJECT, stack_config
from stacks.config import ServerSettings
from stacks.plan.cold_start import START_STAGES
from tests.cli import PulumiCli
from tests.lab.realmocks import RealMocks, StackOutputs, run_program
from tests.program.scripting import load

REPO = Path(__file__).resolve().parents[2]
API_KEY = "lab-secret-3f9a0c7e2b95d41a"
PREFIX = "spark-vllm"
# The lab stack's own directory on each host: <stateDir>/<project>.<stack>
# (stacks/plan/cluster.py state_leaf)
STATE = "/root/.spark-vllm/spark-vllm.lab"
HF_CACHE = "/root/.cache/huggingface"  # the lab stack's model.cacheDir (lab/stack.py)
IMAGE_LAYERS = load("image_layers")
# A server that exits at start, as users see it: the Docker provider's create neither waits
# nor fails (tests/lab/realmocks.py), so the readiness wait reports it, Docker restarting it.
EXITED_AT_START = "vLLM exited during start-up"
RAY_NODES = (
    "import json, ray; ray.init(logging_level='ERROR'); "
    "print(json.dumps(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])))"
)


def deploy(
    lab: Lab,
    mocks: RealMocks,
    config: dict[str, Any],
    project_dir: Path = REPO,
    stack: str = "lab",
) -> StackOutputs:
    """`pulumi up` of a stack whose file holds `config`; its apiKey and each of its `keys`' `key`
    are set with --secret (`--path 'keys[i].key'`)."""
    cli = PulumiCli(project_dir)
    plain = {key: value for key, value in config.items() if key != f"{PROJECT}:apiKey"}
    named = [dict(entry) for entry in config.get(f"{PROJECT}:keys") or []]
    values = [entry.pop("key") for entry in named]
    if named:
        plain[f"{PROJECT}:keys"] = named
    cli.stack_from(stack, plain)
    if f"{PROJECT}:apiKey" in config:
        cli.config_set(stack, "apiKey", config[f"{PROJECT}:apiKey"], secret=True)
    for index, value in enumerate(values):
        cli.config_set(stack, f"keys[{index}].key", value, secret=True, path=True)
    return run_program(cli, stack, mocks, max_parallel=8)


def copy_report(outputs: dict[str, Any], kind: str) -> dict[str, Any]:
    """A copy step's last `spark-vllm-<kind>-sent {json}` line (image-sync.sh, weights-sync.sh):
    the bytes it sent, what the worker kept, and how many workers its relay chain served."""
    prefix = f"spark-vllm-{kind}-sent "
    lines = [line for line in outputs["stdout"].splitlines() if line.startswith(prefix)]
    assert lines, outputs["stdout"]
    return dict(json.loads(lines[-1].removeprefix(prefix)))


def benchmark_figure(rows: list[dict[str, Any]]) -> str:
    """The `benchmark` output's rows as one line of the lab figures."""
    return "; ".join(
        f"{r['concurrency']} concurrent: {r['outputTokensPerSecond']:.0f} tok/s out, "
        f"median TTFT {r['medianTtftMs']:.1f} ms"
        for r in rows
    )


def cold_start_figure(cold: dict[str, Any]) -> str:
    """A server's `coldStart` (the `models` output) as one line of the lab figures, after
    checking that every stage was measured and that they happened in order."""
    start = [cold[stage] for stage in START_STAGES]
    assert all(value is not None for value in start), cold
    assert start[1:] == sorted(start[1:]), cold  # port open, /health, first token
    image = ", ".join(f"{w} {s:.1f} s" for w, s in cold["imageCopySeconds"].items())
    weights = ", ".join(f"{w} {s:.1f} s" for w, s in cold["weightsCopySeconds"].items())
    return (
        f"image copy {image or 'none'}; weights fetch {cold['weightsFetchSeconds']:.1f} s, copy "
        f"{weights or 'none'}; memory check {cold['memoryCheckSeconds']:.1f} s; from the "
        f"container's start ({cold['containerStartSeconds']:.1f} s): port open "
        f"{start[1]:.1f} s, /health {start[2]:.1f} s, first token {start[3]:.1f} s"
    )


def default_lab_config(lab: Lab) -> dict[str, Any]:
    """The lab stack as committed (Pulumi.lab.yaml), with an API key: every default, executor
    mp included."""
    return {**stack_config(lab.spec), f"{PROJECT}:apiKey": API_KEY}


def lab_config(lab: Lab) -> dict[str, Any]:
    """The lab stack with `vllm.executor: ray`: the modules built around a Ray cluster (day two,
    faults, hardware, memory, grow) test Ray's failures and repairs; test_executor_mp and the
    e2e's seeds' topology deploy the default."""
    config = default_lab_config(lab)
    config[f"{PROJECT}:vllm"] = {**config[f"{PROJECT}:vllm"], "executor": "ray"}
    # Ray's object store: a small one, the hosts share this machine's memory.
    config[f"{PROJECT}:ray"] = {"objectStoreMemoryBytes": 200_000_000}
    return config


def forward_through_bastion(lab: Lab, endpoint: str) -> tuple[subprocess.Popen[bytes], str]:
    """`ssh -L` through the bastion to the endpoint's host:port, as an operator would."""
    info = lab.info()
    assert info.bastion is not None
    target = endpoint.removeprefix("http://").split("/", 1)[0]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local_port = probe.getsockname()[1]
    argv = [
        "ssh",
        *lab_client.common_options(info),
        "-p", str(info.bastion.ssh_port),
        "-N", "-o", "ExitOnForwardFailure=yes",
        "-L", f"127.0.0.1:{local_port}:{target}",
        f"{info.bastion.user}@{info.bastion.address}",
    ]  # fmt: skip
    tunnel = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as check:
            if check.connect_ex(("127.0.0.1", local_port)) == 0:
                return tunnel, f"http://127.0.0.1:{local_port}/v1"
        time.sleep(0.2)
    tunnel.kill()
    raise AssertionError("the ssh tunnel through the bastion did not open within 15 s")


def post(base: str, path: str, body: dict[str, Any], key: str | None) -> tuple[int, dict]:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json",
                 **({"Authorization": f"Bearer {key}"} if key else {})},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {}


def complete(base: str, model: str, key: str | None = API_KEY) -> tuple[int, dict]:
    return post(base, "/completions", {"model": model, "prompt": "Hello", "max_tokens": 8}, key)


def models_listed(base: str, key: str = API_KEY) -> list[str]:
    """The served names /v1/models lists at `base` (`.../v1`)."""
    request = urllib.request.Request(base + "/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return [model["id"] for model in json.loads(response.read())["data"]]


def host_sh(lab: Lab, host: str, script: str) -> str:
    return lab.sh(host, script).stdout.strip()


def image_identity(lab: Lab, host: str, image: str) -> str:
    """`image`'s content identity on `host` (image_layers.py identity, the copy's own check):
    the same on every store for the same image, empty when the host lacks the name."""
    inspected = json.loads(host_sh(lab, host, f"docker image inspect {image} || true") or "[]")
    return "".join(IMAGE_LAYERS.identity(entry) for entry in inspected)


class EndpointPoller:
    """A client that asks the endpoint for its models every `interval` seconds while a run goes
    on, and measures how long it did not answer (bounded: it stops when the block ends)."""

    def __init__(self, base: str, *keys: str, interval: float = 0.25) -> None:
        """Up means: some key in `keys` is accepted (a key rotation changes which)."""
        self.base, self.keys, self.interval = base, keys or (API_KEY,), interval
        self.samples: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> EndpointPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _poll(self) -> None:
        while not self._stop.is_set():
            ok = any(self._answers(key) for key in self.keys)
            self.samples.append((time.monotonic(), ok))
            self._stop.wait(self.interval)

    def _answers(self, key: str) -> bool:
        request = urllib.request.Request(
            self.base + "/models", headers={"Authorization": f"Bearer {key}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def downtime(self) -> float:
        """Seconds between the first failed answer and the next good one, summed."""
        total, down_since = 0.0, None
        for at, ok in self.samples:
            if not ok and down_since is None:
                down_since = at
            elif ok and down_since is not None:
                total += at - down_since
                down_since = None
        if down_since is not None and self.samples:
            total += self.samples[-1][0] - down_since
        return total


def reachable_from_bastion(lab: Lab, address: str, port: int) -> bool:
    probe = f"timeout 3 bash -c 'exec 3<>/dev/tcp/{address}/{port}' 2>/dev/null && echo open"
    # Run in the bastion's own namespace, not over SSH: a day-two test revokes the lab's key.
    return lab.sh("bastion", probe + " || true").stdout.strip() == "open"


class RequestLoop:
    """A client that asks `model` for a completion, one request after another, while a run goes
    on, and counts the requests that failed (anything but a 200 with text)."""

    def __init__(self, base: str, model: str, key: str = API_KEY) -> None:
        self.base, self.model, self.key = base, model, key
        self.sent = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RequestLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=70)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sent += 1
            try:
                status, reply = complete(self.base, self.model, key=self.key)
                text = reply.get("choices", [{}])[0].get("text", "") if status == 200 else ""
                if not text.strip():
                    self.failures.append(f"HTTP {status}")
            except OSError as error:  # the connection refused or cut: a failed request too
                self.failures.append(type(error).__name__)
            self._stop.wait(0.05)

    def summary(self) -> str:
        return f"{len(self.failures)} of {self.sent} requests to {self.model} failed"


PER_SERVER = {to_camel(name) for name in ServerSettings.model_fields}


def as_fleet(config: dict[str, Any], *models: tuple[str, str]) -> dict[str, Any]:
    """`config` (`model` + `vllm`) serving `models` instead: (id, servedName) each, on every
    host, each with the per-server settings `vllm` held."""
    config = dict(config)
    vllm = config[f"{PROJECT}:vllm"]
    per_server = {key: value for key, value in vllm.items() if key in PER_SERVER}
    config[f"{PROJECT}:vllm"] = {k: v for k, v in vllm.items() if k not in PER_SERVER}
    config[f"{PROJECT}:model"] = {"cacheDir": config[f"{PROJECT}:model"]["cacheDir"]}
    config[f"{PROJECT}:models"] = [
        {"id": model_id, "servedName": name, **json.loads(json.dumps(per_server))}
        for model_id, name in models
    ]
    return config
