"""The hardware checks as pure specs (stacks/plan/hardware.py) and in the graph: the link test per
worker before anything is copied, the memory check before Ray and the server, `auto` sizing the
server, and the warnings drawn from every node's preflight facts."""

from __future__ import annotations

import shlex

import pytest

from stacks.config import ConfigError, parse_stack_config
from stacks.plan import hardware
from stacks.plan.hosts import preflight_flags
from stacks.plan.image import pinned_image
from stacks.plan.known_bad import SHIPPED, known_bad_flag
from stacks.plan.server_plan import per_server
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate
from tests.program.planning import IMAGE_ID, known, plan_of


def flags_of(command: str) -> dict[str, str]:
    words = shlex.split(command)
    start = next(i for i, w in enumerate(words) if w.startswith("--"))
    return dict(zip(words[start::2], words[start + 1 :: 2], strict=True))


def test_the_link_test_runs_on_the_head_for_each_worker(make_config: ConfigFactory) -> None:
    plan = plan_of(make_config(hosts=3, fabric={"mtu": 9000, "minLinkGbps": 50}))
    for worker in plan.workers:
        spec = hardware.fabric_link(plan, worker)
        assert spec.node == plan.head and spec.name == f"fabric-{worker.name}-link"
        flags = flags_of(spec.create)
        assert flags["--target"] == worker.fabric_destination
        assert flags["--worker-ip"] == worker.fabric_ip
        assert (flags["--mtu"], flags["--min-gbps"], flags["--seconds"]) == ("9000", "50", "3")
        assert flags["--fabric-key"].endswith("/fabric_ed25519")
        assert spec.receipts == () and spec.delete is None  # it leaves nothing behind


def test_without_fabric_mtu_the_ends_must_only_agree(make_config: ConfigFactory) -> None:
    plan = plan_of(make_config(hosts=2))
    assert flags_of(hardware.fabric_link(plan, plan.workers[0]).create)["--mtu"] == "any"


def test_the_memory_check_measures_every_node_with_our_containers(
    make_config: ConfigFactory,
) -> None:
    plan = plan_of(make_config(hosts=2, preflight={"dropPageCache": True}))
    flags = flags_of(known(hardware.memory_check(per_server(plan)[0])).create)
    head, worker = plan.head, plan.workers[0]
    assert flags["--nodes"].splitlines() == [
        f"{head.name}|-|{head.bin_dir}|spark-vllm-ray-head,spark-vllm-vllm|{head.fabric_ip}",
        f"{worker.name}|{worker.fabric_destination}|{worker.bin_dir}|spark-vllm-ray-worker,spark-vllm-vllm|"
        f"{worker.fabric_ip}",
    ]
    assert (flags["--gpus"], flags["--drop-page-cache"], flags["--utilization"]) == (
        "yes",
        "yes",
        "0.8",
    )
    assert flags["--margin-fraction"] == "0.05" and flags["--min-margin-bytes"] == str(2 << 30)
    assert flags["--image"] == pinned_image(IMAGE_ID)


def test_auto_sizes_the_server_from_the_memory_check(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    config["vllm"] = {**config["vllm"], "gpuMemoryUtilization": "auto"}
    ev = evaluate(config, SECRETS)
    command = ev.named("vllm-container").inputs["command"]
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.85"
    assert ev.outputs["memory"]["mode"] == "auto"
    # Preflight does not check a fraction it does not know yet; the floor still holds.
    assert "--memory-fraction 0 " in ev.named("spark1-preflight").inputs["create"]
    # Nothing of ours starts before the memory was measured.
    memory = ev.named("memory-check").urn
    for ray in ("ray-head", "ray-spark2"):
        assert memory in ev.named(ray).dependencies


def test_a_fixed_fraction_is_the_servers_and_is_checked(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    config["vllm"] = {**config["vllm"], "gpuMemoryUtilization": 0.7}
    ev = evaluate(config, SECRETS)
    command = ev.named("vllm-container").inputs["command"]
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.7"
    assert "--utilization 0.7 " in ev.named("memory-check").inputs["create"]
    assert ev.outputs["fabricLinks"] == {
        "spark2": {
            "worker": "spark2",
            "gbps": 93.5,
            "mtu": 9000,
            "headSpeedMbps": 200000,
            "workerSpeedMbps": 200000,
        }
    }


def test_images_and_weights_go_over_a_checked_link(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(hosts=2), SECRETS)
    assert ev.named("fabric-spark2-link").urn in ev.named("image-spark2-sync").dependencies


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("most", "vllm.gpuMemoryUtilization"),
        (0.99, "vllm.gpuMemoryUtilization"),
    ],
)
def test_gpu_memory_utilization_is_a_fraction_or_auto(
    make_config: ConfigFactory, value: object, message: str
) -> None:
    config = make_config(hosts=2)
    config["vllm"] = {**config["vllm"], "gpuMemoryUtilization": value}
    with pytest.raises(ConfigError, match=message):
        parse_stack_config(config)


def test_the_shipped_known_bad_list_and_the_stacks_own_reach_preflight(
    make_config: ConfigFactory,
) -> None:
    own = {"kind": "driver", "version": "580.95.*", "reason": "hangs", "source": "our lab"}
    config = parse_stack_config(make_config(hosts=2, preflight={"knownBad": [own]}))
    flag = known_bad_flag(config)
    assert flag.split(";") == [
        *(f"{e.kind}|{e.version}|{e.reason}|{e.source}" for e in SHIPPED),
        "driver|580.95.*|hangs|our lab",
    ]
    # Kernel 7.0's ENOMEM is Kexec HandOver, not one release (host_rules.py): no release entry.
    assert "7.0.0-1019" not in flag
    plan = plan_of(make_config(hosts=2, preflight={"allowKnownBad": True}))
    assert preflight_flags(plan, plan.head)["allow_known_bad"] == "yes"


def test_a_known_bad_entry_cannot_break_the_flag(make_config: ConfigFactory) -> None:
    bad = {"kind": "kernel", "version": "6.1", "reason": "a; b"}
    with pytest.raises(ConfigError, match=r"preflight.knownBad\[0\].reason"):
        parse_stack_config(make_config(hosts=2, preflight={"knownBad": [bad]}))


def test_warnings_name_allowed_known_bad_releases_and_mixed_nodes() -> None:
    facts = {
        "spark1": {"kernel": "6.17.0-1032-nvidia", "nvidiaDriver": "580.142", "knownBad": ""},
        "spark2": {
            "kernel": "7.0.0-1019-nvidia",
            "nvidiaDriver": "580.142",
            "knownBad": "the kernel 7.0.0-1019-nvidia is known to break this workload: x",
        },
    }
    assert hardware.hardware_warnings(facts) == [
        "spark2: the kernel 7.0.0-1019-nvidia is known to break this workload: x "
        "(deployed anyway: preflight.allowKnownBad)",
        "the nodes run different kernels (spark1 6.17.0-1032-nvidia, spark2 7.0.0-1019-nvidia): "
        "run one release on all",
    ]
    same = {node: {**fact, "knownBad": "", "kernel": "6.17"} for node, fact in facts.items()}
    assert hardware.hardware_warnings(same) == []


def test_parsers_take_the_last_line_of_their_kind() -> None:
    assert hardware.parse_fabric_link('noise\nspark-vllm-fabric-link {"gbps": 1.5}\n') == {
        "gbps": 1.5
    }
    assert hardware.parse_memory_sizing("nothing here") == {}
    assert hardware.parse_preflight('warning\n{"kernel": "6.17"}\n') == {"kernel": "6.17"}


# --- vllm.kvCache -------------------------------------------------------------------------------

GIB = 1024**3


def kv_config(make_config: ConfigFactory, executor: str | None = "ray", **vllm: object) -> dict:
    config = make_config(hosts=2, executor=executor)
    config["vllm"] = {**config["vllm"], **vllm}
    return config


def test_without_kv_cache_nothing_of_it_reaches_the_check_the_image_check_or_the_server(
    make_config: ConfigFactory,
) -> None:
    """Unset (the default), vLLM's profiler sizes the cache: the commands stay as they were."""
    ev = evaluate(kv_config(make_config), SECRETS)
    assert "--kv-cache" not in ev.named("memory-check").inputs["create"]
    assert "--kv-cache" not in ev.named("image-spark1-facts").inputs["create"]
    assert "--kv-cache-memory-bytes" not in ev.named("vllm-container").inputs["command"]


def test_kv_cache_auto_is_sized_by_the_check_from_the_snapshot_and_given_to_every_node(
    make_config: ConfigFactory,
) -> None:
    config = kv_config(
        make_config, executor=None, kvCache="auto", extraArgs=["--kv-cache-dtype", "fp8"]
    )
    ev = evaluate(config, SECRETS)
    create = shlex.split(ev.named("memory-check").inputs["create"])
    flags = {create[i]: create[i + 1] for i in range(len(create) - 1) if create[i].startswith("--")}
    cache = config["model"]["cacheDir"]
    model = config["model"]["id"].replace("/", "--")
    # The snapshot the weights step fetched (its manifest's commit), on the head.
    assert flags["--snapshot"] == (
        f"{cache}/hub/models--{model}/snapshots/0123456789abcdef0123456789abcdef01234567"
    )
    assert (flags["--kv-cache"], flags["--kv-cache-dtype"]) == ("auto", "fp8")
    assert (flags["--tensor-parallel"], flags["--pipeline-parallel"]) == ("2", "1")
    assert flags["--reserve-bytes"] == str(hardware.KV_CACHE_RESERVE_BYTES)
    # The image must take the flag (vLLM 0.10.2 on): checked on the head, where vLLM serves.
    assert "--kv-cache yes" in ev.named("image-spark1-facts").inputs["create"]
    assert "--kv-cache" not in ev.named("image-spark2-facts").inputs["create"]
    # With mp every node's vLLM gets the same bytes (each worker sizes its own GPU's cache).
    for container in ("vllm-container", "vllm-spark2"):
        command = ev.named(container).inputs["command"]
        assert command[command.index("--kv-cache-memory-bytes") + 1] == str(30 * GIB)
    assert ev.outputs["memory"]["kvCache"]["kvCacheBytes"] == 30 * GIB
    # No patterns and no --load-format: none of their flags (existing stacks plan nothing new).
    assert not {"--include", "--exclude", "--load-format"} & set(flags)


def test_kv_cache_sizes_what_the_models_patterns_and_load_format_keep(
    make_config: ConfigFactory,
) -> None:
    """The check sizes the weights the workers hold (the model's include/exclude) as vLLM loads
    them (vllm.extraArgs' --load-format): vllm_weights.py, tests/program/test_vllm_weights.py."""
    config = kv_config(make_config, kvCache="auto", extraArgs=["--load-format=safetensors"])
    config["model"] = {**config["model"], "exclude": ["original/*", "*.gguf"]}
    create = shlex.split(evaluate(config, SECRETS).named("memory-check").inputs["create"])
    flags = {create[i]: create[i + 1] for i in range(len(create) - 1) if create[i].startswith("--")}
    assert flags["--exclude"] == '["original/*", "*.gguf"]'
    assert flags["--load-format"] == "safetensors"
    assert "--include" not in flags


def test_kv_cache_bytes_with_a_fixed_fraction_are_known_in_preview(
    make_config: ConfigFactory,
) -> None:
    """Configured bytes need no measurement to be known (the check still refuses them if they
    do not fit): `pulumi preview` shows the server's whole command."""
    config = kv_config(make_config, kvCache="24GiB", gpuMemoryUtilization=0.8)
    ev = evaluate(config, SECRETS, preview=True)
    command = ev.named("vllm-container").inputs["command"]
    assert command[command.index("--kv-cache-memory-bytes") + 1] == str(24 * GIB)
    assert (
        f"--kv-cache {24 * GIB} "
        in evaluate(config, SECRETS).named("memory-check").inputs["create"]
    )


def test_kv_cache_and_the_flag_in_extra_args_are_refused_together(
    make_config: ConfigFactory,
) -> None:
    config = kv_config(make_config, kvCache="auto", extraArgs=["--kv-cache-memory-bytes=8G"])
    with pytest.raises(ConfigError, match=r"vllm.extraArgs\[0\]: --kv-cache-memory-bytes sizes "):
        parse_stack_config(config)
    # Unset, a user's own flag is theirs (the image check still checks the image has it).
    config = kv_config(make_config, extraArgs=["--kv-cache-memory-bytes", "8G"])
    assert parse_stack_config(config).vllm.kv_cache is None


@pytest.mark.parametrize(
    ("executor", "shm_mb", "head", "worker"),
    [
        # Unset: the floor, per node.
        ("ray", None, 1024, 1024),
        ("mp", None, 1024, 1024),
        # docker.shmSizeMb is what each container is counted to need. Ray: the Ray container
        # on each node and the driver's vLLM container on the head.
        ("ray", 4096, 2 * 4096, 4096),
        # mp: one vLLM container per node (the headless rank on the worker).
        ("mp", 4096, 4096, 4096),
    ],
)  # fmt: skip
def test_preflight_asks_for_the_shm_the_nodes_containers_share(
    make_config: ConfigFactory, executor: str, shm_mb: int | None, head: int, worker: int
) -> None:
    """--ipc=host: the containers share the host's /dev/shm, so a node needs their sum."""
    docker = {"shmSizeMb": shm_mb} if shm_mb else {}
    plan = plan_of(make_config(hosts=2, executor=executor, docker=docker))
    assert preflight_flags(plan, plan.head)["min_shm_bytes"] == head * 1024**2
    assert preflight_flags(plan, plan.workers[0])["min_shm_bytes"] == worker * 1024**2
    # What they may put there, held to what the servers leave of unified memory: with Ray,
    # its object store too, on every node.
    store = plan.config.ray.object_store_memory_bytes if executor == "ray" else 0
    for node, need in ((plan.head, head), (plan.workers[0], worker)):
        assert preflight_flags(plan, node)["shm_use_bytes"] == need * 1024**2 + store
