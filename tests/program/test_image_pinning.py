"""image.ref pinned by digest, or a tag with the exact digest to pin it to (issue 24, item 3):
a tag moves under the deployment at the next `pulumi up --refresh` (stacks/plan/image.py says
why, from terraform-provider-docker's image read)."""

from __future__ import annotations

import pytest

from stacks.plan.image import ImagePull, is_pinned, unpinned_warning
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("ref", "pinned"),
    [
        ("vllm/vllm-openai:v0.11.0", False),
        ("vllm/vllm-openai", False),
        ("registry.local:5000/team/vllm:gb10", False),  # a registry's port is not a digest
        (f"vllm/vllm-openai:v0.11.0@{DIGEST}", True),
        (f"vllm/vllm-openai@{DIGEST}", True),
    ],
)
def test_a_ref_is_pinned_only_by_a_digest(ref: str, pinned: bool) -> None:
    assert is_pinned(ref) == pinned


def pull(ref: str, key: str = "image.ref") -> ImagePull:
    return ImagePull(ref, None, True, 15, key=key)


def test_a_tag_is_told_the_exact_ref_to_pin_keeping_the_tag() -> None:
    warning = unpinned_warning(pull("vllm/vllm-openai:v0.11.0"), f"vllm/vllm-openai@{DIGEST}")
    assert warning is not None
    assert f"image.ref: vllm/vllm-openai:v0.11.0@{DIGEST} (the imageDigest output)" in warning
    assert "pulumi up --refresh" in warning


def test_a_pinned_ref_is_not_warned_about_and_a_never_pulled_image_says_so() -> None:
    assert unpinned_warning(pull(f"vllm/vllm-openai:v0.11.0@{DIGEST}"), "") is None
    said = unpinned_warning(pull("spark-vllm-lab:latest"), "")
    assert said is not None and "no registry digest" in said and "@sha256" not in said


def test_the_program_warns_about_a_tag_and_publishes_the_digest(
    make_config: ConfigFactory,
) -> None:
    ev = evaluate(make_config(hosts=2), SECRETS)
    digest = ev.outputs["imageDigest"]
    assert digest.startswith("example/vllm-gb10@sha256:"), digest
    pin = [w for w in ev.warnings if w.startswith("image.ref ") and "is a tag, not pinned" in w]
    assert len(pin) == 1 and pin[0].endswith(
        f"image.ref: example/vllm-gb10:1.0@{digest.split('@')[1]} (the imageDigest output)"
    ), ev.warnings


def test_every_image_pulled_by_tag_is_warned_about_once(make_config: ConfigFactory) -> None:
    """The front's and monitoring's images move under a tag as the serving image does: each is
    named by its own setting, once (node_exporter is pulled on every node)."""
    config = make_config(hosts=2, monitoring={"enabled": True})
    ev = evaluate(config, SECRETS)
    keys = [w.split(" ", 1)[0] for w in ev.warnings if "is a tag, not pinned" in w]
    assert sorted(keys) == [
        "front.image.ref",
        "image.ref",
        "monitoring.grafana.image.ref",
        "monitoring.nodeExporter.image.ref",
        "monitoring.prometheus.image.ref",
    ], ev.warnings
    front = next(w for w in ev.warnings if w.startswith("front.image.ref haproxy:3.2 "))
    assert (
        "front.image.ref: haproxy:3.2@sha256:" in front and "(the frontImageDigest output)" in front
    )


def test_a_pinned_ref_deploys_without_the_warning(make_config: ConfigFactory) -> None:
    config = make_config(
        hosts=2, image={"ref": f"example/vllm-gb10:1.0@{DIGEST}", "platform": "linux/arm64"}
    )
    ev = evaluate(config, SECRETS)
    assert not [w for w in ev.warnings if w.startswith("image.ref") and "tag" in w], ev.warnings
