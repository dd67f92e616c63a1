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
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from .helpers import (
    DRIVER_ONLY_MODEL,
    TINY_MODEL,
    LocalRay,
    StandinFactory,
    StandinProcess,
    clean_env,
    free_port,
    seed_hf_model,
    tiny_model_files,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN_PROJECT = REPO_ROOT / "lab" / "image" / "vllm_standin"
RAY_REQUIREMENT = "ray==2.60.0"
VENV_BUILD_TIMEOUT_S = 600


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"stand-in venv required under CI=true: {reason}")
    pytest.skip(reason)


def venv_key() -> str:
    digest = hashlib.sha256((STANDIN_PROJECT / "pyproject.toml").read_bytes())
    digest.update(RAY_REQUIREMENT.encode())
    # The install is editable: a venv serves the checkout it was built from, not another one.
    digest.update(str(STANDIN_PROJECT).encode())
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
