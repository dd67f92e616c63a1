"""What `pulumi preview` shows on a deployed stack when the config changes: each resource's step
(update or replace), planned the way the engine and the providers plan it (tests/engine/diff.py),
from the state the previous `up` left."""

from __future__ import annotations

from tests.program.conftest import ConfigFactory
from tests.program.previews import plan


def test_an_identical_config_changes_nothing(make_config: ConfigFactory) -> None:
    assert plan(make_config(hosts=2), make_config(hosts=2)) == {}


def test_changing_the_model_replaces_only_the_server(make_config: ConfigFactory) -> None:
    before = make_config(hosts=2)
    after = make_config(hosts=2)
    after["model"] = {**after["model"], "id": "Qwen/Qwen3-8B", "servedName": "qwen-small"}
    assert plan(before, after) == {
        "weights-fetch": "update",  # fetch runs again on the head
        "weights-spark2-copy": "update",
        "vllm-container": "replace",
        "vllm-ready": "replace",
    }


def test_changing_the_image_replaces_ray_and_the_server(make_config: ConfigFactory) -> None:
    before = make_config(hosts=2)
    after = make_config(hosts=2, image={"ref": "example/vllm-gb10:1.1", "platform": "linux/arm64"})
    assert plan(before, after) == {
        "image-pull": "replace",
        "image-head-record": "update",
        "image-spark2-sync": "update",
        "image-spark1-facts": "update",  # the new image is run once on every node
        "image-spark2-facts": "update",
        # Each node's history takes the new image in (and the previous one stays: keepPrevious).
        "image-spark1-retain": "update",
        "image-spark2-retain": "update",
        "memory-check": "update",  # what the new image's CUDA finds free
        # The compile caches stay (only the image their delete empties them with changes).
        "compile-cache-spark1": "update",
        "compile-cache-spark2": "update",
        # The guard runs from the serving image; its rules stay in the kernel meanwhile.
        "firewall-spark1-guard": "replace",
        "firewall-spark2-guard": "replace",
        # So does the memory guard: replaced, stopped for a few seconds, before the servers.
        "memory-guard-spark1": "replace",
        "memory-guard-spark2": "replace",
        # And its Docker filter, from the same image.
        "memory-guard-docker-filter-spark1": "replace",
        "memory-guard-docker-filter-spark2": "replace",
        "ray-head": "replace",
        "ray-spark2": "replace",
        "ray-joined": "replace",  # a new cluster is waited for again
        "vllm-container": "replace",
        "vllm-ready": "replace",
    }


def test_changing_a_vllm_setting_replaces_only_the_server(make_config: ConfigFactory) -> None:
    before = make_config(hosts=2)
    after = make_config(hosts=2)
    after["vllm"] = {**after["vllm"], "gpuMemoryUtilization": 0.7}
    # The preflight's memory requirement follows the utilisation on unified memory.
    assert plan(before, after) == {
        "vllm-container": "replace",
        "vllm-ready": "replace",
        "spark1-preflight": "update",
        "spark2-preflight": "update",
        "memory-check": "update",  # the new fraction checked against what each node has free
    }


def test_rotating_the_api_key_replaces_the_server_and_the_front_only(
    make_config: ConfigFactory,
) -> None:
    config = make_config(hosts=2)
    assert plan(config, config, apiKey="sk-rotated-4f1e8d2c7b9a0536") == {
        "front-api-key": "update",
        "front-container": "replace",  # it reads the key's pattern file at start
        "vllm-container": "replace",
        "vllm-ready": "replace",
    }


def test_changing_extra_args_checks_them_against_the_image_again(
    make_config: ConfigFactory,
) -> None:
    before = make_config(hosts=2)
    after = make_config(hosts=2)
    after["vllm"] = {**after["vllm"], "extraArgs": ["--max-num-seqs", "8"]}
    assert plan(before, after) == {
        "image-spark1-facts": "update",  # the head checks vllm.extraArgs against `vllm serve`
        "vllm-container": "replace",
        "vllm-ready": "replace",
    }


def test_where_the_front_listens_reloads_it_and_reruns_the_wait(make_config: ConfigFactory) -> None:
    """A new bind is a new configuration: the running front reloads it (HAProxy's master-worker
    reload keeps what it serves); the readiness wait probes the new address."""
    before = make_config(hosts=2)
    after = make_config(hosts=2)
    after["vllm"] = {**after["vllm"], "listen": "loopback"}
    assert plan(before, after) == {
        "front-config": "update",
        "front-reload": "update",
        "vllm-ready": "update",
    }
