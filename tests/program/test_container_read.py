"""pulumi-docker's read of a container and the diff after it (tests/engine/container_read.py):
what a `pulumi up --refresh` plans for a container that nobody touched."""

from __future__ import annotations

import copy
from typing import Any

from tests.engine.container_read import read_container
from tests.engine.diff import TYPE_CONTAINER, diff

PROGRAM: dict[str, Any] = {
    "name": "spark-vllm-firewall",
    "image": "spark-vllm.invalid/image:sha256-ab",
    "entrypoints": ["bash", "-c", "guard"],
    "command": ["guard", "--interval", "10"],
    "capabilities": {"adds": ["CAP_NET_ADMIN", "CAP_NET_RAW"]},
    "mounts": [{"type": "bind", "source": "/", "target": "/host", "readOnly": True}],
    "stopTimeout": 5.0,
    "ipcMode": "host",
    "user": "0:0",
    "init": True,
}

# What `docker inspect` shows for it, on an image that declares its own working directory,
# environment and health check (Docker 26, as the lab's hosts run it).
INSPECT: dict[str, Any] = {
    "Config": {
        "Cmd": ["guard", "--interval", "10"],
        "Entrypoint": ["bash", "-c", "guard"],
        "User": "0:0",
        "WorkingDir": "/vllm-workspace",
        "Hostname": "spark1",
        "Domainname": "",
        "StopTimeout": 5,
        "Env": ["PATH=/usr/bin", "HF_HOME=/root/.cache"],
        "Healthcheck": {"Test": ["CMD", "true"]},
    },
    "HostConfig": {
        "CapAdd": ["CAP_NET_ADMIN", "CAP_NET_RAW"],
        "Mounts": [{"Type": "bind", "Source": "/", "Target": "/host", "ReadOnly": True}],
        "ShmSize": 67108864,
        "IpcMode": "host",
        "Privileged": False,
        "Init": True,  # `docker run --init`: the program's `init` (refresh reads it back)
    },
}


def planned(program: dict[str, Any], inspect: dict[str, Any]) -> str:
    return diff(TYPE_CONTAINER, read_container(inspect, program), program).step


def test_a_container_nobody_touched_plans_nothing_whatever_its_image_declares() -> None:
    program = {**PROGRAM, "user": None}
    del program["user"]
    assert planned(program, INSPECT) == "same"  # the image's USER, WORKDIR, ENV, HEALTHCHECK


def test_capabilities_as_docker_stores_them_replace_one_given_without_cap() -> None:
    """Docker stores CapAdd upper-cased with a `CAP_` prefix, the read writes that back, and
    `capabilities` has no DiffSuppressFunc: a container asked for `NET_ADMIN` is replaced at
    every refresh. The program asks for `CAP_NET_ADMIN` (stacks/plan/containers.py)."""
    legacy = {**PROGRAM, "capabilities": {"adds": ["NET_ADMIN", "NET_RAW"]}}
    assert planned(legacy, INSPECT) == "replace"
    assert planned(PROGRAM, INSPECT) == "same"


def test_a_change_made_behind_the_programs_back_is_a_replacement() -> None:
    privileged = copy.deepcopy(INSPECT)
    privileged["HostConfig"]["Privileged"] = True
    assert planned(PROGRAM, privileged) == "replace"
    other_mount = copy.deepcopy(INSPECT)
    other_mount["HostConfig"]["Mounts"][0]["Source"] = "/srv"
    assert planned(PROGRAM, other_mount) == "replace"
    longer_stop = copy.deepcopy(INSPECT)
    longer_stop["Config"]["StopTimeout"] = 30
    assert planned(PROGRAM, longer_stop) == "replace"


def test_a_host_with_default_ulimits_reads_back_more_ulimits_than_the_program_gave() -> None:
    """dockerd merges daemon.json's `default-ulimits` into the container's HostConfig.Ulimits;
    the read stores them, and the next plain `up` replaces the container (ulimit: a ForceNew
    set) unless the program gives the merged set (stacks/plan/containers.with_daemon_ulimits)."""
    stack = {"name": "stack", "soft": 67108864.0, "hard": 67108864.0}
    nofile = {"name": "nofile", "soft": 65536.0, "hard": 65536.0}
    inspect = copy.deepcopy(INSPECT)
    inspect["HostConfig"]["Ulimits"] = [
        {"Name": "stack", "Soft": 67108864, "Hard": 67108864},
        {"Name": "nofile", "Soft": 65536, "Hard": 65536},
    ]
    assert planned({**PROGRAM, "ulimits": [stack]}, inspect) == "replace"
    assert planned({**PROGRAM, "ulimits": [nofile, stack]}, inspect) == "same"
    assert planned(PROGRAM, INSPECT) == "same"  # no ulimits given, none on the daemon


def test_the_hardened_docker_filter_plans_nothing_after_a_read() -> None:
    """What the memory guard's Docker filter sets (stacks/plan/containers.py
    docker_filter_container) is read back as given: no replacement at every refresh."""
    program = {
        **PROGRAM,
        "capabilities": {"drops": ["ALL"]},
        "securityOpts": ["no-new-privileges:true"],
        "readOnly": True,
        "init": False,
        "mounts": [
            {"type": "bind", "source": "/var/run/docker.sock", "target": "/var/run/docker.sock",
             "readOnly": False},
            {"type": "volume", "source": "spark-vllm-docker-filter-socket",
             "target": "/run/spark-vllm-docker", "readOnly": False},
        ],
    }  # fmt: skip
    inspect = copy.deepcopy(INSPECT)
    host = inspect["HostConfig"]
    del host["CapAdd"]
    host.update(CapDrop=["ALL"], SecurityOpt=["no-new-privileges:true"], ReadonlyRootfs=True)
    host["Init"] = False
    host["Mounts"] = [
        {"Type": "bind", "Source": "/var/run/docker.sock", "Target": "/var/run/docker.sock"},
        {"Type": "volume", "Source": "spark-vllm-docker-filter-socket",
         "Target": "/run/spark-vllm-docker"},
    ]  # fmt: skip
    assert planned(program, inspect) == "same"
    # Dropped by hand (a container recreated without them): the refresh replaces it.
    host["SecurityOpt"] = []
    assert planned(program, inspect) == "replace"


def test_containers_deployed_before_the_hardening_fields_plan_nothing() -> None:
    """An unset hardening field is no input at all: Docker's defaults read back as no diff."""
    inspect = copy.deepcopy(INSPECT)
    inspect["HostConfig"]["SecurityOpt"] = ["label=disable"]  # what an SELinux host may add
    assert planned(PROGRAM, inspect) == "same"
