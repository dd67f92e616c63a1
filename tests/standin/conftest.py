"""Fixtures for the vLLM stand-in: a throwaway venv with Ray, seeded HF caches, a local Ray.

The project's own venv has no Ray, so the stand-in runs from a venv built once per stand-in
pyproject (cached under ~/.cache/spark-vllm). Without it the tests skip, except under CI=true.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import (
    TINY_MODEL,
    StandinFactory,
    StandinProcess,
    clean_env,
    free_port,
    kill_session,
    seed_hf_model,
    tiny_model_files,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN_PROJECT = REPO_ROOT / "lab" / "image" / "vllm_standin"
RAY_REQUIREMENT = "ray==2.60.0"
VENV_BUILD_TIMEOUT_S = 600
RAY_START_TIMEOUT_S = 60
# Only the driver has this model: proves the per-rank snapshot check (ranks use the Ray cache).
DRIVER_ONLY_MODEL = "spark-vllm-lab/driver-only"


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"stand-in venv required under CI=true: {reason}")
    pytest.skip(reason)


def venv_key() -> str:
    digest = hashlib.sha256((STANDIN_PROJECT / "pyproject.toml").read_bytes())
    digest.update(RAY_REQUIREMENT.encode())
    return digest.hexdigest()[:16]


def build_venv(venv: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        unavailable("uv is not on PATH; it is needed to build the stand-in venv")
    steps = [
        [uv, "venv", "-q", "--python", "3.11", str(venv)],
        [
            uv,
            "pip",
            "install",
            "-q",
            "--python",
            str(venv / "bin" / "python"),
            RAY_REQUIREMENT,
            "huggingface_hub",
            "-e",
            str(STANDIN_PROJECT),
        ],
    ]
    for step in steps:
        try:
            result = subprocess.run(
                step, capture_output=True, text=True, timeout=VENV_BUILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            unavailable(f"building the stand-in venv timed out: {' '.join(step)}")
        if result.returncode != 0:
            unavailable(f"building the stand-in venv failed: {' '.join(step)}\n{result.stderr}")


@pytest.fixture(scope="session")
def standin_bin() -> Path:
    """bin/ of a venv holding ray, huggingface_hub and the stand-in (editable)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "spark-vllm"
    cache.mkdir(parents=True, exist_ok=True)
    venv = cache / f"standin-venv-{venv_key()}"
    complete = venv / ".complete"
    with (cache / "standin-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test runs build it once
        if not complete.exists():
            shutil.rmtree(venv, ignore_errors=True)
            build_venv(venv)
            complete.touch()
    return venv / "bin"


@pytest.fixture(scope="session")
def ray_hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache the Ray workers see (HF_HOME of the raylet): the tiny model only."""
    home = tmp_path_factory.mktemp("hf-ray")
    seed_hf_model(home, TINY_MODEL, tiny_model_files())
    return home


@pytest.fixture(scope="session")
def driver_hf_home(tmp_path_factory: pytest.TempPathFactory, ray_hf_home: Path) -> Path:
    """The API server's cache: the same tiny model plus one the workers do not have."""
    home = tmp_path_factory.mktemp("hf-driver")
    shutil.copytree(ray_hf_home / "hub", home / "hub", symlinks=True)
    seed_hf_model(home, DRIVER_ONLY_MODEL, tiny_model_files())
    return home


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


@pytest.fixture(scope="module")
def local_ray(standin_bin: Path, ray_hf_home: Path) -> Iterator[LocalRay]:
    cluster = LocalRay(standin_bin, ray_hf_home, gloo_ifname="lo")
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def standin(standin_bin: Path, driver_hf_home: Path, tmp_path: Path) -> Iterator[StandinFactory]:
    """Start `vllm serve MODEL ARGS` (port added); every run is killed in teardown."""
    started: list[StandinProcess] = []

    def start(model: str, *args: str, env: dict[str, str] | None = None) -> StandinProcess:
        port = free_port()
        full_env = clean_env(standin_bin, driver_hf_home)
        full_env.update(env or {})
        command = [
            str(standin_bin / "vllm"),
            "serve",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ]
        run = StandinProcess(command, full_env, tmp_path / f"standin-{len(started)}.log", port)
        started.append(run.start())
        return run

    yield start
    for run in started:
        run.stop()
