"""What the engine's day-two rules (tests/engine/steps.py) do to this program: the next `up` on
a deployed stack, planned as the engine plans it, with what it deletes and creates in order."""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from typing import Any

import pulumi

from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import Evaluation, FakeHosts, evaluate, fake_id

DIGEST = "sha256:" + "ab" * 32


class SameImageHosts(FakeHosts):
    """Hosts where a tag and its digest name one image: pulling it by either gives the same
    image ID (Docker's ID is the image's config digest, not its name)."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        resource_id, outputs = super().new_resource(args)
        if args.typ == "docker:index/remoteImage:RemoteImage":
            repository = re.sub(r"(@sha256:[0-9a-f]+|:[^:/]*)$", "", args.inputs["name"])
            outputs["imageId"] = "sha256:" + fake_id("image", repository)
        return resource_id, outputs


class NewIdHosts(FakeHosts):
    """Hosts where each create of a Command gets a new ID, as pulumi-command makes one at
    random (pulumi-go-provider infer: the ID is a random hex string), so a replaced step's
    dependents see its new ID."""

    def __init__(self) -> None:
        super().__init__()
        self.creates = 0

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        resource_id, outputs = super().new_resource(args)
        if args.typ == "command:remote:Command":
            self.creates += 1
            resource_id = fake_id(resource_id, str(self.creates))
        return resource_id, outputs


def operations_of(run: Evaluation, name: str) -> list[str]:
    return [op for op, resource in run.operations if resource == name]


def deleted_twice(run: Evaluation) -> list[str]:
    deletes = [name for op, name in run.operations if op == "delete"]
    return sorted({name for name in deletes if deletes.count(name) > 1})


def test_pinning_the_tag_to_its_digest_recreates_what_the_image_pull_took_down(
    make_config: ConfigFactory,
) -> None:
    """With `image.keepOnDestroy: false` the pull is delete-before-replace: a new `image.ref`
    first deletes every container of the image (tests/program/test_cascade.py). The same image
    pinned by its digest keeps its ID, so the containers' inputs do not change; the engine
    creates them again anyway (step_generator.go `recreating`), where a model that diffed them
    again planned "same" and left them deleted."""
    config = make_config(hosts=2)
    config["image"] = {**config["image"], "keepOnDestroy": False}
    hosts = SameImageHosts()
    up = evaluate(config, SECRETS, mocks=hosts)
    pinned = copy.deepcopy(config)
    pinned["image"]["ref"] = f"example/vllm-gb10@{DIGEST}"
    run = evaluate(pinned, SECRETS, mocks=hosts, prior=up)
    containers = ["firewall-spark1-guard", "firewall-spark2-guard", "ray-head", "ray-spark2",
                  "vllm-container"]  # fmt: skip
    assert {name: run.steps[name] for name in containers} == dict.fromkeys(containers, "replace")
    for name in containers:
        assert operations_of(run, name) == ["delete", "create"], name
    assert run.operations.index(("delete", "ray-head")) < run.operations.index(
        ("delete", "image-pull")
    )
    assert deleted_twice(run) == []


def monitored_ray(make_config: ConfigFactory) -> dict[str, Any]:
    config = make_config(hosts=2)
    config["monitoring"] = {"enabled": True}
    return config


def test_a_new_ray_head_rewrites_rays_targets_once_after_deleting_the_old_file(
    make_config: ConfigFactory,
) -> None:
    """`ray-head` replaced (here: its state no longer matches the program's labels, as after a
    release that changes them) takes down `ray-joined` and the targets step with it. Each is
    deleted once, before the container, and created again; none is deleted after the program
    (a second delete of the targets step would remove the file its new create wrote)."""
    config = monitored_ray(make_config)
    up = evaluate(config, SECRETS)
    head = up.urn("ray-head")
    up.state[head] = replace(up.state[head], inputs={**up.state[head].inputs, "labels": []})
    run = evaluate(config, SECRETS, prior=up)
    assert operations_of(run, "monitoring-ray-targets") == ["delete", "create"]
    # A DeleteReplacement step for it too (its provider's delete runs no command: it has none).
    assert operations_of(run, "ray-joined") == ["delete", "create"]
    assert run.operations.index(("delete", "monitoring-ray-targets")) < run.operations.index(
        ("delete", "ray-head")
    )
    assert deleted_twice(run) == []
    assert run.steps["ray-joined"] == run.steps["monitoring-ray-targets"] == "replace"


def test_ray_joined_replaced_outside_a_cascade_leaves_rays_targets_written(
    make_config: ConfigFactory,
) -> None:
    """Issue 40 item 7 (the program's, fixed by making the targets step delete-before-replace):
    `ray-joined` replaced on its own (its triggers changed) replaces the targets step. Created
    first, the default, its old delete (`rm -f` of the same file) would run after the program
    and leave Prometheus no Ray targets (step_generator.go GenerateDeletes)."""
    config = monitored_ray(make_config)
    hosts = NewIdHosts()
    up = evaluate(config, SECRETS, mocks=hosts)
    joined = up.urn("ray-joined")
    old = up.state[joined]
    up.state[joined] = replace(old, inputs={**old.inputs, "triggers": ["an-older-cluster"]})
    run = evaluate(config, SECRETS, mocks=hosts, prior=up)
    assert run.steps["ray-joined"] == "replace"
    targets = operations_of(run, "monitoring-ray-targets")
    assert targets[-1] == "create", targets  # the file the new step wrote stays
