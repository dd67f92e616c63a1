"""End to end: the real `__main__.py` deploys onto simulated hosts, for real, through a bastion,
with the real Pulumi CLI and engine (tests/lab/realcli.py; the providers and the language host
are the lab's, the proxy serving none: docs/testing.md, The real Pulumi).

Every step the program declares is performed over SSH (pinned keys, the bastion as proxy) and
through each host's Docker provider settings. Only `vllm` is a stand-in; OpenSSH, Docker, Ray,
the image transfer and the weights copy are real.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from shlex import quote as q
from typing import Any

import pytest

from lab import HF_MODEL, HF_MORE_MODELS, Lab
from lab.hosts import nodes_of
from lab.image import REQUIREMENTS
from lab.stack import IMAGE_NAME, SERVED_NAME
from stacks.plan.image import pinned_image
from stacks.plan.ray_versions import NODE_LOOKUP_ERROR
from tests.lab import attacker
from tests.lab.cli_stack import init_stack, outputs_by_name
from tests.lab.deploying import (
    API_KEY,
    PREFIX,
    RAY_NODES,
    STATE,
    as_fleet,
    benchmark_figure,
    cold_start_figure,
    complete,
    copy_report,
    default_lab_config,
    forward_through_bastion,
    host_sh,
    image_identity,
    lab_config,
    models_listed,
    reachable_from_bastion,
)
from tests.lab.realcli import RealPulumi, plan_of_events
from tests.lab.timings import record_figure, record_timing

pytestmark = pytest.mark.lab

STANDIN_VERSION = "0.0.0+spark-vllm-lab-standin"  # what its /version says
STANDIN_PACKAGE_VERSION = "0.0.0+spark.vllm.lab.standin"  # its metadata's (PEP 440 normalised)
LOAD_ENV = "VLLM_STANDIN_LOAD_SECONDS"
SECOND_MODEL = "tiny-chat-b"  # a second lab model (HF_MORE_MODELS), beside the first
# `pulumi up`'s default parallelism is 4 per CPU: 8 on this machine, 64 on a user's 16-core
# laptop. The e2e's first `up` runs with the laptop's, against the lab's stock sshd limits.
USER_PARALLEL = 64
assert "ray==2.60.0" in REQUIREMENTS  # the lab image's Ray, which rayVersion must report


@dataclass
class Deployment:
    lab: Lab
    cli: RealPulumi
    outputs: dict[str, Any]


def e2e_config(lab: Lab) -> dict[str, Any]:
    """The lab stack, with a server that loads its weights for a few seconds (the stand-in logs
    vLLM's progress lines meanwhile) and a wait that reports every 5 s."""
    config = lab_config(lab)
    config["spark-vllm:vllm"] = {
        **config["spark-vllm:vllm"],
        "env": {LOAD_ENV: "12"},
        # Optional, off by default: measured once ready, as users compare setups.
        "benchmark": {
            "concurrencies": [1, 4],
            "inputTokens": 128,
            "outputTokens": 64,
            "requestsPerStream": 4,
        },
    }
    config["spark-vllm:timeouts"] = {**config["spark-vllm:timeouts"], "vllmProgressSeconds": 5}
    return config


@pytest.fixture(scope="module")
def deployed(
    lab_factory: Callable[..., Lab], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    # A lab of its own: the infra tests expect the shared lab untouched (image on the head only).
    lab = lab_factory("e2e", hosts=2, topology="bastion")
    cli = RealPulumi.for_project(tmp_path_factory.mktemp("e2e"))
    init_stack(cli, "lab", e2e_config(lab))
    started = time.monotonic()
    try:
        cli.run("up", "--yes", "--skip-preview", f"--parallel={USER_PARALLEL}")
    except BaseException:
        cli.run("destroy", "--yes", "--skip-preview", check=False)
        raise
    record_timing("e2e first up, real CLI (bastion, 2 hosts)", time.monotonic() - started)

    deployment = Deployment(lab, cli, cli.outputs())
    yield deployment
    cli.run("destroy", "--yes", "--skip-preview")  # nothing left after the teardown test ran


@pytest.fixture
def endpoint(deployed: Deployment) -> Iterator[str]:
    tunnel, base = forward_through_bastion(deployed.lab, deployed.outputs["endpointUrl"])
    try:
        yield base
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)


def test_outputs_name_the_endpoint_and_model(deployed: Deployment) -> None:
    spec = deployed.lab.spec
    outputs = deployed.outputs
    assert outputs["endpointUrl"] == f"http://{spec.host_mgmt_ip(0)}:8000/v1"
    assert outputs["modelId"] == SERVED_NAME
    assert deployed.cli.secret_output_names() == {"apiKey"}
    assert "ready after" in outputs["readiness"]
    # What the image carries, read by running it once (the stand-in's own metadata).
    assert outputs["vllmVersion"] == STANDIN_PACKAGE_VERSION
    # The lab has no RDMA (no hosts[].rdmaHcas): the transport is not checked, and says so.
    assert outputs["fabricTransport"] == "not checked (no hosts[].rdmaHcas)"
    # Serving speed, measured once ready: the stand-in's figure, labelled by its version.
    assert re.search(
        r"speed: time to first token [\d.]+ s, decode [\d.]+ tokens/s \(median of 3 streamed "
        rf"completions of 64 tokens; server version {re.escape(STANDIN_VERSION)}\)",
        outputs["readiness"],
    ), outputs["readiness"]
    assert outputs["rayVersion"] == "2.60.0"
    # vllm.benchmark: the stand-in's serving measured by its `vllm bench serve` (vLLM's flags
    # and result keys), one row per concurrency.
    rows = outputs["benchmark"]
    assert [(r["concurrency"], r["requests"]) for r in rows] == [(1, 4), (4, 16)], rows
    assert all(r["outputTokensPerSecond"] > 0 and r["medianTtftMs"] > 0 for r in rows), rows
    record_figure("benchmark (stand-in, 128 tokens in, 64 out)", benchmark_figure(rows))
    (model,) = outputs["models"]
    assert model["servedName"] == SERVED_NAME
    assert model["timeToFirstTokenSeconds"] > 0 and model["tokensPerSecond"] > 0
    assert model["nodes"] == spec.host_names == [n["name"] for n in outputs["nodes"]]


def test_stock_sshd_limits_dropped_no_connection_of_the_run(deployed: Deployment) -> None:
    """Every step dials the bastion and its host (one SSH connection each, pulumi-command's and
    the stand-in's alike), and the engine starts up to --parallel of them at once. Stock sshd
    (the lab's, Debian's `MaxStartups 10:30:100`) drops connections at random once more than 10
    are being authenticated: a drop would be a step failing its dials. None was, at a laptop's
    parallelism (64), on the bastion or either host."""
    throttled = {
        node.name: [line for line in log.splitlines() if "MaxStartups" in line]
        for node in nodes_of(deployed.lab.spec)
        if (log := (node.hostdir / "log" / "sshd.log").read_text(errors="replace"))
    }
    assert not any(throttled.values()), throttled
    assert {"bastion", "spark1", "spark2"} <= set(throttled)  # every log was read


def test_outputs_carry_the_measured_link_and_the_memory_the_server_was_sized_for(
    deployed: Deployment,
) -> None:
    outputs = deployed.outputs
    link = outputs["fabricLinks"]["spark2"]
    # The veth fabric: several Gbit/s measured, a 1500-byte MTU on both ends.
    assert link["gbps"] > 1 and link["mtu"] == 1500, link
    memory = outputs["memory"]
    assert memory["mode"] == "auto" and set(memory["nodes"]) == {"spark1", "spark2"}, memory
    chosen = float(memory["gpuMemoryUtilization"])
    # What `auto` chose fits every node, below what the node had free.
    assert 0.05 <= chosen <= min(node["fits"] for node in memory["nodes"].values())
    assert {node["basis"] for node in memory["nodes"].values()} == {"meminfo"}  # no GPUs here
    args = host_sh(
        deployed.lab, "spark1", f"docker inspect --format '{{{{json .Args}}}}' {PREFIX}-vllm"
    )
    assert f'"--gpu-memory-utilization","{memory["gpuMemoryUtilization"]}"' in args.replace(
        ", ", ","
    )


def test_the_wait_reports_the_servers_progress_while_it_loads(deployed: Deployment) -> None:
    """Streamed into the `pulumi up` output (the step's stderr): time waited, the probe's state,
    and the server's latest progress line from its log."""
    ready = outputs_by_name(deployed.cli)["vllm-ready"]
    reports = [line for line in ready["stderr"].splitlines() if line.startswith("vllm:")]
    assert reports, ready["stderr"][-2000:]
    assert all(
        re.match(r"vllm: waiting \d+s of 240s; probe: .+; server log: .+", r) for r in reports
    )
    loading = ("checkpoint shards", "CUDA graphs", "Loading weights", "Graph capturing")
    assert any(word in report for report in reports for word in loading), reports


def test_a_completion_through_the_bastion_returns_text(deployed: Deployment, endpoint: str) -> None:
    status, reply = complete(endpoint, deployed.outputs["modelId"])
    assert status == 200
    assert reply["choices"][0]["text"].strip()
    assert reply["usage"]["completion_tokens"] >= 1


def test_the_api_key_is_enforced(deployed: Deployment, endpoint: str) -> None:
    assert complete(endpoint, deployed.outputs["modelId"], key=None)[0] == 401
    assert complete(endpoint, deployed.outputs["modelId"], key="wrong")[0] == 401


def test_the_fronts_metrics_stay_on_the_heads_loopback(deployed: Deployment) -> None:
    """HAProxy's Prometheus exporter (front.metricsPort) answers on the head's loopback, with
    the requests the tests above sent, and is not open to the management network."""
    lab = deployed.lab
    metrics = host_sh(lab, "spark1", "curl -s http://127.0.0.1:8404/metrics")
    served = re.findall(
        r'^haproxy_backend_http_responses_total\{proxy="model_0",code="2xx"\} (\S+)$',
        metrics,
        re.MULTILINE,
    )
    assert served and float(served[0]) > 0, metrics[-1500:]
    assert not reachable_from_bastion(lab, lab.spec.host_mgmt_ip(0), 8404)


def test_every_route_wants_the_key_and_the_openai_client_streams(
    deployed: Deployment, endpoint: str
) -> None:
    """From the bastion (a neighbour on the mgmt LAN): 401 on every vLLM route without the key;
    with it, the official client streams. vLLM itself, on the head's loopback, answers its open
    routes without the key: the front is what closes them."""
    lab, model = deployed.lab, deployed.outputs["modelId"]
    published = f"http://{lab.spec.host_mgmt_ip(0)}:8000"
    attacker.assert_every_route_wants_the_key(lab, published, API_KEY, model)
    attacker.assert_the_openai_client_streams(endpoint, API_KEY, model)
    tokenize = "curl -s -o /dev/null -w '%{http_code}' -X POST -d '{\"prompt\": \"hi\"}' "
    assert host_sh(lab, "spark1", tokenize + "http://127.0.0.1:8001/tokenize") == "200"
    assert not reachable_from_bastion(lab, lab.spec.host_mgmt_ip(0), 8001)


def test_the_key_never_reaches_a_ray_worker(deployed: Deployment) -> None:
    """vLLM's Ray executor copies the driver's VLLM_* variables to its workers, less those its
    non-carry-over file lists: the launcher lists VLLM_API_KEY (the stand-in copies as vLLM)."""
    lines = host_sh(deployed.lab, "spark1", f"docker logs {PREFIX}-vllm 2>&1 | grep 'rank [0-9]:'")
    carried = re.findall(r"api_key_carried=(\w+)", lines)
    assert carried == ["no", "no"], lines


def test_ray_lists_every_node_by_its_fabric_ip(deployed: Deployment) -> None:
    lab = deployed.lab
    seen = host_sh(lab, "spark1", f'docker exec {PREFIX}-ray-head python3 -c "{RAY_NODES}"')
    fabric = sorted(lab.spec.host_fabric_ip(i) for i in range(lab.spec.hosts))
    assert json.loads(seen.splitlines()[-1]) == fabric


DRIVER = (
    "import ray; ray.init(logging_level='ERROR'); "
    "print('attached to node', ray.get_runtime_context().get_node_id()[:12])"
)


def test_a_driver_beside_the_ray_head_finds_its_raylet_only_in_the_hosts_pid_namespace(
    deployed: Deployment,
) -> None:
    """Ray 2.55 on (the lab's 2.60) finds a driver's node among the processes the driver can see
    (stacks/plan/ray_versions.py): the server's layout (the host's PID namespace, the head's
    /tmp/ray) attaches; the same driver in a PID namespace of its own gives up with the error of
    ray issue #63923 (its 60 s retry shortened to 5 s here)."""
    lab = deployed.lab
    driver = (
        f"docker run --rm --network host --ipc host {{pid}} -v {STATE}/ray:/tmp/ray "
        f"-e RAY_ADDRESS={lab.spec.host_fabric_ip(0)}:6379 "
        "-e RAY_gcs_server_request_timeout_seconds=5 "
        f"--entrypoint python3 {IMAGE_NAME} -c {q(DRIVER)} 2>&1 | tail -n 60"
    )
    beside = host_sh(lab, "spark1", f"timeout 90 {driver.format(pid='--pid host')} || true")
    assert "attached to node" in beside, beside
    alone = host_sh(lab, "spark1", f"timeout 90 {driver.format(pid='')} || true")
    # ray.init wraps the lookup's RuntimeError: "Failed to connect to Ray cluster at ...".
    assert NODE_LOOKUP_ERROR in alone and "Failed to connect to Ray cluster" in alone, alone


def test_each_worker_has_the_heads_image_and_model(deployed: Deployment) -> None:
    lab = deployed.lab
    image_id = deployed.outputs["imageId"]
    manifest = (
        f"bash {STATE}/bin/hf-manifest.sh --host {{h}} --cache-dir /root/.cache/huggingface"
        " --model spark-vllm-lab/tiny-chat --revision main"
    )
    head_manifest = host_sh(lab, "spark1", manifest.format(h="spark1"))
    for worker in ("spark2",):
        # By content, under its pinned name: the head's ID names it on its own store only.
        identity = image_identity(lab, worker, pinned_image(image_id))
        assert identity and identity == image_identity(lab, "spark1", image_id)
        assert host_sh(lab, worker, manifest.format(h=worker)) == head_manifest
        owner = host_sh(lab, worker, "stat -c %U /root/.cache/huggingface/hub")
        assert owner == "root"  # the SSH user, not a container's


def test_secrets_are_not_in_container_configuration(deployed: Deployment) -> None:
    for container in ("vllm", "front", "ray-head", "firewall"):
        inspect = host_sh(deployed.lab, "spark1", f"docker inspect {PREFIX}-{container}")
        assert API_KEY not in inspect, container
    secrets, front = f"{STATE}/secrets", f"{STATE}/front-secrets"
    modes = host_sh(deployed.lab, "spark1", f"stat -c %a {secrets}/api-key {front}/bearer")
    assert modes.split() == ["600", "600"]
    # The server's key directory holds its key alone; the front's is mounted into no other.
    assert host_sh(deployed.lab, "spark1", f"ls -A {secrets}").split() == ["api-key"]


def test_what_the_bastion_can_and_cannot_reach(deployed: Deployment) -> None:
    lab, spec = deployed.lab, deployed.lab.spec
    # Reachable: SSH on every host, and the API (which wants the key: see above). Every other
    # port listening on a wildcard address (Ray's, vLLM's own) is dropped, IPv4 and IPv6.
    hosts = ("spark1", "spark2")
    probed = attacker.assert_the_lan_reaches_only_ssh_and_the_endpoint(lab, hosts, 8000)
    assert {6379, 6380, 6381} <= set(probed["spark1"]), probed  # GCS, raylet, object manager
    assert {6380, 6381} <= set(probed["spark2"]), probed
    for index in range(spec.hosts):
        assert not reachable_from_bastion(lab, spec.host_fabric_ip(index), 22)
    # While the nodes themselves still talk over the fabric.
    listening = host_sh(lab, "spark1", "ss -Hltn 'sport = :6379'")
    assert "*:6379" in listening or "0.0.0.0:6379" in listening


def test_a_second_up_is_idempotent_and_keeps_serving(deployed: Deployment, endpoint: str) -> None:
    """The engine's own check: an `up` that expects no changes, every resource "same" (so no
    command ran), the outputs as they were."""
    started = time.monotonic()
    run = deployed.cli.run("up", "--yes", "--skip-preview", "--expect-no-changes", "--json")
    record_timing("e2e second up, real CLI (unchanged stack)", time.monotonic() - started)
    plan = plan_of_events(run.stdout)
    assert set(plan.values()) == {"same"}, {n: op for n, op in plan.items() if op != "same"}
    outputs = deployed.cli.outputs()
    assert outputs == deployed.outputs
    assert complete(endpoint, outputs["modelId"])[0] == 200


def test_teardown_leaves_the_hosts_clean(deployed: Deployment) -> None:
    lab = deployed.lab
    deployed.cli.run("destroy", "--yes", "--skip-preview")
    for host in ("spark1", "spark2"):
        assert host_sh(lab, host, "docker ps -aq") == "", f"{host}: containers left"
        assert host_sh(lab, host, "pgrep -x 'raylet|gcs_server' || true") == "", host
        authorized = host_sh(lab, host, "cat /root/.ssh/authorized_keys")
        assert "spark-vllm-fabric" not in authorized, f"{host}: fabric key still authorized"
        assert host_sh(lab, host, f"ls {STATE}/bin 2>/dev/null || true") == ""
    assert host_sh(lab, "spark1", f"ls {STATE}/fabric_ed25519 2>&1 || true").endswith(
        "No such file or directory"
    )
    assert host_sh(lab, "spark1", f"test -e {STATE}/secrets/api-key && echo left || true") == ""


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_the_seeds_topology_with_three_hosts(
    lab_factory: Callable[..., Lab], executor: str, tmp_path: Path
) -> None:
    """The real CLI and engine (tests/lab/realcli.py) deploy and destroy it, as a user would.
    No bastion: this machine reaches only the head; workers only through the head. Three
    hosts with different fabric interface names, TP x PP = 3. The state and cache directories
    hold a space and a quote (every shell word is quoted, here and in the scripts). With either
    executor (one lab for both: the first run's teardown leaves it clean); the mp run also has
    the fabric between the two workers blocked, so the copies' relay chain falls back. Each
    host on another Docker engine and image store (lab/engines.py)."""
    lab = lab_factory(
        "seeds3",
        hosts=3,
        topology="jump",
        fabric_ifnames=("enp1s0f1np1", "enP2p1s0f1np1", "fab0"),
        # Today's Docker beside the old: the head on Docker 26's classic store (its save writes
        # the OCI layout), the workers on the containerd image store (Docker 29's default,
        # where an image ID is a manifest's digest) and on 20.10. The relay chain passes all.
        engines=("26", "26-containerd", "20.10"),
    )
    state_base, cache_dir = "/root/spark vllm/it's", "/root/hf cache/o'neil"
    state_dir = f"{state_base}/spark-vllm.lab"  # the stack's own leaf under stateDir
    host_sh(
        lab, "spark1", f"mkdir -p {q(cache_dir)} && cp -a /root/.cache/huggingface/. {q(cache_dir)}"
    )
    # mp: the lab stack's default executor (vllm.executor unset); ray: set. With mp, two
    # models behind the one endpoint (fixed fractions: several models need them).
    config = lab_config(lab) if executor == "ray" else default_lab_config(lab)
    for host in config["spark-vllm:hosts"]:
        host["stateDir"] = state_base
    config["spark-vllm:model"]["cacheDir"] = cache_dir
    models = [SERVED_NAME]
    if executor == "mp":
        config["spark-vllm:vllm"]["gpuMemoryUtilization"] = 0.15
        config = as_fleet(config, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[0], SECOND_MODEL))
        models.append(SECOND_MODEL)
    fabric = [lab.spec.host_fabric_ip(i) for i in range(3)]
    served_by = "ray-worker" if executor == "ray" else "vllm"
    # With mp, spark2 cannot reach spark3 over the fabric: the relay chain's hop between them
    # fails, and spark3's own steps copy what the chain could not bring.
    hop_blocked = executor == "mp"
    hop = ["INPUT", "-s", fabric[1], "-p", "tcp", "--dport", "22", "-j", "DROP"]
    if hop_blocked:
        lab.exec("spark3", ["iptables", "-I", *hop])
        for worker in ("spark2", "spark3"):  # what the first run left (keepOnDestroy): copy anew
            host_sh(lab, worker, f"docker image prune -af >/dev/null; rm -rf {q(cache_dir)}/hub")
    cli = RealPulumi.for_project(tmp_path / "cli")
    init_stack(cli, "lab", config)
    started = time.monotonic()
    try:
        cli.run("up", "--yes", "--skip-preview")
        outputs = cli.outputs()
        record_timing(
            f"e2e up (seeds' topology, 3 hosts, executor {executor})", time.monotonic() - started
        )
        assert outputs["endpointUrl"] == f"http://{lab.spec.outside_far_ip}:8000/v1"
        assert [m["servedName"] for m in outputs["models"]] == models
        cold = outputs["models"][0]["coldStart"]
        assert set(cold["imageCopySeconds"]) == {"spark2", "spark3"}, cold
        record_figure(f"cold start, executor {executor} (3 hosts)", cold_start_figure(cold))
        assert models_listed(outputs["endpointUrl"]) == models
        for model in models[1:]:  # each model through the one endpoint, the official client
            attacker.assert_the_openai_client_streams(outputs["endpointUrl"], API_KEY, model)
        status, reply = complete(outputs["endpointUrl"].removesuffix("/"), outputs["modelId"])
        assert status == 200 and reply["choices"][0]["text"].strip()
        # Every rank's node took part (the stand-in's text names them, rank 0's first).
        ranks = reply["choices"][0]["text"].split()[0].removeprefix("ranks=").split(",")
        assert ranks[0] == fabric[0] and sorted(ranks) == sorted(fabric), reply
        # The first worker's copies relay to both workers (one stream through spark2 to
        # spark3, not one per worker from the head); spark3's own steps find it there.
        steps = outputs_by_name(cli)
        copies = [("image", "image-{}-sync"), ("weights", "weights-{}-copy")]
        copies += [("weights", "weights-s1-{}-copy")] if len(models) > 1 else []
        for kind, step in copies:
            relayed = copy_report(steps[step.format("spark2")], kind)["relayed"]
            assert relayed == (1 if hop_blocked else 2), (kind, relayed)
        if not hop_blocked:
            assert_the_forwarded_key_signs_for_the_chains_hops_only(lab, state_dir)
        # Each host ran its own engine and store, and holds the head's image by content under
        # its pinned name (the ID differs on the containerd store).
        pinned = pinned_image(outputs["imageId"])
        head_identity = image_identity(lab, "spark1", outputs["imageId"])
        engines = {"spark1": "26. overlay2", "spark2": "26. overlayfs", "spark3": "20.10 overlay2"}
        for host, engine in engines.items():
            version, store = engine.split()
            found = host_sh(lab, host, "docker info -f '{{.ServerVersion}} {{.Driver}}'").split()
            assert found[0].startswith(version) and found[1] == store, (host, found)
            assert image_identity(lab, host, pinned) == head_identity, host
        image3 = copy_report(steps["image-spark3-sync"], "image")
        weights3 = copy_report(steps["weights-spark3-copy"], "weights")
        if hop_blocked:
            assert image3["bytes"] > 0 and weights3["sent"] > 0, (image3, weights3)
        else:
            assert image3["bytes"] == 0 and weights3["sent"] == 0, (image3, weights3)
            assert weights3["kept"] > 0, weights3
        if executor == "ray":
            seen = host_sh(lab, "spark1", f'docker exec {PREFIX}-ray-head python3 -c "{RAY_NODES}"')
            assert json.loads(seen.splitlines()[-1]) == sorted(fabric)
        for index, host in enumerate(("spark2", "spark3"), start=1):
            env = host_sh(lab, host, f"docker inspect --format '{{{{json .Config.Env}}}}' "
                                     f"{PREFIX}-{served_by}")  # fmt: skip
            assert f"GLOO_SOCKET_IFNAME={lab.spec.fabric_ifname(index)}" in env
            assert "RAY_NODE_IP_ADDRESS" not in env
            # What both two-Spark references set: Ray's memory monitor off (with Ray), a
            # 64 MiB stack.
            assert ("RAY_memory_monitor_refresh_ms=0" in env) == (executor == "ray")
            stack = host_sh(lab, host, f"docker exec {PREFIX}-{served_by} sh -c 'ulimit -s'")
            assert stack == "65536"
            # The weights reached the odd cache path, and every step's receipt the odd state dir.
            assert host_sh(lab, host, f"ls {q(cache_dir)}/hub").strip().startswith("models--")
            receipts = host_sh(lab, host, f"ls {q(state_dir)}/receipts").split()
            assert {f"{host}-scripts", f"image-{host}-sync", f"weights-{host}-copy"} <= set(
                receipts
            )
    finally:
        cli.run("destroy", "--yes", "--skip-preview")
        if hop_blocked:
            lab.exec("spark3", ["iptables", "-D", *hop])
    for host in ("spark1", "spark2", "spark3"):
        assert host_sh(lab, host, "docker ps -aq") == ""
        assert host_sh(lab, host, f"test -e {q(state_dir)} && echo left || true") == ""


def assert_the_forwarded_key_signs_for_the_chains_hops_only(lab: Lab, state_dir: str) -> None:
    """The agent a relay forwards holds the head's fabric key limited to the chain's hops
    (copy_relay.py relay_agent, ssh-add -h, bound to the pinned host keys): with the chain
    spark2 -> spark3 the hop signs in; with a chain of spark2 alone, spark2 cannot use the key
    to reach spark3, though the very same key is authorized there."""
    bin_dir = f"{state_dir}/bin"
    members = [f"spark{i}|ssh://root@{lab.spec.host_fabric_ip(i - 1)}:22|{bin_dir}" for i in (2, 3)]
    # The engine's own pieces, run by the head's python3 from the installed scripts.
    script = (
        "import subprocess, sys\n"
        f"sys.path.insert(0, {bin_dir!r})\n"
        "import copy_relay as relay\n"
        "from copy_transport import Fabric\n"
        f"fabric = Fabric({state_dir + '/fabric_ed25519'!r}, "
        f"{state_dir + '/fabric_known_hosts'!r})\n"
        "limits, chain = relay.parse_chain(sys.argv[1]), relay.parse_chain(sys.argv[2])\n"
        "pins = open(fabric.known_hosts).read().rstrip()\n"
        "public = open(fabric.key + '.pub').read().rstrip()\n"
        "call = relay.relay_call('cat >/dev/null', chain, pins, public)\n"
        "with relay.relay_agent(fabric, limits) as env:\n"
        "    done = subprocess.run(fabric.command(chain[0].destination, call, forward=True),\n"
        "                          input='relayed', text=True, capture_output=True, env=env)\n"
        "sys.stderr.write(done.stderr)\n"
        "print(done.stdout)\n"
        "fabric.close()\n"
    )
    for limits, spark3 in ((members, "0"), (members[:1], "none")):
        done = lab.exec(
            "spark1",
            ["python3", "-c", script, "\n".join(limits), "\n".join(members)],
            check=False,
        )
        statuses = dict(
            line.split()[1:] for line in done.stdout.splitlines() if "spark-vllm-relayed" in line
        )
        assert statuses.get("spark2") == "0", (done.stdout, done.stderr)
        assert statuses.get("spark3", "none") == spark3, (limits, done.stdout, done.stderr)
