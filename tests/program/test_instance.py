"""One stack instance per deployment on a host (stacks/plan/instance.py): the claims run for real
with bash, the host's Docker played by a stand-in that keeps volumes and their labels as
Docker does (a create of an existing name keeps the first one's labels)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stacks.plan import hosts
from stacks.plan.cluster import ClusterPlan
from stacks.plan.instance import (
    INSTANCE_CREATE,
    INSTANCE_ID,
    claim_volume,
    instance_token,
    release_host,
)
from stacks.plan.later import resolve
from tests.program.conftest import ConfigFactory
from tests.program.planning import plan_of
from tests.program.scripting import fake_docker_path

FIRST, SECOND = "a" * 32, "b" * 32

# `docker version`, and `docker volume inspect|create|rm` over a directory of label files.
FAKE_DOCKER = r"""#!/usr/bin/env bash
store="$FAKE_VOLUMES"
[ "$1" = version ] && exit 0
[ "$1" = volume ] || { echo "fake docker: $*" >&2; exit 2; }
shift; action=$1; shift
name="${*: -1}"
case "$action" in
  inspect)
    [ -f "$store/$name" ] || { echo "Error: no such volume: $name" >&2; exit 1; }
    if [ "$1" = --format ]; then
      label="$(sed -E 's/.*"([^"]+)".*/\1/' <<<"$2")"
      grep -m1 "^$label=" "$store/$name" | cut -d= -f2-
    fi ;;
  create)
    [ -f "$store/$name" ] && { echo "$name"; exit 0; }
    : >"$store/$name"
    while [ "$1" = --label ]; do echo "$2" >>"$store/$name"; shift 2; done
    echo "$name" ;;
  rm) rm "$store/$name" ;;
esac
"""


def test_the_token_command_prints_32_hex_digits_and_differs_each_time() -> None:
    drawn = [
        subprocess.run(["sh", "-c", INSTANCE_CREATE], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    tokens = [instance_token(done.stdout) for done in drawn]
    assert tokens[0] != tokens[1]


@pytest.mark.parametrize("printed", ["", "abc", "A" * 32, "g" * 32, "a" * 31 + " a"])
def test_a_token_that_is_not_32_hex_digits_is_refused(printed: str) -> None:
    with pytest.raises(ValueError, match="32 hex digits"):
        instance_token(printed)


@pytest.fixture
def volumes(tmp_path: Path) -> Path:
    """The Docker stand-in's volumes (a label file each)."""
    path = tmp_path / "volumes"
    path.mkdir()
    return path


def plan_in(make_config: ConfigFactory, state_dir: Path) -> ClusterPlan:
    config = make_config(hosts=2)
    config["hosts"][0]["stateDir"] = str(state_dir)
    return plan_of(config)


def claim(
    plan: ClusterPlan, token: str, volumes: Path, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """What the head's scripts step runs first: the leaf's claim and the host's."""
    claims = resolve(hosts.claim_state_leaf(plan, plan.head), {INSTANCE_ID.name: token})
    env: dict[str, Any] = {
        "PATH": fake_docker_path(tmp_path, FAKE_DOCKER),
        "FAKE_VOLUMES": str(volumes),
    }
    return subprocess.run(
        ["bash", "-c", claims], capture_output=True, text=True, timeout=30,
        env={**os.environ, **env},
    )  # fmt: skip


def test_a_second_instance_of_the_deployment_is_refused_naming_both(
    make_config: ConfigFactory, host_tmp: Path, tmp_path: Path, volumes: Path
) -> None:
    """Two stacks of one name, one SSH user: the leaf is the first's; the second is refused
    before it writes anything, with both tokens and the fix."""
    plan = plan_in(make_config, host_tmp)
    leaf = Path(plan.head.state_dir)
    assert claim(plan, FIRST, volumes, tmp_path).returncode == 0
    assert (leaf / ".spark-vllm-instance").read_text() == f"{FIRST}\n"
    assert (leaf / ".spark-vllm-owner").read_text() == "spark-vllm/test\n"
    again = claim(plan, FIRST, volumes, tmp_path)  # idempotent for its own instance
    assert again.returncode == 0, again.stderr
    refused = claim(plan, SECOND, volumes, tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"spark-vllm: spark1: scripts: {leaf} is held by another stack instance of deployment "
        f"spark-vllm/test: instance {FIRST}, this stack's is {SECOND}",
        "  likely cause: another stack named spark-vllm/test (another user's, or in another "
        "backend) deploys to this host; give this stack another name (pulumi stack rename), "
        f"or, if that stack is gone for good, remove {leaf}/.spark-vllm-instance and run again",
    ]
    assert (leaf / ".spark-vllm-instance").read_text() == f"{FIRST}\n"


def test_a_deployment_from_before_the_token_is_claimed_by_its_next_up(
    make_config: ConfigFactory, host_tmp: Path, tmp_path: Path, volumes: Path
) -> None:
    plan = plan_in(make_config, host_tmp)
    leaf = Path(plan.head.state_dir)
    leaf.mkdir(mode=0o700)
    (leaf / ".spark-vllm-owner").write_text("spark-vllm/test\n")
    (leaf / "bin").mkdir()
    done = claim(plan, FIRST, volumes, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (leaf / ".spark-vllm-instance").read_text() == f"{FIRST}\n"
    assert (volumes / claim_volume(plan)).read_text().splitlines()[:2] == [
        "spark-vllm.deployment=spark-vllm/test",
        f"spark-vllm.instance={FIRST}",
    ]


def test_another_users_instance_is_refused_by_the_hosts_docker(
    make_config: ConfigFactory, host_tmp: Path, tmp_path: Path, volumes: Path
) -> None:
    """Two SSH users keep apart leaves, but share the host's Docker (containers, chains): the
    volume claims it for the first instance, and names its leaf to the second."""
    first = plan_in(make_config, host_tmp / "alice")
    second = plan_in(make_config, host_tmp / "bob")
    assert claim(first, FIRST, volumes, tmp_path).returncode == 0
    refused = claim(second, SECOND, volumes, tmp_path)
    assert refused.returncode == 1
    said, fix = refused.stderr.splitlines()
    volume = claim_volume(first)
    assert said.startswith(
        f"spark-vllm: spark1: scripts: Docker (volume {volume}) is held by another stack "
        f"instance of deployment spark-vllm/test: instance {FIRST} ("
    )
    assert said.endswith(f":{first.head.state_dir}), this stack's is {SECOND}"), said
    assert fix.endswith(f"if that stack is gone for good, docker volume rm {volume} and run again")
    # What the second wrote is its own leaf only; the first's claim stands.
    assert f"spark-vllm.instance={FIRST}" in (volumes / volume).read_text()


def test_the_last_delete_releases_only_its_own_claim(
    make_config: ConfigFactory, host_tmp: Path, tmp_path: Path, volumes: Path
) -> None:
    plan = plan_in(make_config, host_tmp)
    assert claim(plan, FIRST, volumes, tmp_path).returncode == 0
    env = {**os.environ, "PATH": fake_docker_path(tmp_path, FAKE_DOCKER),
           "FAKE_VOLUMES": str(volumes)}  # fmt: skip
    for token, kept in ((SECOND, True), (FIRST, False)):
        release = resolve(release_host(plan), {INSTANCE_ID.name: token})
        subprocess.run(["bash", "-c", release], env=env, check=True, timeout=30)
        assert (volumes / claim_volume(plan)).exists() == kept, token
