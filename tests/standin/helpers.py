"""Helpers for the vLLM stand-in tests: HF cache seeding, processes, ports, HTTP."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TINY_MODEL = "spark-vllm-lab/tiny-chat"
TINY_MAX_POSITION_EMBEDDINGS = 2048
# Only the API server's cache has this model: proves the per-rank snapshot check.
DRIVER_ONLY_MODEL = "spark-vllm-lab/driver-only"
RAY_START_TIMEOUT_S = 60


def seed_hf_model(hf_home: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """Write a model in huggingface_hub's real cache layout: blobs/, refs/main, snapshots/."""
    repo_dir = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode() + b"".join(sorted(files.values()))).hexdigest()
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        blob_name = hashlib.sha256(content).hexdigest()
        (repo_dir / "blobs" / blob_name).write_bytes(content)
        link = snapshot / name
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", "blobs", blob_name))
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


def tiny_model_files() -> dict[str, bytes]:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": TINY_MAX_POSITION_EMBEDDINGS,
        # The lab model's shape (lab/hfmodel.py): 1 KiB of KV cache a token.
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "torch_dtype": "float32",
    }
    return {
        "config.json": json.dumps(config).encode(),
        "tokenizer.json": b'{"version": "1.0"}',
        "model.safetensors": os.urandom(64 * 1024),
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def session_members(session_id: int) -> list[int]:
    """Live PIDs whose session is `session_id` (field 6 of /proc/PID/stat)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        # Zombies are dead already (only their parent's wait() removes them).
        if int(fields[3]) == session_id and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def kill_session(session_id: int, timeout_s: float = 10.0) -> None:
    """SIGKILL every process of a session this test started (by PID, nothing by name)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        members = session_members(session_id)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def http(
    method: str, url: str, body: Any = None, api_key: str | None = None, timeout: float = 30.0
) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@dataclass
class StandinProcess:
    """One `vllm serve` run of the stand-in, in its own session so teardown can kill it all."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> StandinProcess:
        self.process = subprocess.Popen(
            self.args,
            env=self.env,
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"stand-in exited {self.process.returncode}:\n{self.log}")
            try:
                if http("GET", self.base_url + "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"stand-in not ready within {timeout_s} s:\n{self.log}")

    def wait_exit(self, timeout_s: float) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"stand-in still running after {timeout_s} s:\n{self.log}"
            ) from None

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        kill_session(self.process.pid)
        self.process.wait(5)


StandinFactory = Callable[..., StandinProcess]


def clean_env(standin_bin: Path, hf_home: Path) -> dict[str, str]:
    """An environment free of the caller's Ray/HF/vLLM settings."""
    dropped = ("RAY_", "HF_", "VLLM_", "NCCL_", "GLOO_", "HUGGING", "UV_", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    # A private HOME: Ray 2.60 writes ~/.ray/auth_token when ray.init() starts a local
    # instance, and a later `ray start` then demands a token that address-connecting drivers
    # do not send. The lab's hosts each have their own /root, so this mirrors the lab.
    home = hf_home.with_name(hf_home.name + "-home")
    home.mkdir(exist_ok=True)
    env.update(
        HOME=str(home),
        PATH=f"{standin_bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        HF_HOME=str(hf_home),
        HF_HUB_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
        # Ray notices the `uv run pytest` ancestor and would re-run every worker under
        # `uv run` in the project (which has no Ray); the lab's containers have no such parent.
        RAY_ENABLE_UV_RUN_RUNTIME_ENV="0",
        # A cold compile costs little here; the compile cache's own tests set their cost.
        VLLM_STANDIN_COMPILE_SECONDS="0.2",
    )
    return env


class LocalRay:
    """`ray start --head --block` in its own session; teardown kills that session by id."""

    def __init__(self, standin_bin: Path, hf_home: Path, gloo_ifname: str) -> None:
        self.port = free_port()
        # Short path: Ray's unix socket paths must stay under 107 characters.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
        env = clean_env(standin_bin, hf_home)
        env.update(GLOO_SOCKET_IFNAME=gloo_ifname, NCCL_SOCKET_IFNAME=gloo_ifname)
        command = [
            str(standin_bin / "ray"),
            "start",
            "--head",
            "--block",
            "--num-gpus=2",
            "--num-cpus=2",
            f"--port={self.port}",
            "--disable-usage-stats",
            "--include-dashboard=false",
            "--object-store-memory=200000000",
            f"--temp-dir={self.temp_dir}",
        ]
        self.log_path = self.temp_dir / "ray-start.log"
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        """Ready when the head's raylet socket exists (a driver can then connect)."""
        deadline = time.monotonic() + RAY_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"ray start exited:\n{self.log_path.read_text()}")
            if list(self.temp_dir.glob("session_*/sockets/raylet")):
                time.sleep(1.0)  # the raylet registers with the GCS right after
                return
            time.sleep(0.3)
        raise AssertionError(f"Ray head not ready:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        kill_session(self.process.pid)
        self.process.wait(10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
