"""The resource graph the program declares for 1, 2 and 4 hosts."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest

from stacks.plan.container_paths import CONTAINER_COMPILE_CACHE, CONTAINER_HF_HOME
from stacks.plan.server import parse_readiness
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import Evaluation, evaluate, unwrap

COMPONENTS = {
    "spark-vllm:index:Host",
    "spark-vllm:index:StackInstance",
    "spark-vllm:index:FabricTrust",
    "spark-vllm:index:ImageDistribution",
    "spark-vllm:index:ModelWeights",
    "spark-vllm:index:ServerMemory",
    "spark-vllm:index:RayCluster",
    "spark-vllm:index:VllmServer",
    "spark-vllm:index:Firewall",
    "spark-vllm:index:MemoryGuard",
    "spark-vllm:index:Front",
    "spark-vllm:index:CompileCache",
}


def envs_of(ev: Evaluation, name: str) -> dict[str, str]:
    return dict(e.split("=", 1) for e in ev.named(name).inputs["envs"])


@pytest.fixture(params=[1, 2, 4], ids=lambda n: f"{n}-hosts")
def evaluation(request: pytest.FixtureRequest, make_config: ConfigFactory) -> Evaluation:
    return evaluate(make_config(hosts=request.param), SECRETS)


def host_count(ev: Evaluation) -> int:
    return len(ev.by_type("spark-vllm:index:Host"))


def test_every_concept_is_a_component_of_the_stack(evaluation: Evaluation) -> None:
    stack = evaluation.by_type("pulumi:pulumi:Stack")[0]
    components = [r for r in evaluation.registrations if r.typ.startswith("spark-vllm:index:")]
    assert {r.typ for r in components} == COMPONENTS
    assert all(r.parent == stack.urn for r in components)
    # Every custom resource belongs to a component: nothing floats at the top level.
    component_urns = {r.urn for r in components}
    for resource in evaluation.registrations:
        if resource.custom and resource.typ != "pulumi:pulumi:Stack":
            assert resource.parent in component_urns, resource.name


def test_children_are_named_after_their_component(evaluation: Evaluation) -> None:
    by_urn = {r.urn: r for r in evaluation.registrations}
    for resource in evaluation.registrations:
        parent = by_urn.get(resource.parent)
        if parent is not None and parent.typ.startswith("spark-vllm:index:"):
            assert resource.name.startswith(f"{parent.name}-") or resource.name == parent.name


def test_steps_run_in_dependency_order(evaluation: Evaluation) -> None:
    ev = evaluation
    n = host_count(ev)
    workers = [f"spark{i}" for i in range(2, n + 1)]
    assert ev.depends_on("spark1-preflight", "spark1-scripts")
    assert ev.depends_on("image-pull", "spark1-preflight")
    assert ev.depends_on("weights-fetch", "image-head-record")
    assert ev.depends_on("ray-head", "image-head-record")
    assert ev.depends_on("ray-joined", "ray-head")
    assert ev.depends_on("vllm-container", "ray-joined")
    assert ev.depends_on("vllm-container", "weights-fetch")
    assert ev.depends_on("vllm-ready", "vllm-container")
    for worker in workers:
        assert ev.depends_on(f"image-{worker}-sync", f"{worker}-preflight")
        assert ev.depends_on(f"image-{worker}-sync", f"fabric-{worker}-pin")
        assert ev.depends_on(f"weights-{worker}-copy", f"fabric-{worker}-pin")
        assert ev.depends_on(f"weights-{worker}-copy", f"image-{worker}-sync")
        assert ev.depends_on(f"ray-{worker}", f"image-{worker}-sync")
        assert ev.depends_on(f"ray-{worker}", "ray-head")
        assert ev.depends_on("ray-joined", f"ray-{worker}")
        assert ev.depends_on("vllm-container", f"weights-{worker}-copy")
    # Nothing waits on the server before it is ready (no cycle back into the hosts).
    assert not ev.depends_on("spark1-preflight", "vllm-container")


def test_one_image_transfer_and_one_weights_copy_per_worker(evaluation: Evaluation) -> None:
    ev = evaluation
    n = host_count(ev)
    syncs = [r.name for r in ev.by_type("command:remote:Command") if r.name.endswith("-sync")]
    copies = [r.name for r in ev.by_type("command:remote:Command") if r.name.endswith("-copy")]
    assert len(syncs) == len(copies) == n - 1
    pulls = {r.name: r.inputs["name"] for r in ev.by_type("docker:index/remoteImage:RemoteImage")}
    # Pulled on the head only: the serving image, and the front's.
    assert pulls == {"image-pull": "example/vllm-gb10:1.0", "front-pull": "haproxy:3.2"}
    # Ray per node, vLLM, the front, and the firewall guard, memory guard and its Docker filter
    # per node.
    assert len(ev.by_type("docker:index/container:Container")) == 4 * n + 2


def test_connections_use_the_bastion_for_via_hosts_only(evaluation: Evaluation) -> None:
    ev = evaluation
    for i in range(1, host_count(ev) + 1):
        connection = unwrap(ev.named(f"spark{i}-preflight").inputs["connection"])
        assert connection["host"] == f"10.240.1.{10 + i}"
        assert connection["hostKey"].startswith("ssh-ed25519 ")
        assert connection["dialErrorLimit"] == 4 and connection["perDialTimeout"] == 15
        if i == 1:
            assert "proxy" not in connection
        else:
            assert connection["proxy"]["host"] == "203.0.113.7"
            assert connection["proxy"]["port"] == 2222
            assert connection["proxy"]["user"] == "jump"
            assert connection["proxy"]["hostKey"].startswith("ssh-ed25519 ")


def test_docker_providers_reach_each_host_over_pinned_ssh(evaluation: Evaluation) -> None:
    ev = evaluation
    for i in range(1, host_count(ev) + 1):
        provider = ev.named(f"spark{i}-docker").inputs
        assert provider["host"] == f"ssh://aurora@10.240.1.{10 + i}:22"
        opts = json.loads(provider["sshOpts"])
        joined = " ".join(opts)
        for required in ("BatchMode=yes", "StrictHostKeyChecking=yes", "ControlMaster=auto",
                         "ControlPersist=60", "IdentitiesOnly=yes"):  # fmt: skip
            assert required in joined
        proxies = [o for o in opts if o.startswith("ProxyCommand=")]
        if i == 1:
            assert proxies == []
        else:
            assert len(proxies) == 1
            assert "-W %h:%p jump@203.0.113.7" in proxies[0]
            assert "-p 2222" in proxies[0]
            assert "StrictHostKeyChecking=yes" in proxies[0]
    # Containers and images are created through their host's provider, never the default one.
    for resource in ev.by_type("docker:index/container:Container"):
        assert "-docker::" in resource.provider


RESTART = {"ray-head": "on-failure", "ray-worker": "on-failure", "vllm": "unless-stopped"}
SERVICES = ("ray-head", "ray-worker", "vllm")


def ungated(entrypoints: list[str]) -> list[str]:
    """A container's own entrypoint, after the firewall gate (`bash -c <gate> firewall-gate
    <marker> <digest> <fresh> <wait> -- ...`) that the default firewall puts before it."""
    assert entrypoints[:2] == ["bash", "-c"] and entrypoints[3] == "firewall-gate", entrypoints
    return entrypoints[entrypoints.index("--") + 1 :]


def role_of(inputs: dict[str, Any]) -> str:
    return str(next(lb["value"] for lb in inputs["labels"] if lb["label"] == "spark-vllm.role"))


def test_containers_have_the_field_proven_settings(evaluation: Evaluation) -> None:
    services = [
        resource
        for resource in evaluation.by_type("docker:index/container:Container")
        if role_of(resource.inputs) in SERVICES
    ]
    assert services
    for resource in services:
        inputs = resource.inputs
        assert resource.delete_before_replace, "fixed names: the old container must go first"
        assert {"label": "spark-vllm.deployment", "value": "spark-vllm/dev"} in inputs["labels"]
        assert inputs["init"] is True
        assert "maxRetryCount" not in inputs, "Docker counts retries per container lifetime"
        role = next(lb["value"] for lb in inputs["labels"] if lb["label"] == "spark-vllm.role")
        assert inputs["restart"] == RESTART[role]
        on_head = role in ("ray-head", "vllm")
        # The head's Ray and server share the host's PID namespace (never a container's).
        assert inputs["networkMode"] == "host"
        assert inputs.get("pidMode") == ("host" if on_head else None)
        assert inputs["ipcMode"] == "host"
        assert inputs["gpus"] == "all"
        assert {"name": "memlock", "soft": -1, "hard": -1} in inputs["ulimits"]
        targets = {m["target"]: m for m in inputs["mounts"]}
        assert targets["/root/.cache/huggingface"]["source"] == "/home/aurora/.cache/huggingface"
        assert targets["/tmp/ray"]["source"] == "/home/aurora/.spark-vllm/spark-vllm.dev/ray"
        # The image by its pinned name, made from the head's ID (never a tag that can move):
        # an ID does not resolve on a worker with the containerd image store.
        assert re.fullmatch(r"spark-vllm\.invalid/image:sha256-[0-9a-f]{64}", inputs["image"])


def test_ray_containers_run_ray_bound_to_the_fabric(evaluation: Evaluation) -> None:
    ev = evaluation
    head = ev.named("ray-head").inputs
    # Under the Ray watch (ray.watchNodes, on by default; tests/program/test_ray_watch.py).
    assert ungated(head["entrypoints"])[:2] == ["python3", "/spark-vllm/bin/ray_watch.py"]
    assert ungated(head["entrypoints"])[-2:] == ["--", "ray"]
    assert head["command"][:2] == ["start", "--head"]
    assert "--block" in head["command"] and "--include-dashboard=false" in head["command"]
    assert "--node-ip-address=10.241.0.11" in head["command"]
    for i in range(2, host_count(ev) + 1):
        worker = ev.named(f"ray-spark{i}").inputs
        assert "--address=10.241.0.11:6379" in worker["command"]
        assert f"--node-ip-address=10.241.0.{10 + i}" in worker["command"]
        assert "--num-gpus=1" in worker["command"]


def test_each_node_gets_its_own_fabric_settings(evaluation: Evaluation) -> None:
    ev = evaluation
    for i in range(1, host_count(ev) + 1):
        env = envs_of(ev, "ray-head" if i == 1 else f"ray-spark{i}")
        interface = "enp1s0f1np1" if i % 2 else "enP2p1s0f1np1"
        assert env["VLLM_HOST_IP"] == f"10.241.0.{10 + i}" and "RAY_NODE_IP_ADDRESS" not in env
        for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                    "UCX_NET_DEVICES"):  # fmt: skip
            assert env[key] == interface, key
        assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        assert env["RAY_ADDRESS"] == "10.241.0.11:6379"
        assert env["HF_HUB_OFFLINE"] == "1"
        assert "VLLM_API_KEY" not in env and "HF_TOKEN" not in env
    assert envs_of(ev, "vllm-container") == envs_of(ev, "ray-head"), (
        "vLLM shares the head's node settings"
    )


def test_vllm_serves_the_configured_model_through_ray(evaluation: Evaluation) -> None:
    ev = evaluation
    n = host_count(ev)
    server = ev.named("vllm-container").inputs
    entrypoint = ungated(server["entrypoints"])
    assert entrypoint[:2] == ["bash", "-c"]
    assert "exec vllm serve" in entrypoint[2]
    split = server["command"].index("--")
    launcher_flags, command = server["command"][:split], server["command"][split + 1 :]
    ips = ",".join(f"10.241.0.{10 + i}" for i in range(1, n + 1))
    assert launcher_flags == ["--executor", "ray", "--expect-ips", ips, "--gpus", str(n),
                              "--wait-seconds", "300", "--scripts", "/spark-vllm/bin",
                              "--compile-cache", "/spark-vllm/cache",
                              "--execute-seconds-cold", "1800", "--execute-seconds-warm", "600",
                              "--key-file", "/run/spark-vllm/api-key",
                              "--health-url", "http://127.0.0.1:8001/health"]  # fmt: skip
    assert command[0] == "Qwen/Qwen3.5-122B-A10B-FP8"
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["--served-model-name"] == "qwen"
    assert flags["--tensor-parallel-size"] == str(n)
    assert flags["--distributed-executor-backend"] == "ray"
    assert flags["--max-model-len"] == "32768"
    assert "--api-key" not in command
    mounts = {m["target"]: m for m in server["mounts"]}
    key_dir = mounts["/run/spark-vllm"]
    assert key_dir["readOnly"] is True
    assert key_dir["source"] == "/home/aurora/.spark-vllm/spark-vllm.dev/secrets"


def test_waits_are_bounded(evaluation: Evaluation) -> None:
    ev = evaluation
    for resource in ev.by_type("command:remote:Command"):
        if resource.name.endswith(("-joined", "-ready", "-sync", "-copy", "-fetch", "-preflight")):
            assert resource.custom_timeouts["create"], resource.name
    assert "--timeout-seconds 300" in ev.named("ray-joined").inputs["create"]
    assert "--timeout-seconds 1800" in ev.named("vllm-ready").inputs["create"]


def test_outputs_publish_the_endpoint_and_model(evaluation: Evaluation) -> None:
    outputs = evaluation.outputs
    assert outputs["endpointUrl"] == "http://10.240.1.11:8000/v1"
    assert outputs["modelId"] == "qwen"
    assert outputs["head"] == {"name": "spark1", "address": "10.240.1.11"}
    assert [n["fabricIp"] for n in outputs["nodes"]] == [
        f"10.241.0.{10 + i}" for i in range(1, host_count(evaluation) + 1)
    ]
    assert outputs["imageId"].startswith("sha256:")


def test_a_single_host_needs_no_fabric_trust(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(hosts=1), SECRETS)
    assert not [r for r in ev.registrations if r.name.startswith("fabric-")]


def test_existing_trust_skips_key_management(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(hosts=2, fabric={"trust": "existing"}), SECRETS)
    # Only the link check: no key, no authorization, no pin.
    assert [r.name for r in ev.registrations if r.name.startswith("fabric-")] == [
        "fabric-spark2-link"
    ]
    assert "--fabric-key" not in ev.named("fabric-spark2-link").inputs["create"]
    assert "--fabric-key" not in ev.named("image-spark2-sync").inputs["create"]


def test_managed_trust_pins_the_worker_key_from_config(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(hosts=2), SECRETS)
    pin = ev.named("fabric-spark2-pin").inputs["create"]
    assert "--address 10.241.0.12" in pin
    assert "AAAAC3NzaC1lZDI1NTE5AAAAISpark2Key" in pin
    assert (
        "--fabric-key /home/aurora/.spark-vllm/spark-vllm.dev/fabric_ed25519"
        in (ev.named("image-spark2-sync").inputs["create"])
    )


def test_worker_through_another_host_uses_it_as_the_proxy(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    del config["bastion"]
    config["hosts"][1]["via"] = "spark1"
    ev = evaluate(config, SECRETS)
    proxy = unwrap(ev.named("spark2-preflight").inputs["connection"])["proxy"]
    assert proxy["host"] == "10.240.1.11" and proxy["user"] == "aurora"


def test_the_dev_stack_evaluates(key_file, tmp_path) -> None:
    from tests.program.harness import load_stack_config

    config = load_stack_config("dev")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(
        "10.1.230.180 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDevSpark1Key\n"
        "192.168.200.13 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDevSpark2Key\n"
    )
    config["ssh"] = {**config["ssh"], "privateKeyPath": str(key_file),
                     "knownHostsFile": str(known_hosts)}  # fmt: skip
    ev = evaluate(config, SECRETS)
    assert ev.outputs["endpointUrl"] == "http://10.1.230.180:8000/v1"
    assert ev.outputs["modelId"] == "qwen3.5-122b"
    proxy = unwrap(ev.named("spark2-preflight").inputs["connection"])["proxy"]
    assert proxy["host"] == "10.1.230.180"
    assert proxy["hostKey"] == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDevSpark1Key"
    # All keys pinned: the warnings are the images' tags (the serving image's, the front's),
    # each with the digest to pin it to, and the model's branch with the commit to pin it to.
    pins = (f"image.ref {config['image']['ref']} is a tag, not pinned",
            "front.image.ref haproxy:3.2 is a tag, not pinned")  # fmt: skip
    tags = [w for w in ev.warnings if "is a branch or tag" not in w]
    assert sorted(w.split(": a `docker pull`")[0] for w in tags) == sorted(pins), ev.warnings
    branches = [w for w in ev.warnings if "is a branch or tag" in w]
    assert len(branches) == 1 and branches[0].startswith("model.revision main of "), branches


def test_the_lab_stack_evaluates(key_file, tmp_path) -> None:
    from tests.program.harness import load_stack_config

    config = load_stack_config("lab")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(
        "10.240.0.2 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILabBastion\n"
        "10.240.1.11 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILabSpark1\n"
        "10.240.1.12 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILabSpark2\n"
    )
    config["ssh"] = {"privateKeyPath": str(key_file), "knownHostsFile": str(known_hosts)}
    ev = evaluate(config, {"apiKey": "lab-secret-0123456789abcdef"}, stack="lab")
    assert ev.outputs["endpointUrl"] == "http://10.240.1.11:8000/v1"
    assert ev.outputs["modelId"] == "tiny-chat"
    # The lab stack leaves vllm.executor to its default: vLLM's own multi-node mode, no Ray.
    assert ev.outputs["executor"] == "mp"
    assert not {r.name for r in ev.registrations if r.name.startswith("ray")}
    assert "gpus" not in ev.named("vllm-container").inputs
    assert "--headless" in ev.named("vllm-spark2").inputs["command"]
    pins = (" is a tag", "is a branch or tag")  # the image's tag, the model's branch
    assert [w for w in ev.warnings if not any(pin in w for pin in pins)] == []


def test_ray_ports_are_fixed_and_checked_by_preflight(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(hosts=2), SECRETS)
    head = ev.named("ray-head").inputs["command"]
    for flag in ("--node-manager-port=6380", "--min-worker-port=10002",
                 "--max-worker-port=10999"):  # fmt: skip
        assert flag in head
    assert (
        "--ports 8000,8404,8001,6379,10001,6380,6381"
        in ev.named("spark1-preflight").inputs["create"]
    )
    assert "--ports 6380,6381,6382" in ev.named("spark2-preflight").inputs["create"]


def test_only_the_memory_guards_hardened_filter_holds_dockers_socket(
    make_config: ConfigFactory,
) -> None:
    """Issue 50: the guard ran the serving image's python3 as root beside the raw socket, which
    root in the head's server and Ray containers (the host's PID namespace, executor ray) could
    reach through /proc/<pid>/root. Now only the filter holds it, in its own PID namespace."""
    ev = evaluate(make_config(hosts=2, executor="ray"), SECRETS)
    containers = {r.name: r.inputs for r in ev.by_type("docker:index/container:Container")}
    raw = "/var/run/docker.sock"
    holders = {n for n, i in containers.items() if any(m["source"] == raw for m in i["mounts"])}
    assert holders == {"memory-guard-docker-filter-spark1", "memory-guard-docker-filter-spark2"}
    assert {n for n, i in containers.items() if i.get("pidMode") == "host"} == {
        "ray-head",
        "vllm-container",
    }  # the precondition of the threat: these two see every process of the host
    for host in ("spark1", "spark2"):
        filtering = containers[f"memory-guard-docker-filter-{host}"]
        guard = containers[f"memory-guard-{host}"]
        for inputs in (filtering, guard):
            assert "pidMode" not in inputs and "ipcMode" not in inputs
            assert inputs["networkMode"] == "none"
            assert inputs["capabilities"] == {"drops": ["ALL"]}
            assert inputs["securityOpts"] == ["no-new-privileges:true"]
            assert inputs["readOnly"] is True
            assert inputs["user"] == "0:0" and inputs["memory"] == 64
            assert inputs["restart"] == "always"
        assert filtering["init"] is False  # its only process, non-dumpable
        assert filtering["entrypoints"][:4] == ["python3", "-I", "-S", "-c"]
        socket_volume = {"type": "volume", "source": "spark-vllm-docker-filter-socket",
                         "target": "/run/spark-vllm-docker"}  # fmt: skip
        assert filtering["mounts"] == [
            {"type": "bind", "source": raw, "target": raw, "readOnly": False},
            {**socket_volume, "readOnly": False},
        ]
        assert guard["mounts"] == [{**socket_volume, "readOnly": True}]
        words = guard["command"]
        assert words[words.index("--docker-socket") + 1] == "/run/spark-vllm-docker/docker.sock"
        words = filtering["command"]
        assert words[words.index("--node") + 1] == host
        assert words[words.index("--listen") + 1] == "/run/spark-vllm-docker/docker.sock"
        # The guard waits for its socket's filter.
        assert ev.depends_on(f"memory-guard-{host}", f"memory-guard-docker-filter-{host}")


def test_the_default_firewall_guards_every_cluster_port_before_anything_listens(
    make_config: ConfigFactory,
) -> None:
    ev = evaluate(make_config(hosts=2), SECRETS)
    for host, interface, containers in (("spark1", "enp1s0f1np1", ("ray-head", "vllm-container")),
                                        ("spark2", "enP2p1s0f1np1", ("ray-spark2",))):  # fmt: skip
        guard = ev.named(f"firewall-{host}-guard").inputs
        assert guard["restart"] == "always" and guard["networkMode"] == "host"
        assert guard["capabilities"] == {"adds": ["CAP_NET_ADMIN", "CAP_NET_RAW"]}
        mounts = {m["target"]: m for m in guard["mounts"]}
        assert mounts["/host"] == {"type": "bind", "source": "/", "target": "/host",
                                   "readOnly": True}  # fmt: skip
        words = guard["command"]
        assert words[words.index("--fabric-interface") + 1] == interface
        ports = words[words.index("--tcp-ports") + 1].split(",")
        assert "10002:10999" in ports and "29502:29533" in ports  # Ray's workers, vLLM's own
        assert ("6379" in ports) == (host == "spark1")
        step = ev.named(f"firewall-{host}").inputs
        assert "firewall-step.sh wait" in step["create"]
        assert "firewall-step.sh remove" in step["delete"]
        assert ev.depends_on(f"firewall-{host}", f"firewall-{host}-guard")
        for container in containers:
            assert ev.depends_on(container, f"firewall-{host}")
            assert ungated(ev.named(container).inputs["entrypoints"])  # behind the gate
    # Turned off: no guard, no gate, and a loud warning.
    off = evaluate(make_config(hosts=2, fabric={"firewall": False}), SECRETS)
    assert not [r for r in off.registrations if r.name.startswith("firewall-")]
    assert off.named("ray-head").inputs["entrypoints"][0] == "python3"
    assert any("fabric.firewall is false" in w for w in off.warnings), off.warnings


def test_every_step_that_leaves_something_behind_has_a_delete(
    make_config: ConfigFactory,
) -> None:
    kept = evaluate(make_config(hosts=2), SECRETS)
    assert "delete" not in kept.named("image-spark2-sync").inputs, "images are kept by default"
    ev = evaluate(
        make_config(hosts=2, image={"ref": "example/vllm-gb10:1.0", "keepOnDestroy": False}),
        SECRETS,
    )
    delete = ev.named("image-spark2-sync").inputs["delete"]
    assert delete.endswith("--remove yes --owner spark-vllm/dev")
    assert ev.named("image-pull").inputs["keepLocally"] is False
    for name in ("spark1-scripts", "image-head-record", "fabric-head-key",
                 "fabric-spark2-authorize", "fabric-spark2-pin", "front-api-key",
                 "front-config", "firewall-spark1", "firewall-spark2"):  # fmt: skip
        assert ev.named(name).inputs["delete"], name


def test_every_remote_step_has_a_deadline(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(hosts=2, fabric={"firewall": True}), SECRETS)
    for resource in ev.by_type("command:remote:Command"):
        assert resource.custom_timeouts["create"], resource.name


def test_every_node_names_the_serving_image_by_its_pin_never_by_the_heads_id(
    evaluation: Evaluation,
) -> None:
    """An ID names an image on the store that made it only (the containerd store gives the same
    image another): every container and step that runs the serving image, on every node, names
    it `spark-vllm.invalid/image:sha256-<head's ID>` (stacks/plan/image.py pinned_image); the
    record and the copies carry the ID to make that name."""
    ev = evaluation
    image_id = ev.outputs["imageId"]
    pinned = "spark-vllm.invalid/image:" + image_id.replace(":", "-")
    for container in ev.by_type("docker:index/container:Container"):
        if container.name == "front-container":  # the front runs its own image (HAProxy)
            assert container.inputs["image"].startswith("sha256:")
        else:
            assert container.inputs["image"] == pinned, container.name
    runs_it = [
        r
        for r in ev.by_type("command:remote:Command")
        if r.name.endswith("-facts") or r.name.startswith(("compile-cache-", "memory-check"))
    ]
    assert len(runs_it) == 2 * host_count(ev) + 1
    for step in runs_it:
        words = shlex.split(step.inputs["create"]) + shlex.split(step.inputs.get("delete") or "")
        assert image_id not in words, step.name
        assert pinned in words, step.name
    for step in ev.by_type("command:remote:Command"):
        if step.name.endswith("-sync") or step.name == "image-head-record":
            assert f"--pinned {pinned}" in step.inputs["create"], step.name


def test_the_models_output_lists_each_model_with_what_it_showed(evaluation: Evaluation) -> None:
    (model,) = evaluation.outputs["models"]
    assert model["servedName"] == evaluation.outputs["modelId"] == "qwen"
    assert model["id"] == "Qwen/Qwen3.5-122B-A10B-FP8" and model["revision"] == "main"
    assert model["nodes"] == [n["name"] for n in evaluation.outputs["nodes"]]
    assert model["executor"] == evaluation.outputs["executor"]
    assert model["gpuMemoryUtilization"] == 0.8


def test_the_readiness_answer_becomes_figures() -> None:
    line = (
        "vllm: ready after 41s; first completion: ok; speed: time to first token 0.084 s, "
        "decode 31.5 tokens/s (median of 3 streamed completions of 64 tokens; server version x)"
    )
    assert parse_readiness(line) == {"timeToFirstTokenSeconds": 0.084, "tokensPerSecond": 31.5}
    assert parse_readiness("vllm: ready after 3s; first completion: ok") == {
        "timeToFirstTokenSeconds": None, "tokensPerSecond": None,
    }  # fmt: skip


HARDENED_ROLES = ("memory-guard", "docker-filter")


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_no_container_but_the_firewall_guard_keeps_net_raw(
    make_config: ConfigFactory, executor: str
) -> None:
    """CAP_NET_RAW (Docker's default set) lets a host-network container read and forge the
    host's traffic: dropped from every container, monitoring and the memory guard included,
    but the guard's (legacy iptables' raw socket); as Docker stores it, so a refresh agrees."""
    config = make_config(hosts=2, executor=executor)
    config["monitoring"] = {"enabled": True}
    config["memoryGuard"] = {"enabled": True}
    ev = evaluate(config, SECRETS)
    containers = ev.by_type("docker:index/container:Container")
    roles = set()
    for container in containers:
        labels = {label["label"]: label["value"] for label in container.inputs["labels"]}
        role = labels["spark-vllm.role"]
        roles.add(role)
        caps = container.inputs.get("capabilities")
        if role == "firewall":
            assert caps == {"adds": ["CAP_NET_ADMIN", "CAP_NET_RAW"]}, container.name
        elif role in HARDENED_ROLES:  # the memory guard and its Docker filter: none at all
            assert caps == {"drops": ["ALL"]}, (container.name, caps)
        else:
            assert caps == {"drops": ["CAP_NET_RAW"]}, (container.name, caps)
    assert {"front", "vllm", "firewall", "memory-guard", "grafana", "prometheus"} <= roles
    assert "node-exporter" in roles


def test_no_serving_container_can_write_the_model_cache(evaluation: Evaluation) -> None:
    """The HF cache is the weights steps' (as the SSH user): a server, or anything its image
    runs, reads it only; a model's own code goes to the node's writable compile cache."""
    ev = evaluation
    serving = [r for r in ev.by_type("docker:index/container:Container")
               if "HF_HOME" in envs_of(ev, r.name)]  # fmt: skip
    assert {r.name for r in serving} >= {"vllm-container", "ray-head"}
    for resource in serving:
        mounts = {m["target"]: m for m in resource.inputs["mounts"]}
        assert mounts[CONTAINER_HF_HOME].get("readOnly") is True, resource.name
        modules = envs_of(ev, resource.name)["HF_MODULES_CACHE"]
        assert modules.startswith(CONTAINER_COMPILE_CACHE + "/"), resource.name
        assert not mounts[CONTAINER_COMPILE_CACHE].get("readOnly"), resource.name
