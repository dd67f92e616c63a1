"""Fixtures for evaluating the program under Pulumi's mock runtime."""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HOST_KEYS = {
    "bastion": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBastionKeyBastionKeyBastionKey00",
    **{f"spark{i}": f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAISpark{i}KeySpark{i}KeySpark{i}Key0"
       for i in range(1, 9)},
}  # fmt: skip
SECRETS = {
    "apiKey": "sk-test-api-key-0b7c1e9f3a",
    "hfToken": "hf_testtokenAbCdEf123456",
}
PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "test-private-key-material\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)


@pytest.fixture(autouse=True)
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The program writes derived files (known_hosts, control sockets) here, not in $HOME."""
    directory = tmp_path / "local"
    monkeypatch.setenv("SPARK_VLLM_LOCAL_DIR", str(directory))
    return directory


@pytest.fixture
def host_tmp() -> Iterator[Path]:
    """A temporary directory the config accepts as a parent of hosts[].stateDir and
    model.cacheDir, and the hosts' ownership check too (components/scripts/dir_safety.py):
    pytest's tmp_path is under /tmp, which every local user may write. It is made in $HOME
    (0700, this user's), and removed after the test."""
    path = Path(tempfile.mkdtemp(prefix=".spark-vllm-test-", dir=Path.home()))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text(PRIVATE_KEY)
    path.chmod(0o600)
    return path


ConfigFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def make_config(key_file: Path) -> ConfigFactory:
    """A valid config for `hosts` hosts behind a bastion (head direct, workers via the bastion).

    Its executor is `ray`, set: most graph tests read the Ray cluster's resources, and mp has
    its own (test_executor_mp.py). `executor=None` leaves the key out, for the default (mp)."""

    def build(hosts: int = 2, executor: str | None = "ray", **overrides: Any) -> dict[str, Any]:
        vllm: dict[str, Any] = {"tensorParallelSize": hosts, "maxModelLen": 32768}
        if executor is not None:
            vllm["executor"] = executor
        config: dict[str, Any] = {
            "hosts": [
                {
                    "name": f"spark{i}",
                    "address": f"10.240.1.{10 + i}",
                    "user": "aurora",
                    "fabricInterface": "enp1s0f1np1" if i % 2 else "enP2p1s0f1np1",
                    "fabricIp": f"10.241.0.{10 + i}",
                    "rdmaHcas": ["rocep1s0f1", "roceP2p1s0f1"],
                    "hostKey": HOST_KEYS[f"spark{i}"],
                    **({"via": "bastion"} if i > 1 else {}),
                }
                for i in range(1, hosts + 1)
            ],
            "bastion": {
                "address": "203.0.113.7",
                "port": 2222,
                "user": "jump",
                "hostKey": HOST_KEYS["bastion"],
            },
            "ssh": {"privateKeyPath": str(key_file)},
            "image": {"ref": "example/vllm-gb10:1.0", "platform": "linux/arm64"},
            "model": {
                "id": "Qwen/Qwen3.5-122B-A10B-FP8",
                "servedName": "qwen",
                "cacheDir": "/home/aurora/.cache/huggingface",
            },
            "vllm": vllm,
        }
        for key, value in overrides.items():
            config[key] = value
        return copy.deepcopy(config)

    return build
