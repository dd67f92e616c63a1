"""End to end: the real `__main__.py` deploys onto simulated hosts, for real, through a bastion.

Every create the program declares is performed by RealMocks over SSH (pinned keys, the bastion as
proxy) and through each host's Docker provider settings. Only `vllm` is a stand-in; OpenSSH,
Docker, Ray, the image transfer and the weights copy are real.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab import Lab
from lab import client as lab_client
from lab.stack import PROJECT, SERVED_NAME, stack_config
from tests.lab.conftest import record_timing
from tests.lab.realmocks import (
    TYPE_CONTAINER,
    TYPE_REMOTE_IMAGE,
    JournalEntry,
    RealMocks,
    StackOutputs,
    run_program,
)

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
API_KEY = "lab-secret-3f9a"
PREFIX = "spark-vllm"
RAY_NODES = (
    "import json, ray; ray.init(logging_level='ERROR'); "
    "print(json.dumps(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])))"
)


class SecondUp(RealMocks):
    """A second `pulumi up` on an unchanged stack: containers and images whose inputs did not
    change stay as they are (Pulumi's no-op); every command runs again, proving it idempotent."""

    def __init__(self, first: RealMocks) -> None:
        super().__init__()
        self.kept_count = 0
        self._first = {(e.type, e.name): e for e in first.journal}

    def new_resource(self, args: Any) -> tuple[str | None, dict]:
        if args.typ in (TYPE_CONTAINER, TYPE_REMOTE_IMAGE):
            previous: JournalEntry | None = self._first.get((args.typ, args.name))
            if previous is not None and previous.inputs == args.inputs:
                self._record(previous)  # still part of the stack: teardown removes it
                self.kept_count += 1
                return previous.resource_id, previous.outputs
        return super().new_resource(args)


@dataclass
class Deployment:
    lab: Lab
    mocks: RealMocks
    outputs: StackOutputs


def deploy(lab: Lab, mocks: RealMocks, config: dict[str, Any]) -> StackOutputs:
    return run_program(REPO, PROJECT, "lab", config, [f"{PROJECT}:apiKey"], mocks, max_parallel=8)


def lab_config(lab: Lab) -> dict[str, Any]:
    return {**stack_config(lab.spec), f"{PROJECT}:apiKey": API_KEY}


@pytest.fixture(scope="module")
def deployed(lab_factory: Callable[..., Lab]) -> Iterator[Deployment]:
    # A lab of its own: the infra tests expect the shared lab untouched (image on the head only).
    lab = lab_factory("e2e", hosts=2, topology="bastion")
    mocks = RealMocks()
    started = time.monotonic()
    try:
        outputs = deploy(lab, mocks, lab_config(lab))
    except BaseException:
        mocks.teardown()
        raise
    record_timing("e2e first up (bastion, 2 hosts)", time.monotonic() - started)
    deployment = Deployment(lab, mocks, outputs)
    yield deployment
    deployment.mocks.teardown()  # idempotent: empty after the teardown test ran


def forward_through_bastion(lab: Lab, endpoint: str) -> tuple[subprocess.Popen[bytes], str]:
    """`ssh -L` through the bastion to the endpoint's host:port, as an operator would."""
    info = lab.info()
    assert info.bastion is not None
    target = endpoint.removeprefix("http://").split("/", 1)[0]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local_port = probe.getsockname()[1]
    argv = [
        "ssh",
        *lab_client.common_options(info),
        "-p", str(info.bastion.ssh_port),
        "-N", "-o", "ExitOnForwardFailure=yes",
        "-L", f"127.0.0.1:{local_port}:{target}",
        f"{info.bastion.user}@{info.bastion.address}",
    ]  # fmt: skip
    tunnel = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as check:
            if check.connect_ex(("127.0.0.1", local_port)) == 0:
                return tunnel, f"http://127.0.0.1:{local_port}/v1"
        time.sleep(0.2)
    tunnel.kill()
    raise AssertionError("the ssh tunnel through the bastion did not open within 15 s")


def post(base: str, path: str, body: dict[str, Any], key: str | None) -> tuple[int, dict]:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json",
                 **({"Authorization": f"Bearer {key}"} if key else {})},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {}


def complete(base: str, model: str, key: str | None = API_KEY) -> tuple[int, dict]:
    return post(base, "/completions", {"model": model, "prompt": "Hello", "max_tokens": 8}, key)


@pytest.fixture
def endpoint(deployed: Deployment) -> Iterator[str]:
    tunnel, base = forward_through_bastion(deployed.lab, deployed.outputs["endpointUrl"])
    try:
        yield base
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)


def host_sh(lab: Lab, host: str, script: str) -> str:
    return lab.sh(host, script).stdout.strip()


def test_outputs_name_the_endpoint_and_model(deployed: Deployment) -> None:
    spec = deployed.lab.spec
    outputs = deployed.outputs
    assert outputs["endpointUrl"] == f"http://{spec.host_mgmt_ip(0)}:8000/v1"
    assert outputs["modelId"] == SERVED_NAME
    assert outputs.secret_names == {"apiKey"}
    assert "ready after" in outputs["readiness"]


def test_a_completion_through_the_bastion_returns_text(deployed: Deployment, endpoint: str) -> None:
    status, reply = complete(endpoint, deployed.outputs["modelId"])
    assert status == 200
    assert reply["choices"][0]["text"].strip()
    assert reply["usage"]["completion_tokens"] >= 1


def test_the_api_key_is_enforced(deployed: Deployment, endpoint: str) -> None:
    assert complete(endpoint, deployed.outputs["modelId"], key=None)[0] == 401
    assert complete(endpoint, deployed.outputs["modelId"], key="wrong")[0] == 401


def test_ray_lists_every_node_by_its_fabric_ip(deployed: Deployment) -> None:
    lab = deployed.lab
    seen = host_sh(lab, "spark1", f'docker exec {PREFIX}-ray-head python3 -c "{RAY_NODES}"')
    fabric = sorted(lab.spec.host_fabric_ip(i) for i in range(lab.spec.hosts))
    assert json.loads(seen.splitlines()[-1]) == fabric


def test_each_worker_has_the_heads_image_and_model(deployed: Deployment) -> None:
    lab = deployed.lab
    image_id = deployed.outputs["imageId"]
    manifest = (
        "bash /root/.spark-vllm/bin/hf-manifest.sh --host {h} --cache-dir /root/.cache/huggingface"
        " --model spark-vllm-lab/tiny-chat --revision main"
    )
    head_manifest = host_sh(lab, "spark1", manifest.format(h="spark1"))
    for worker in ("spark2",):
        assert host_sh(lab, worker, "docker image inspect --format '{{.Id}}' " + image_id) == (
            image_id
        )
        assert host_sh(lab, worker, manifest.format(h=worker)) == head_manifest
        owner = host_sh(lab, worker, "stat -c %U /root/.cache/huggingface/hub")
        assert owner == "root"  # the SSH user, not a container's


def test_secrets_are_not_in_container_configuration(deployed: Deployment) -> None:
    inspect = host_sh(deployed.lab, "spark1", f"docker inspect {PREFIX}-vllm")
    assert API_KEY not in inspect
    mode = host_sh(deployed.lab, "spark1", "stat -c %a /root/.spark-vllm/api-key")
    assert mode == "600"


def test_a_second_up_is_idempotent_and_keeps_serving(deployed: Deployment, endpoint: str) -> None:
    started = time.monotonic()
    second = SecondUp(deployed.mocks)
    outputs = deploy(deployed.lab, second, lab_config(deployed.lab))
    record_timing("e2e second up (unchanged stack)", time.monotonic() - started)
    deployed.mocks = second  # the stack now is what the second run holds
    assert outputs["endpointUrl"] == deployed.outputs["endpointUrl"]
    assert second.kept_count == 4, "the image and all three containers were unchanged"
    sync = next(e for e in second.journal if e.name == "image-spark2-sync")
    assert "already has" in sync.outputs["stdout"], "the image was not copied again"
    copy = next(e for e in second.journal if e.name == "weights-spark2-copy")
    assert "already has" in copy.outputs["stdout"], "the weights were not copied again"
    assert complete(endpoint, outputs["modelId"])[0] == 200


def test_teardown_leaves_the_hosts_clean(deployed: Deployment) -> None:
    lab = deployed.lab
    deployed.mocks.teardown()
    for host in ("spark1", "spark2"):
        assert host_sh(lab, host, "docker ps -aq") == "", f"{host}: containers left"
        assert host_sh(lab, host, "pgrep -x 'raylet|gcs_server' || true") == "", host
        authorized = host_sh(lab, host, "cat /root/.ssh/authorized_keys")
        assert "spark-vllm-fabric" not in authorized, f"{host}: fabric key still authorized"
        assert host_sh(lab, host, "ls /root/.spark-vllm/bin 2>/dev/null || true") == ""
    assert host_sh(lab, "spark1", "ls /root/.spark-vllm/fabric_ed25519 2>&1 || true").endswith(
        "No such file or directory"
    )
    assert host_sh(lab, "spark1", "test -e /root/.spark-vllm/api-key && echo left || true") == ""


def test_the_seeds_topology_with_three_hosts(lab_factory: Callable[..., Lab]) -> None:
    """No bastion: this machine reaches only the head; workers only through the head. Three
    hosts with different fabric interface names, TP x PP = 3."""
    lab = lab_factory(
        "seeds3",
        hosts=3,
        topology="jump",
        fabric_ifnames=("enp1s0f1np1", "enP2p1s0f1np1", "fab0"),
    )
    mocks = RealMocks()
    started = time.monotonic()
    try:
        outputs = deploy(lab, mocks, lab_config(lab))
        record_timing("e2e up (seeds' topology, 3 hosts)", time.monotonic() - started)
        assert outputs["endpointUrl"] == f"http://{lab.spec.outside_far_ip}:8000/v1"
        status, reply = complete(outputs["endpointUrl"].removesuffix("/"), outputs["modelId"])
        assert status == 200 and reply["choices"][0]["text"].strip()
        seen = host_sh(lab, "spark1", f'docker exec {PREFIX}-ray-head python3 -c "{RAY_NODES}"')
        assert json.loads(seen.splitlines()[-1]) == sorted(
            lab.spec.host_fabric_ip(i) for i in range(3)
        )
        for index, host in enumerate(("spark2", "spark3"), start=1):
            env = host_sh(lab, host, f"docker inspect --format '{{{{json .Config.Env}}}}' "
                                     f"{PREFIX}-ray-worker")  # fmt: skip
            assert f"GLOO_SOCKET_IFNAME={lab.spec.fabric_ifname(index)}" in env
    finally:
        mocks.teardown()
    for host in ("spark1", "spark2", "spark3"):
        assert host_sh(lab, host, "docker ps -aq") == ""
