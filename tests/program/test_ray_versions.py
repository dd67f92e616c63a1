"""The Ray releases the Ray executor's layout was checked with (stacks/plan/ray_versions.py)."""

from __future__ import annotations

import json

import pytest

from stacks.plan.ray_versions import NODE_LOOKUP_ERROR, ray_layout_warning, release
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import FakeHosts, evaluate


@pytest.mark.parametrize(
    ("version", "numbers"),
    [("2.60.0", (2, 60)), ("2.54.1", (2, 54)), ("3.0.0rc1", (3, 0)), ("nightly", None)],
)
def test_release_numbers(version: str, numbers: tuple[int, int] | None) -> None:
    assert release(version) == numbers


# 2.53 reads node_ip_address.json, 2.54 scans processes, 2.55-2.60 retry the scan: with the
# host's PID namespace all of them find the head's raylet.
@pytest.mark.parametrize("version", ["2.48.0", "2.53.0", "2.54.0", "2.55.1", "2.60.0"])
def test_every_checked_release_is_accepted_quietly(version: str) -> None:
    assert ray_layout_warning(version) is None


@pytest.mark.parametrize(
    ("version", "lead"),
    [
        ("2.61.0", "is newer than 2.60"),
        ("3.0.0", "is newer than 2.60"),
        ("2.61.0.dev0", "is newer than 2.60"),
        ("nightly", "is not a release number"),
    ],
)
def test_a_newer_or_unknown_ray_is_named_with_what_to_do(version: str, lead: str) -> None:
    warning = ray_layout_warning(version)
    assert warning is not None
    assert warning.startswith(f"image.ref: ray {version} {lead}; 2.60 is the newest release")
    assert NODE_LOOKUP_ERROR in warning and "use vllm.executor mp" in warning


class HostsWithRay(FakeHosts):
    """image-facts.sh answering for an image whose Ray is `ray`."""

    def __init__(self, ray: str) -> None:
        super().__init__()
        self.ray = ray

    def new_resource(self, args):  # type: ignore[no-untyped-def]
        resource_id, outputs = super().new_resource(args)
        if args.name.endswith("-facts"):
            facts = {"machine": "aarch64", "python": "3.12.3", "ray": self.ray, "vllm": "0.20.0"}
            outputs["stdout"] = "spark-vllm-image-facts " + json.dumps(facts) + "\n"
        return resource_id, outputs


@pytest.mark.parametrize(("ray", "warned"), [("2.60.0", False), ("2.61.0", True)])
def test_the_image_check_warns_about_an_unchecked_ray_with_executor_ray(
    make_config: ConfigFactory, ray: str, warned: bool
) -> None:
    ev = evaluate(make_config(hosts=2), SECRETS, mocks=HostsWithRay(ray))
    assert any(w.startswith(f"image.ref: ray {ray} is newer") for w in ev.warnings) == warned


def test_without_ray_no_ray_version_is_judged(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(hosts=2, executor=None), SECRETS, mocks=HostsWithRay("9.0.0"))
    assert not [w for w in ev.warnings if "ray 9.0.0" in w], ev.warnings
