"""What `pulumi preview` would show: which resources' inputs change between two configs.

Pulumi diffs a resource by its inputs, so comparing the inputs the program declares for two
configs predicts the preview: a changed input is an update or a replacement, an equal one no-op.
"""

from __future__ import annotations

import json
from typing import Any

from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import Evaluation, evaluate


def inputs_by_name(ev: Evaluation) -> dict[str, str]:
    return {
        r.name: json.dumps(r.inputs, sort_keys=True)
        for r in ev.registrations
        if r.custom and r.typ != "pulumi:pulumi:Stack"
    }


def changed(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    old, new = inputs_by_name(evaluate(before, SECRETS)), inputs_by_name(evaluate(after, SECRETS))
    assert old.keys() == new.keys(), "the same resources exist in both"
    return {name for name in old if old[name] != new[name]}


def test_an_identical_config_changes_nothing(make_config: ConfigFactory) -> None:
    assert changed(make_config(hosts=2), make_config(hosts=2)) == set()


def test_changing_the_model_touches_only_weights_and_server(make_config: ConfigFactory) -> None:
    before = make_config(hosts=2)
    after = make_config(hosts=2)
    after["model"] = {**after["model"], "id": "Qwen/Qwen3-8B", "servedName": "qwen-small"}
    assert changed(before, after) == {
        "weights-fetch",
        "weights-spark2-copy",
        "vllm-container",
        "vllm-ready",
    }


def test_changing_the_image_touches_distribution_ray_and_server(
    make_config: ConfigFactory,
) -> None:
    before = make_config(hosts=2)
    after = make_config(hosts=2, image={"ref": "example/vllm-gb10:1.1", "platform": "linux/arm64"})
    assert changed(before, after) == {
        "image-pull",
        "image-head-record",
        "image-spark2-sync",
        "ray-head",
        "ray-spark2",
        "ray-joined",
        "vllm-container",
        "vllm-ready",  # a new container is waited for again
    }


def test_changing_a_vllm_setting_restarts_only_the_server(make_config: ConfigFactory) -> None:
    before = make_config(hosts=2)
    after = make_config(hosts=2)
    after["vllm"] = {**after["vllm"], "gpuMemoryUtilization": 0.7}
    # The preflight's memory requirement follows the utilisation on unified memory.
    assert changed(before, after) == {
        "vllm-container",
        "vllm-ready",
        "spark1-preflight",
        "spark2-preflight",
    }


def test_rotating_the_api_key_restarts_the_server_only(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    before = inputs_by_name(evaluate(config, SECRETS))
    after = inputs_by_name(evaluate(config, {**SECRETS, "apiKey": "sk-rotated"}))
    assert {n for n in before if before[n] != after[n]} == {
        "vllm-api-key",
        "vllm-container",
        "vllm-ready",
    }
