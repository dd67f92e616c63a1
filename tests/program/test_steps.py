"""The plan's step and container specs as pure functions: facts in, commands out (no Pulumi
runtime), the way pyinfra tests its operations. The mocks tests check how they become a graph."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from stacks.plan import fabric, image, server, steps, weights
from stacks.plan.containers import EntryScripts, ray_container, vllm_container
from stacks.plan.front import front_bind
from stacks.plan.image import image_streams
from stacks.plan.server_plan import per_server
from stacks.plan.sizing import ServerSizing
from stacks.plan.steps import Receipt, create_command
from tests.program.conftest import ConfigFactory
from tests.program.planning import every_step, known, plan_of

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = EntryScripts(
    launcher="echo launcher",
    gate="echo gate",
    guard="echo guard",
    exporter_gate="echo gate",
    memory_guard="print('memory guard')",
    docker_filter="print('docker filter')",
)


def tokens(prefix: str = "t") -> Callable[[Receipt], str]:
    return lambda receipt: f"{prefix}-{receipt.node.name}-{receipt.step}"


def test_a_receipt_token_changes_only_its_steps_create(make_config: ConfigFactory) -> None:
    """A failing receipt gives a fresh token (components/facts.py): the create differs, so
    pulumi-command plans an update that re-runs it; its delete, stdin and timeouts do not."""
    plan = plan_of(make_config(hosts=2))
    spec = known(image.sync_image(plan, plan.workers[0], image_streams(plan)[0]))
    held, fresh = create_command(spec, tokens("held")), create_command(spec, tokens("fresh"))
    assert held != fresh
    assert held.replace("held-", "fresh-") == fresh
    assert "--token held-spark2-image-spark2-sync" in held


def test_a_workers_receipt_is_written_there_over_the_fabric(make_config: ConfigFactory) -> None:
    plan = plan_of(make_config(hosts=2))
    worker = plan.workers[0]
    spec = known(weights.copy_weights(per_server(plan)[0], worker))
    assert spec.node == plan.head and [r.node for r in spec.receipts] == [worker]
    receipt = create_command(spec, tokens()).split(" && ")[-1]
    assert receipt.startswith(f"bash {plan.head.bin_dir}/receipt.sh --host spark1 ")
    assert f"--worker spark2 --target {worker.fabric_destination}" in receipt
    assert f"--worker-bin {worker.bin_dir}" in receipt
    assert f"--fabric-key {fabric.fabric_key_file(plan)}" in receipt
    assert "'snapshot|/home/aurora/.cache/huggingface|Qwen/Qwen3.5-122B-A10B-FP8|c0ffee1234'" in (
        receipt
    )


def test_a_steps_receipts_are_only_on_the_node_it_runs_on_or_its_worker(
    make_config: ConfigFactory,
) -> None:
    plan = plan_of(make_config(hosts=3))
    elsewhere = 0
    for spec in every_step(plan):
        for receipt in spec.receipts:
            if receipt.node != spec.node:  # the head ran it for a worker: it needs the fabric
                assert spec.node == plan.head, spec.name
                assert dict(spec.fabric) == fabric.fabric_flags(plan) != {}, spec.name
                elsewhere += 1
    assert elsewhere == 4  # image and weights, on each of two workers


def test_the_image_stays_on_workers_unless_asked(make_config: ConfigFactory) -> None:
    keep = plan_of(make_config(hosts=2))
    drop = plan_of(make_config(hosts=2, image={"ref": "x/y:1", "keepOnDestroy": False}))
    assert known(image.sync_image(keep, keep.workers[0], image_streams(keep)[0])).delete is None
    delete = known(image.sync_image(drop, drop.workers[0], image_streams(drop)[0])).delete
    # The worker's stage goes only while its state leaf is this deployment's (--owner).
    assert delete is not None and delete.endswith(" --remove yes --owner spark-vllm/test")
    assert image.image_pull(drop, image_streams(drop)[0]).keep_locally is False


def test_a_configured_pin_is_passed_and_nothing_is_read_on_stdin(
    make_config: ConfigFactory,
) -> None:
    config = make_config(hosts=2)
    pinned = plan_of(config)
    del config["hosts"][1]["hostKey"]
    learned = plan_of(config)
    with_pin = fabric.pin_worker_key(pinned, pinned.workers[0])
    without = fabric.pin_worker_key(learned, learned.workers[0])
    assert with_pin.stdin is None and "--key 'ssh-ed25519 " in with_pin.create
    assert without.stdin == "worker-host-keys" and "--key" not in without.create


@pytest.mark.parametrize(
    ("hosts", "worker", "sources"),
    [
        # One worker: only the head signs in to it.
        (2, "spark2", "10.241.0.11"),
        # Copies relay from worker to worker (fabric.py relay_leader), in any model's order:
        # each worker also admits the others, never itself.
        (3, "spark2", "10.241.0.11,10.241.0.13"),
        (3, "spark3", "10.241.0.11,10.241.0.12"),
    ],
)
def test_the_head_key_is_authorized_from_the_fabric_addresses_that_use_it(
    make_config: ConfigFactory, hosts: int, worker: str, sources: str
) -> None:
    plan = plan_of(make_config(hosts=hosts))
    node = next(w for w in plan.workers if w.name == worker)
    spec = fabric.authorize_head_key(plan, node)
    assert f"--from {sources}" in spec.create
    assert spec.receipts[0].checks == (f"authorized|{fabric.fabric_marker(plan)}|{sources}",)
    assert spec.delete is not None and "--from" not in spec.delete  # a revocation needs none


def test_secrets_are_read_on_stdin_only(make_config: ConfigFactory) -> None:
    """No spec takes a secret: the steps that need one declare it as their stdin."""
    plan = plan_of(make_config(hosts=2))
    readers = {spec.name: spec.stdin for spec in every_step(plan) if spec.stdin is not None}
    assert readers["front-api-key"] == "api-key" and readers["vllm-ready"] == "api-key"
    assert readers["weights-fetch"] == "hf-token"
    assert server.front_key_file(plan).quiet == "none"  # nothing it prints is logged


def test_no_fabric_flags_when_the_user_manages_fabric_trust(make_config: ConfigFactory) -> None:
    plan = plan_of(make_config(hosts=2, fabric={"trust": "existing"}))
    assert not fabric.fabric_trust_managed(plan) and fabric.fabric_flags(plan) == {}
    assert "--fabric-key" not in known(server.ray_wait(per_server(plan)[0])).create


def test_quick_steps_are_bounded_and_transfers_get_their_configured_time(
    make_config: ConfigFactory,
) -> None:
    plan = plan_of(make_config(hosts=2, timeouts={"imageTransferMinutes": 50}))
    for spec in every_step(plan):
        assert spec.timeouts.create >= 2, spec.name
    assert (
        known(image.sync_image(plan, plan.workers[0], image_streams(plan)[0])).timeouts.create == 55
    )
    assert fabric.head_fabric_key(plan).timeouts == steps.QUICK


def test_a_check_refuses_its_separators() -> None:
    with pytest.raises(ValueError, match="cannot record a check"):
        steps.check("files", "/a|b")


def test_containers_share_one_shape_and_differ_only_where_the_role_does(
    make_config: ConfigFactory,
) -> None:
    plan = plan_of(make_config(hosts=2))
    head = ray_container(per_server(plan)[0], plan.head, "m1", SCRIPTS)
    worker = ray_container(per_server(plan)[0], plan.workers[0], "m2", SCRIPTS)
    server = vllm_container(per_server(plan)[0], "m1", SCRIPTS, ServerSizing("0.8"))
    assert (head.restart, worker.restart, server.restart) == (
        "on-failure",
        "on-failure",
        "unless-stopped",
    )
    assert (head.host_pid, worker.host_pid, server.host_pid) == (True, False, True)
    assert head.mounts == worker.mounts == server.mounts[:5]  # same user: same state dir
    assert server.mounts[-1].source == plan.api_key_dir and server.mounts[-1].read_only
    # Behind the firewall gate: its marker, then the launcher.
    assert server.entrypoint[:4] == ("bash", "-c", "echo gate", "firewall-gate")
    assert server.entrypoint[-5:] == ("--", "bash", "-c", "echo launcher", "vllm-launcher")
    assert ("spark-vllm.mounts", "m2") in worker.labels
    assert list(worker.labels) == sorted(worker.labels)
    assert f"VLLM_HOST_IP={plan.workers[0].fabric_ip}" in worker.env
    assert worker.devices == ("/dev/infiniband",)
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in worker.env
    assert [u.name for u in worker.ulimits] == ["memlock", "stack"]
    no_rdma = make_config(hosts=2)
    for host in no_rdma["hosts"]:
        host["rdmaHcas"] = []
    plain_plan = plan_of(no_rdma)
    plain = ray_container(per_server(plain_plan)[0], plain_plan.head, "m", SCRIPTS)
    assert plain.devices == () and [(u.name, u.soft) for u in plain.ulimits] == [
        ("stack", 67108864)
    ]
    assert "RAY_memory_monitor_refresh_ms=0" in plain.env
    assert not any(e.startswith("RAY_NODE_IP_ADDRESS=") for e in plain.env)


# -- one quoting rule: every command line, run by bash, hands each script its words intact ----

ODD = "spark vllm/it's"  # a space and a quote


def test_every_command_line_keeps_odd_paths_one_word(
    make_config: ConfigFactory, host_tmp: Path
) -> None:
    """Each step's create and delete run for real with bash; the step scripts are stand-ins that
    record the words they were given. State and cache dirs hold a space and a quote."""
    state_root, cache = host_tmp / ODD, host_tmp / "hf cache" / "o'neil"
    config = make_config(hosts=2)
    for host in config["hosts"]:
        host["stateDir"] = f"{state_root}/{host['name']}"
    config["model"]["cacheDir"] = str(cache)
    plan = plan_of(config)
    log = host_tmp / "calls.jsonl"
    dump = "import json, sys; print(json.dumps(sys.argv[1:]))"
    recorder = f'python3 -c "{dump}" "$0" "$@" >> "{log}"\n'
    scripts = {p.name for p in (REPO / "components" / "scripts").iterdir()}
    for node in plan.nodes:
        Path(node.bin_dir).mkdir(parents=True)
        for script in scripts:
            (Path(node.bin_dir) / script).write_text(recorder)
    specs = [s for s in every_step(plan) if not s.name.endswith("-scripts")]
    checked = 0
    for spec in specs:
        for line in (create_command(spec, tokens()), spec.delete):
            if line is None or not line.startswith("bash "):
                continue
            log.unlink(missing_ok=True)
            subprocess.run(["bash", "-c", line], check=True, timeout=30)
            calls = [json.loads(c) for c in log.read_text().splitlines()]
            assert calls and all(Path(c[0]).parent == Path(spec.node.bin_dir) for c in calls)
            for call in calls:
                # A receipt's checks and a node list join several paths in one word.
                fields = [f for w in call for f in re.split(r"[|;,]", w)]
                odd = [f for f in fields if "it's" in f or "o'neil" in f]
                for field in odd:
                    assert field.startswith((str(state_root), str(cache))), (spec.name, field)
                checked += len(odd)
    assert len(specs) >= 14 and checked >= 50


def test_components_never_read_the_config() -> None:
    """The components turn specs into resources; what a setting means is decided in the plan.
    (The import contract keeps them from importing stacks.config; this catches `plan.config`.)"""
    for path in sorted((REPO / "components").glob("*.py")):
        tree = ast.parse(path.read_text())
        reads = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "config"
        ]
        assert not reads, f"{path.name} reads the config at lines {reads}"


@pytest.mark.parametrize(
    ("listen", "bind", "probe", "endpoint"),
    [
        ("all", ":::8000 v4v6", None, "http://10.240.1.11:8000/v1"),
        ("fabric", "10.241.0.11:8000", "10.241.0.11", "http://10.241.0.11:8000/v1"),
        ("loopback", "127.0.0.1:8000", "127.0.0.1", "http://127.0.0.1:8000/v1"),
    ],
)
def test_where_the_front_listens_is_where_it_is_probed_and_published(
    make_config: ConfigFactory, listen: str, bind: str, probe: str | None, endpoint: str
) -> None:
    """vLLM itself listens on loopback only, on its own port; the front publishes vllm.port
    where `listen` says, and the readiness probe goes through the front."""
    config = make_config(hosts=2)
    config["vllm"] = {**config["vllm"], "listen": listen}
    plan = plan_of(config)
    command = vllm_container(per_server(plan)[0], "m", SCRIPTS, ServerSizing("0.8")).command
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--port") + 1] == "8001"
    assert front_bind(plan) == bind
    ready = known(server.vllm_ready(per_server(plan)[0])).create
    assert (f"--probe-host {probe}" in ready) if probe else ("--probe-host" not in ready)
    assert plan.endpoint_url == endpoint
