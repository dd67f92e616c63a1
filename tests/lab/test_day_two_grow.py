"""Day two: a Spark added to a running deployment (2 -> 3 hosts, TP 2 -> 3), then removed
again (3 -> 2), each as the next `pulumi up` the real engine would run (tests/lab/engine.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lab import Lab
from tests.lab.day_two import Stack, deployed, next_up
from tests.lab.deploying import PREFIX, STATE, complete, host_sh, lab_config

pytestmark = pytest.mark.lab

NEW_HOST = "spark3"


def with_hosts(config: dict[str, Any], count: int) -> dict[str, Any]:
    changed = {**config}
    changed["spark-vllm:hosts"] = config["spark-vllm:hosts"][:count]
    changed["spark-vllm:vllm"] = {**config["spark-vllm:vllm"], "tensorParallelSize": count}
    return changed


@pytest.fixture(scope="module")
def two_of_three(lab_factory: Callable[..., Lab]) -> Iterator[Stack]:
    lab = lab_factory("grow3", hosts=3, topology="bastion")
    with deployed(lab, with_hosts(lab_config(lab), 2)) as stack:
        yield stack
    lab.down()  # free the machine for later modules; the factory checks for leftovers


def ray_node_count(lab: Lab) -> int:
    script = (
        "import ray; ray.init(logging_level='ERROR'); "
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    out = host_sh(lab, "spark1", f'docker exec {PREFIX}-ray-head python3 -c "{script}"')
    return int(out.splitlines()[-1])


def test_grow_adds_a_spark_without_restarting_ray(two_of_three: Stack) -> None:
    grown, lab = two_of_three, two_of_three.lab
    run = next_up(grown, "grow: a third Spark (2 -> 3 hosts)", with_hosts(lab_config(lab), 3))
    created = {name for name, op in run.changed().items() if op == "create"}
    assert {f"{NEW_HOST}-scripts", f"{NEW_HOST}-preflight", f"ray-{NEW_HOST}",
            f"image-{NEW_HOST}-sync", f"weights-{NEW_HOST}-copy",
            f"compile-cache-{NEW_HOST}"} <= created  # fmt: skip
    assert run.changed()["vllm-container"] == "replace"  # TP 2 -> 3
    assert "ray-head" not in run.changed() and "ray-spark2" not in run.changed()  # Ray stays up
    assert ray_node_count(lab) == 3
    assert complete(grown.endpoint, grown.outputs["modelId"])[0] == 200


def test_shrink_removes_the_spark_again(two_of_three: Stack) -> None:
    grown, lab = two_of_three, two_of_three.lab
    run = next_up(
        grown, "shrink: the third Spark removed (3 -> 2 hosts)", with_hosts(lab_config(lab), 2)
    )
    deleted = {name for name, op in run.changed().items() if op == "delete"}
    assert {f"{NEW_HOST}-scripts", f"ray-{NEW_HOST}", f"fabric-{NEW_HOST}-authorize",
            f"compile-cache-{NEW_HOST}"} <= deleted  # fmt: skip
    assert not [name for name, op in run.changed().items() if op == "create"]
    assert complete(grown.endpoint, grown.outputs["modelId"])[0] == 200
    assert ray_node_count(lab) == 2
    # The removed host keeps nothing of the deployment.
    assert host_sh(lab, NEW_HOST, "docker ps -aq") == ""
    assert host_sh(lab, NEW_HOST, f"ls -A {STATE}/bin 2>/dev/null || true") == ""
    assert "spark-vllm-fabric" not in host_sh(lab, NEW_HOST, "cat /root/.ssh/authorized_keys")
    pins = host_sh(lab, "spark1", f"cat {STATE}/fabric_known_hosts")
    assert lab.spec.host_fabric_ip(2) not in pins
