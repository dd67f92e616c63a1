"""`pulumi preview` as the engine runs it: the program runs with `preview=True`, every output of a
resource not yet created (or being replaced) is unknown, and `apply` callbacks on unknowns do not
run. The program must declare the same graph as an `up`, without errors, and show what depends
on creates as unknown, never as a crash or a placeholder."""

from __future__ import annotations

from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import Evaluation, evaluate

# Outputs that exist only once the image is pulled and the server answered.
CREATED_OUTPUTS = {
    "instance",  # drawn by the first up's local Command
    "fabricLinks",
    "memory",
    "endpointUrl",
    "readiness",
    "models",  # with what the readiness wait measured
    "imageId",
    "imageDigest",
    "images",
    "frontImageDigest",
    "vllmVersion",
    "rayVersion",
    "nccl",
    "fabricTransport",
}


def graph(ev: Evaluation) -> set[tuple[str, str, str, str]]:
    return {(r.urn, r.typ, r.parent, r.provider.split("::")[0]) for r in ev.registrations}


def test_a_new_stack_previews_the_whole_graph(make_config: ConfigFactory) -> None:
    config = make_config(hosts=3)
    preview = evaluate(config, SECRETS, preview=True)
    up = evaluate(config, SECRETS)
    assert graph(preview) == graph(up)
    assert set(preview.steps.values()) == {"create"}
    assert preview.unknown_outputs == CREATED_OUTPUTS
    known = set(up.outputs) - CREATED_OUTPUTS
    assert {name: preview.outputs[name] for name in known} == {n: up.outputs[n] for n in known}


def test_commands_that_wait_for_unknown_values_show_as_unknown(make_config: ConfigFactory) -> None:
    """A create line built from the image ID (unknown until pulled) is not a placeholder."""
    preview = evaluate(make_config(hosts=2), SECRETS, preview=True)
    sync = preview.named("image-spark2-sync").inputs
    assert sync["create"] == "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the SDK's unknown


def test_an_unchanged_deployed_stack_previews_no_change(make_config: ConfigFactory) -> None:
    up = evaluate(make_config(hosts=2), SECRETS)
    preview = evaluate(make_config(hosts=2), SECRETS, preview=True, prior=up)
    assert set(preview.steps.values()) == {"same"}
    assert preview.unknown_outputs == set()
    assert preview.outputs == up.outputs


def test_a_changed_deployed_stack_keeps_its_graph(make_config: ConfigFactory) -> None:
    up = evaluate(make_config(hosts=2), SECRETS)
    after = make_config(hosts=2, image={"ref": "example/vllm-gb10:2.0", "platform": "linux/arm64"})
    preview = evaluate(after, SECRETS, preview=True, prior=up)
    assert graph(preview) == graph(up)
    # The links were checked already, the front's image is the same, the instance keeps its
    # token; the memory is measured again with the new image.
    assert preview.unknown_outputs == CREATED_OUTPUTS - {
        "fabricLinks",
        "frontImageDigest",
        "instance",
    }
    assert preview.outputs["instance"] == up.outputs["instance"]
    assert preview.outputs["modelId"] == up.outputs["modelId"]
