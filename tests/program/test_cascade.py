"""The engine's cascade of a delete-before-replace (tests/engine/cascade.py): first its rules on
small states, then what it takes down in this program's own graph."""

from __future__ import annotations

from typing import Any

from tests.engine.cascade import OldResource, dependents_to_replace
from tests.engine.diff import TYPE_COMMAND, TYPE_CONTAINER, TYPE_REMOTE_IMAGE
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import Evaluation, Registration, evaluate

IMAGE = OldResource("image", TYPE_REMOTE_IMAGE, {"name": "x:1"})


def container(urn: str, image_from: str = "image", **more: Any) -> OldResource:
    return OldResource(
        urn,
        TYPE_CONTAINER,
        {"image": "x:1", "name": urn},
        dependencies=(image_from,),
        property_dependencies={"image": (image_from,)},
        **more,
    )


def command(urn: str, deps: dict[str, tuple[str, ...]], after: tuple[str, ...] = ()) -> OldResource:
    inputs = {"create": "true", "triggers": ["id"]}
    every = tuple({*after, *(u for d in deps.values() for u in d)})
    return OldResource(urn, TYPE_COMMAND, inputs, dependencies=every, property_dependencies=deps)


def names(chosen: list[OldResource]) -> list[str]:
    return [r.urn for r in chosen]


def test_an_input_from_the_base_replaces_a_container_but_only_updates_a_command() -> None:
    state = [IMAGE, container("server"), command("record", {"create": ("image",)})]
    assert names(dependents_to_replace(state, "image")) == ["server"]


def test_a_depends_on_edge_alone_replaces_nothing() -> None:
    waits = command("wait", {}, after=("image",))
    assert dependents_to_replace([IMAGE, waits], "image") == []


def test_the_cascade_is_transitive_through_what_it_replaces() -> None:
    """The wait's triggers hold the server's ID: replaced with it; the probe after the wait
    only by dependsOn: kept."""
    state = [
        IMAGE,
        container("server"),
        command("wait", {"triggers": ("server",)}),
        container("sidecar", image_from="wait"),
        command("probe", {}, after=("wait",)),
    ]
    assert names(dependents_to_replace(state, "image")) == ["server", "wait", "sidecar"]


def test_a_resource_this_run_registered_already_is_not_a_dependent() -> None:
    state = [IMAGE, container("server"), container("other")]
    assert names(dependents_to_replace(state, "image", registered={"server"})) == ["other"]


def test_a_replaced_provider_replaces_its_resources() -> None:
    provider = OldResource("provider", "pulumi:providers:docker", {"host": "ssh://a"})
    state = [IMAGE, provider, OldResource("c", TYPE_CONTAINER, {}, provider_urn="provider")]
    assert names(dependents_to_replace(state, "provider")) == ["c"]


def old_state(evaluation: Evaluation) -> list[OldResource]:
    def old(r: Registration) -> OldResource:
        return OldResource(
            r.urn,
            r.typ,
            r.inputs,
            tuple(r.dependencies),
            {k: tuple(v) for k, v in r.property_dependencies.items()},
            r.provider.rsplit("::", 1)[0] if r.provider else "",
            r.custom,
            tuple(r.replace_on_changes),
        )

    return [old(r) for r in evaluation.registrations if r.typ != "pulumi:pulumi:Stack"]


def test_a_new_ref_with_keep_on_destroy_false_stops_every_container_of_the_image_first(
    make_config: ConfigFactory,
) -> None:
    """The serving image's pull is delete-before-replace when its delete removes the image:
    every container started from it goes first (and the waits whose triggers hold their IDs),
    so `docker rmi` never meets a running container (both guards run it too). The record, the
    copies and the checks only update. The front's container is not the serving image's: it
    keeps serving."""
    config = make_config(hosts=2)
    config["image"] = {**config["image"], "keepOnDestroy": False}
    up = evaluate(config, SECRETS)
    doomed = {
        urn.rsplit("::", 1)[-1]
        for urn in names(dependents_to_replace(old_state(up), up.urn("image-pull")))
    }
    assert doomed == {
        "firewall-spark1-guard",
        "firewall-spark2-guard",
        "memory-guard-spark1",
        "memory-guard-spark2",
        "memory-guard-docker-filter-spark1",
        "memory-guard-docker-filter-spark2",
        "ray-head",
        "ray-spark2",
        "ray-joined",
        "vllm-container",
        "vllm-ready",
    }
    # The model before this release took only resources whose inputs held the base's ID: the
    # containers name the image by its pinned tag, so it took none and ran `docker rmi` under
    # them.
    image_id = up.state[up.urn("image-pull")].id
    assert image_id
    old_rule = [r for r in old_state(up) if image_id and image_id in str(r.inputs)]
    assert [r for r in old_rule if r.type == TYPE_CONTAINER] == []
