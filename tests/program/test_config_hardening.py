"""Settings that would reach past what the program controls are refused, each as one keyed line:
non-finite numbers, option-like addresses, path-walking model names, ports outside vLLM's range,
flags vLLM would read as ones spark-vllm sets, host directories that hold others' data, and SSH
hosts whose keys nobody pinned. And the fabric key's authorization touches only its own line."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from stacks.config import ConfigError, default_state_dir, parse_stack_config
from stacks.settings import DOCKER_ENVIRONMENT
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate, unwrap

SCRIPTS = Path(__file__).resolve().parents[2] / "components" / "scripts"


def problem(config: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(config)
    return str(caught.value)


def with_setting(config: dict[str, Any], section: str, **values: Any) -> dict[str, Any]:
    config[section] = {**config.get(section, {}), **values}
    return config


# --- numbers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("fabric", "minLinkGbps", float("inf")),
        ("fabric", "minLinkGbps", "inf"),  # YAML's `inf` is text; pydantic would read it as inf
        ("preflight", "minFreeMemoryGib", float("nan")),
        ("preflight", "minFreeMemoryGib", "nan"),
        ("vllm", "gpuMemoryUtilization", float("nan")),
        ("vllm", "gpuMemoryUtilization", "nan"),
    ],
)
def test_a_non_finite_number_is_one_keyed_line(
    make_config: ConfigFactory, section: str, key: str, value: object
) -> None:
    text = problem(with_setting(make_config(hosts=2), section, **{key: value}))
    assert len(text.splitlines()) == 1, text
    assert text.startswith(f"{section}.{key}: "), text


def test_a_fraction_out_of_range_names_what_to_set(make_config: ConfigFactory) -> None:
    text = problem(with_setting(make_config(hosts=2), "vllm", gpuMemoryUtilization=1.5))
    assert text == (
        "vllm.gpuMemoryUtilization: 1.5 is neither a fraction above 0 and at most 0.98 nor auto; "
        "set e.g. 0.8, or auto"
    )


# --- addresses and model names ------------------------------------------------------------------


def test_an_address_ssh_would_read_as_an_option_is_refused(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    config["hosts"][1]["address"] = "-oProxyCommand=x"  # `=` is refused anyway: not a name
    assert "hosts[1].address:" in problem(config)
    config["hosts"][1]["address"] = "-oProxyCommand"
    assert problem(config) == (
        "hosts[1].address: '-oProxyCommand' starts with '-', so ssh would read it as an option; "
        "use the host's name or IP address"
    )
    config = make_config(hosts=2)
    config["bastion"]["address"] = "-J"
    assert problem(config).startswith("bastion.address: '-J' starts with '-'")


@pytest.mark.parametrize(
    ("key", "value", "what"),
    [
        ("id", "../model", "has a '.' or '..' part"),
        ("id", "org/..", "has a '.' or '..' part"),
        ("id", "./model", "has a '.' or '..' part"),
        ("revision", "../../etc", "has a '.' or '..' part"),
        ("revision", "refs/../../x", "has a '.' or '..' part"),
        ("revision", "/etc", "starts with '/'"),
        ("revision", "a//b", "has an empty part"),
        ("revision", "main/", "has an empty part"),
    ],
)
def test_a_model_name_that_walks_the_filesystem_is_refused(
    make_config: ConfigFactory, key: str, value: str, what: str
) -> None:
    text = problem(with_setting(make_config(hosts=2), "model", **{key: value}))
    assert text.startswith(f"model.{key}: {value!r} {what}"), text
    assert "as the Hugging Face Hub shows it" in text


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "a" * 40, "release/2.x"])
def test_plain_revisions_pass(make_config: ConfigFactory, revision: str) -> None:
    config = parse_stack_config(with_setting(make_config(hosts=2), "model", revision=revision))
    assert config.model.revision == revision


# --- ports --------------------------------------------------------------------------------------


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_vllms_own_ports_must_end_below_65536(make_config: ConfigFactory, executor: str) -> None:
    config = with_setting(make_config(hosts=2), "vllm", executor=executor, masterPort=65504)
    assert problem(config) == (
        "vllm.masterPort: 65504 puts vLLM's own ports (vllm.masterPort + 1 to + 32: 65505-65536) "
        "past 65535; use a masterPort of at most 65503"
    )
    config["vllm"]["masterPort"] = 65503
    assert parse_stack_config(config).vllm.master_port == 65503


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_the_server_port_stays_out_of_vllms_own_ports(
    make_config: ConfigFactory, executor: str
) -> None:
    config = with_setting(make_config(hosts=2), "vllm", executor=executor, port=29533)
    assert problem(config) == (
        "vllm.port: 29533 is inside the ports vLLM's message queues use (vllm.masterPort + 1 to "
        "+ 32: 29502-29533); use another port, or move vllm.masterPort"
    )


def test_rays_ports_stay_out_of_vllms_own_ports(make_config: ConfigFactory) -> None:
    config = with_setting(make_config(hosts=2), "vllm", masterPort=6370)
    assert problem(config).startswith(
        "ray.port: 6379 is inside the ports vLLM's message queues use "
        "(vllm.masterPort + 1 to + 32: 6371-6402)"
    )
    config = with_setting(make_config(hosts=2), "vllm", masterPort=10990)
    assert problem(config).startswith(
        "vllm.masterPort: vLLM's own ports (vllm.masterPort + 1 to + 32: 10991-11022) overlap "
        "ray.minWorkerPort..maxWorkerPort (10002-10999)"
    )


# --- vLLM flags ---------------------------------------------------------------------------------

REFUSED_FLAGS = [
    (["--api_key", "x"], "--api_key (vLLM reads it as --api-key) is managed by spark-vllm; "
     "set the apiKey secret instead"),
    (["--api_key=x"], "--api_key (vLLM reads it as --api-key) is managed"),
    (["--api-k=x"], "--api-k (vLLM reads it as --api-key) is managed"),
    (["--api-key.x", "y"], "--api-key.x (vLLM reads it as --api-key) is managed"),
    (["--served_model_name", "m"], "--served_model_name (vLLM reads it as --served-model-name)"),
    (["--tensor_parallel_size=4"], "(vLLM reads it as --tensor-parallel-size) is managed"),
    (["--host=0.0.0.0"], "--host is managed by spark-vllm"),
    (["-tp=2"], "-tp is managed by spark-vllm"),
    (["-t", "2"], "-t (vLLM reads it as -tp) is managed"),
    (["-t=2"], "-t (vLLM reads it as -tp) is managed"),  # Python 3.12's argparse reads it so
    (["-pp=2"], "-pp is managed"),
    (["--node_rank", "1"], "--node_rank (vLLM reads it as --node-rank) is for vLLM's multi-node "
     "mode without Ray"),
    (["-n2"], "-n2 (vLLM reads it as -n) is for vLLM's multi-node mode without Ray"),
    (["-r=1"], "-r is for vLLM's multi-node mode without Ray"),
    (["--config", "serve.yaml"], "--config makes vLLM read more arguments from a YAML file on the "
     "head, where any flag spark-vllm sets (--api-key, --port, ...) could be set past these "
     "checks; write the flags in vllm.extraArgs instead"),
    (["--config=serve.yaml"], "--config makes vLLM read more arguments from a YAML file"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), REFUSED_FLAGS, ids=[a[0] for a, _ in REFUSED_FLAGS])
def test_flags_vllm_reads_as_owned_ones_are_refused(
    make_config: ConfigFactory, args: list[str], message: str
) -> None:
    config = with_setting(make_config(hosts=2), "vllm", extraArgs=["--enforce-eager", *args])
    text = problem(config)
    assert text.startswith("vllm.extraArgs[1]: "), text
    assert message in text, text


def test_folded_flags_meet_the_executors_rules_too(make_config: ConfigFactory) -> None:
    mp = with_setting(make_config(hosts=2), "vllm", executor="mp")
    with_setting(mp, "vllm", extraArgs=["--ray_workers_use_nsight"])
    assert problem(mp).startswith(
        "vllm.extraArgs[0]: --ray-workers-use-nsight configures vLLM's Ray executor"
    )
    with_setting(mp, "vllm", extraArgs=["--head"])
    assert problem(mp).startswith(
        "vllm.extraArgs[0]: --head (vLLM reads it as --headless) is managed by spark-vllm"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--kv-cache-dtype=fp8", "--enable_prefix_caching"],
        ["--max-num-seqs", "8", "-q", "fp8", "-O3"],
        ["-tp2"],  # not an option argparse knows (a multi-letter short one takes no attached value)
        ["--compilation-config.cudagraph_mode", "FULL"],
        ["--override-generation-config", "-1"],
    ],
)
def test_other_flags_pass(make_config: ConfigFactory, args: list[str]) -> None:
    config = parse_stack_config(with_setting(make_config(hosts=2), "vllm", extraArgs=args))
    assert config.vllm.extra_args == args


# --- host directories ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("/", "/ is a directory other data lives in as well"),
        ("/etc", "/etc is a system directory"),
        ("/etc/spark", "/etc/spark is under /etc, a system directory"),
        ("/usr/local/share/hf", "is under /usr, a system directory"),
        ("/var/lib/docker/volumes/x", "is under /var/lib/docker, a system directory"),
        ("/run/user/1000", "is under /run, a system directory"),
        ("/proc/self", "is under /proc"),
        ("/home", "/home is a directory other data lives in as well"),
        ("/home/aurora", "/home/aurora is a directory other data lives in as well"),
        ("/home/aurora/", "/home/aurora is a directory other data lives in as well"),
        ("/root", "/root is a directory other data lives in as well"),
        ("/root/.ssh", "is where SSH keeps authorized_keys"),
        ("/var", "/var is a directory"),
        ("/opt//", "/opt is a directory"),
        ("/srv/./hf", "'/srv/./hf' has a '.' or '..' part"),
        ("/srv/hf/../../etc", "has a '.' or '..' part"),
    ],
)
def test_host_directories_that_hold_others_data_are_refused(
    make_config: ConfigFactory, path: str, what: str
) -> None:
    cache = problem(with_setting(make_config(hosts=2), "model", cacheDir=path))
    assert cache.startswith("model.cacheDir: ") and what in cache, cache
    config = make_config(hosts=2)
    config["hosts"][1]["stateDir"] = path
    state = problem(config)
    assert state.startswith("hosts[1].stateDir: ") and what in state, state
    if "'.'" not in what:  # each says what to use instead
        assert "/.cache/huggingface" in cache and "/srv/spark-vllm" in state


# Where every local user may create a name (mode 1777): whoever makes the directory first owns
# it. Each row says why it is listed.
@pytest.mark.parametrize(
    ("path", "tree"),
    [
        ("/tmp", "/tmp"),  # the tree itself
        ("/tmp/spark-vllm", "/tmp"),  # the example: made first by anyone
        ("/tmp/a/b/c", "/tmp"),  # however deep
        ("//tmp//x/", "/tmp"),  # normalized first: the hosts would use /tmp/x
        ("/var/tmp/hf", "/var/tmp"),  # survives reboots, 1777 as /tmp
        ("/dev/shm/state", "/dev/shm"),  # named for itself, not as "under /dev"
        ("/var/crash/x", "/var/crash"),  # 1777 on Ubuntu
    ],
)
def test_directories_under_a_world_writable_tree_are_refused(
    make_config: ConfigFactory, path: str, tree: str
) -> None:
    why = f"is under {tree}, which every local user may write: another user who makes the"
    cache = problem(with_setting(make_config(hosts=2), "model", cacheDir=path))
    assert cache.startswith("model.cacheDir: ") and why in cache, cache
    assert "use a directory of its own, e.g. /home/<user>/.cache/huggingface" in cache, cache
    config = make_config(hosts=2)
    config["hosts"][1]["stateDir"] = path
    state = problem(config)
    assert state.startswith("hosts[1].stateDir: ") and why in state, state
    assert "or no stateDir (~/.spark-vllm)" in state, state


@pytest.mark.parametrize(
    "path",
    [
        "/tmpfoo/x",  # a name that starts like /tmp is not under it
        "/srv/tmp/hf",  # a tmp of one's own below a safe tree
        "/home/aurora/tmp/spark-vllm",
        "/var/lib/spark-vllm",
    ],
)
def test_directories_that_only_look_like_a_world_writable_tree_pass(
    make_config: ConfigFactory, path: str
) -> None:
    config = make_config(hosts=2)
    config["hosts"][1]["stateDir"] = path
    assert parse_stack_config(config).hosts[1].state_dir == path


def test_host_directories_are_normalized(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    config["hosts"][0]["stateDir"] = "//srv//spark-vllm/"
    config["model"]["cacheDir"] = "/srv/hf/"
    parsed = parse_stack_config(config)
    assert (parsed.hosts[0].state_dir, parsed.model.cache_dir) == ("/srv/spark-vllm", "/srv/hf")


def test_the_default_state_dir_is_in_the_users_home() -> None:
    assert default_state_dir("root") == "/root/.spark-vllm"
    assert default_state_dir("aurora") == "/home/aurora/.spark-vllm"


def test_the_cache_and_a_state_dir_must_not_hold_one_another(make_config: ConfigFactory) -> None:
    config = with_setting(make_config(hosts=2), "model", cacheDir="/home/aurora/.spark-vllm/hf")
    assert problem(config) == (
        "model.cacheDir: /home/aurora/.spark-vllm/hf overlaps spark1's state directory "
        "/home/aurora/.spark-vllm (the default for user aurora, as hosts[0].stateDir is not set); "
        "use another cacheDir, e.g. /home/<user>/.cache/huggingface, or set hosts[].stateDir "
        "apart from it"
    )
    for state in ("/srv/hf", "/srv/hf/state"):
        config = with_setting(make_config(hosts=2), "model", cacheDir="/srv/hf")
        config["hosts"][1]["stateDir"] = state
        assert problem(config).startswith(
            f"hosts[1].stateDir: {state} and model.cacheDir /srv/hf overlap (one is inside the "
            "other)"
        )
    config = with_setting(make_config(hosts=2), "model", cacheDir="/srv/hf/models")
    config["hosts"][1]["stateDir"] = "/srv/hf"
    assert problem(config).startswith("hosts[1].stateDir: /srv/hf and model.cacheDir")
    config["hosts"][1]["stateDir"] = "/srv/hf-state"  # a sibling sharing a prefix is apart
    parse_stack_config(config)


# --- unpinned hosts -----------------------------------------------------------------------------


def unpinned(make_config: ConfigFactory) -> dict[str, Any]:
    config = make_config(hosts=2)
    del config["hosts"][1]["hostKey"]
    del config["bastion"]["hostKey"]
    return config


def test_unpinned_hosts_are_refused_by_default(make_config: ConfigFactory) -> None:
    with pytest.raises(Exception) as caught:
        evaluate(unpinned(make_config), SECRETS)
    assert type(caught.value).__name__ == "RunError", repr(caught.value)
    assert str(caught.value) == (
        "invalid spark-vllm configuration:\n"
        "bastion.hostKey, hosts[1].hostKey: the SSH host keys of bastion, spark2 are not pinned "
        "(no hostKey), so anyone on the path could impersonate these hosts and receive the "
        "secrets and commands meant for them. Pin them: set hosts[].hostKey / bastion.hostKey "
        "(a line of the host's /etc/ssh/ssh_host_ed25519_key.pub), or ssh.knownHostsFile to a "
        "file that lists them; or set ssh.allowUnpinned: true to accept any key they present, "
        "with a warning on every run"
    )


def test_a_known_hosts_file_without_the_host_is_named(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = unpinned(make_config)
    known = tmp_path / "known_hosts"
    known.write_text("[203.0.113.7]:2222 ssh-ed25519 AAAAkeyBastion\n")
    config["ssh"]["knownHostsFile"] = str(known)
    with pytest.raises(Exception) as caught:
        evaluate(config, SECRETS)
    assert str(caught.value).startswith(
        "invalid spark-vllm configuration:\nhosts[1].hostKey: the SSH host keys of spark2 are "
        f"not pinned (no hostKey, and not in ssh.knownHostsFile {known}), "
    )


def test_allow_unpinned_deploys_with_a_loud_warning(make_config: ConfigFactory) -> None:
    config = unpinned(make_config)
    config["ssh"]["allowUnpinned"] = True
    ev = evaluate(config, SECRETS)
    assert any("NOT pinned for: bastion, spark2 (ssh.allowUnpinned: true)" in w
               for w in ev.warnings), ev.warnings  # fmt: skip
    assert ev.named("spark2-preflight")


# --- authorize-key.sh ---------------------------------------------------------------------------

OTHERS = "ssh-ed25519 AAAAoperator operator@laptop\nssh-rsa AAAAbackup backup@vault\n"
SPARK1 = "spark-vllm-fabric:spark-vllm/dev:spark1"
SPARK10 = "spark-vllm-fabric:spark-vllm/dev:spark10"


def authorize(
    home: Path, action: str, marker: str, key: str = "", sources: str = "10.0.0.1"
) -> subprocess.CompletedProcess:
    command = ["bash", str(SCRIPTS / "authorize-key.sh"), action, "--host", "w", "--marker", marker]
    only_from = ["--from", sources] if action == "add" else []
    return subprocess.run(
        [*command, *only_from],
        input=key,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(home)},
        check=False,
    )


def test_revoking_a_key_keeps_every_other_line(tmp_path: Path) -> None:
    auth = tmp_path / ".ssh" / "authorized_keys"
    auth.parent.mkdir()
    auth.write_text(OTHERS)
    head10, head1 = f"ssh-ed25519 AAAAhead10 {SPARK10}", f"ssh-ed25519 AAAAhead1 {SPARK1}"
    for marker, key in ((SPARK10, head10), (SPARK1, head1), (SPARK1, head1)):
        done = authorize(tmp_path, "add", marker, key + "\n")  # adding twice leaves one line
        assert done.returncode == 0, done.stderr
    only = 'from="10.0.0.1"'
    assert auth.read_text() == f"{OTHERS}{only} {head10}\n{only} {head1}\n"
    done = authorize(tmp_path, "remove", SPARK1)
    assert done.returncode == 0, done.stderr
    assert auth.read_text() == f"{OTHERS}{only} {head10}\n"
    assert oct(auth.stat().st_mode & 0o777) == "0o600"
    leftovers = sorted(p.name for p in auth.parent.iterdir())
    assert leftovers == [".spark-vllm.lock", "authorized_keys"]  # no temp file left behind


def test_a_marker_inside_another_comment_is_not_a_match(tmp_path: Path) -> None:
    auth = tmp_path / ".ssh" / "authorized_keys"
    auth.parent.mkdir()
    auth.write_text(f"ssh-ed25519 AAAAx {SPARK1}-old\nssh-ed25519 AAAAy note:{SPARK1}\n")
    assert authorize(tmp_path, "remove", SPARK1).returncode == 0
    assert auth.read_text() == f"ssh-ed25519 AAAAx {SPARK1}-old\nssh-ed25519 AAAAy note:{SPARK1}\n"
    done = authorize(tmp_path, "add", SPARK1, f"ssh-ed25519 AAAAz {SPARK10}\n")
    assert done.returncode == 1
    assert "the key to authorize lacks the marker" in done.stderr


def test_a_held_lock_is_waited_for_not_ignored(tmp_path: Path) -> None:
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "authorized_keys").write_text(OTHERS)
    holder = subprocess.Popen(
        ["flock", str(ssh / ".spark-vllm.lock"), "sleep", "1.5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)  # the holder has the lock
        started = time.monotonic()
        done = authorize(tmp_path, "add", SPARK1, f"ssh-ed25519 AAAAh {SPARK1}\n")
        waited = time.monotonic() - started
    finally:
        holder.wait(timeout=10)
    assert done.returncode == 0, done.stderr
    assert waited >= 0.8, waited
    assert (ssh / "authorized_keys").read_text() == (
        f'{OTHERS}from="10.0.0.1" ssh-ed25519 AAAAh {SPARK1}\n'
    )


def test_the_head_key_is_authorized_from_the_fabric_alone(tmp_path: Path) -> None:
    """An older release's line (no `from=`) is replaced, not kept beside the new one; a second
    add with other addresses replaces the first."""
    auth = tmp_path / ".ssh" / "authorized_keys"
    auth.parent.mkdir()
    auth.write_text(f"{OTHERS}ssh-ed25519 AAAAold {SPARK1}\n")
    key = f"ssh-ed25519 AAAAh {SPARK1}\n"
    for sources in ("10.0.0.1,10.0.0.3", "10.0.0.1,10.0.0.3", "10.0.0.1"):
        done = authorize(tmp_path, "add", SPARK1, key, sources)
        assert done.returncode == 0, done.stderr
        assert auth.read_text() == f'{OTHERS}from="{sources}" ssh-ed25519 AAAAh {SPARK1}\n'


@pytest.mark.parametrize(
    "sources",
    [
        '10.0.0.1" command="sh',  # a quote would end the option and let the line say more
        "10.0.0.1 10.0.0.2",
        "",
        "10.0.0.*",  # a pattern, not the addresses the plan names
    ],
)
def test_addresses_to_authorize_from_are_addresses(tmp_path: Path, sources: str) -> None:
    auth = tmp_path / ".ssh" / "authorized_keys"
    auth.parent.mkdir()
    auth.write_text(OTHERS)
    done = authorize(tmp_path, "add", SPARK1, f"ssh-ed25519 AAAAh {SPARK1}\n", sources)
    assert done.returncode == 1
    assert "the addresses to authorize the key from are not IPv4 addresses" in done.stderr
    assert auth.read_text() == OTHERS


# --- what the firewall could turn against the user (issue 36) -----------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # A guarded single port on SSH's.
        (("monitoring", {"nodeExporter": {"port": 22}}),
         "monitoring.nodeExporter.port: 22 is SSH's own port 22"),
        (("ray", {"port": 2222}), "ray.port: 2222 is bastion.port (the bastion's SSH)"),
        # A guarded range over SSH's: vLLM's queues (masterPort 1: 2-33), Ray's worker ports.
        (("vllm", {"masterPort": 1}),
         "vllm.masterPort: vLLM's message queues (vllm.masterPort + 1 to + 32) cover 2-33, "
         "which holds SSH's own port 22 (22)"),
        (("hosts", 10022),
         "ray.minWorkerPort: Ray's worker ports (ray.minWorkerPort..maxWorkerPort) cover "
         "10002-10999, which holds hosts[1].port (spark2's SSH) (10022)"),
        (("ray", {"minWorkerPort": 2000, "maxWorkerPort": 2300}),
         "ray.minWorkerPort: Ray's worker ports (ray.minWorkerPort..maxWorkerPort) cover "
         "2000-2300, which holds bastion.port (the bastion's SSH) (2222)"),
    ],
)  # fmt: skip
def test_no_guarded_port_or_range_covers_an_ssh_port(
    make_config: ConfigFactory, change: tuple[str, Any], expected: str
) -> None:
    """The guard drops its ports on every host's management side and comes back at boot: SSH
    inside them would be cut for good. Each is refused, keyed, naming whose SSH it is."""
    config = make_config(hosts=2)
    section, value = change
    if section == "hosts":
        config["hosts"][1]["port"] = value
    else:
        with_setting(config, section, **value)
    text = problem(config)
    assert text.startswith(expected), text
    assert "cutting SSH for good" in text


def test_ssh_ports_outside_every_guarded_range_pass(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    config["hosts"][1]["port"] = 11022  # past Ray's worker ports
    parse_stack_config(config)


@pytest.mark.parametrize(
    ("arg", "opens"),
    [
        ("--kv-events-config", "tcp://*:5557"),
        ('--kv_events_config={"publisher": "zmq"}', "tcp://*:5557"),
        ("--kv-events-config.endpoint=tcp://*:6000", "tcp://*:5557"),
        ("--kv-transfer-config", "side channel"),
        ("-dp=2", "data parallelism"),
        ("--data-parallel-address", "data parallelism"),
        ("--data-parallel-rpc-port=29550", "data parallelism"),
        ("--grpc", "gRPC"),
        ("--enable-elastic-ep", "TCPStore"),
    ],
)
def test_extra_args_that_open_a_listener_are_refused(
    make_config: ConfigFactory, arg: str, opens: str
) -> None:
    config = make_config(hosts=2)
    config["vllm"]["extraArgs"] = ["--max-num-seqs", "8", arg]
    text = problem(config)
    assert text.startswith(f"vllm.extraArgs[2]: {arg.split('=')[0]} "), text
    assert opens in text and "firewall cannot know what it opens" in text, text


@pytest.mark.parametrize(
    "name", ["VLLM_SERVER_DEV_MODE", "NCCL_COMM_ID", "VLLM_NIXL_SIDE_CHANNEL_HOST", "MASTER_PORT"]
)
def test_env_that_opens_a_listener_or_keyless_routes_is_refused(
    make_config: ConfigFactory, name: str
) -> None:
    config = make_config(hosts=2)
    config["vllm"]["env"] = {"VLLM_LOGGING_LEVEL": "DEBUG", name: "1"}
    text = problem(config)
    assert text.startswith(f"vllm.env.{name}: "), text
    assert "firewall cannot know what it opens" in text


def test_a_fabric_that_is_the_management_network_is_refused_unless_said(
    make_config: ConfigFactory,
) -> None:
    config = make_config(hosts=2)
    config["hosts"][1]["address"] = config["hosts"][1]["fabricIp"]  # through the bastion
    text = problem(config)
    assert text.startswith("hosts[1].address: 10.241.0.12 is spark2's fabricIp"), text
    assert "fabric.sharedWithManagement: true" in text
    # Through another host (the seeds' jump topology) SSH arrives over the fabric: fine.
    config["hosts"][1]["via"] = "spark1"
    parse_stack_config(config)
    # Said: accepted (the program warns, loudly: test_the_shared_fabric_warns).
    config["hosts"][1]["via"] = "bastion"
    config["fabric"] = {"sharedWithManagement": True}
    parse_stack_config(config)


def test_the_shared_fabric_warns(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    config["fabric"] = {"sharedWithManagement": True}
    evaluation = evaluate(config, SECRETS)
    assert any("fabric.sharedWithManagement is true" in w for w in evaluation.warnings)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("short-key-0123", "apiKey: is 14 characters long; use at least 24"),
        ("0123456789abcdef01234567,other", "apiKey: must be one word"),
        ("0123456789abcdef01234567\r", "apiKey: must be one word"),
        ("0123456789abcdef 01234567", "apiKey: must be one word"),
    ],
)
def test_the_api_key_is_one_long_bearer_token(
    make_config: ConfigFactory, key: str, expected: str
) -> None:
    """The front matches the whole `Bearer <key>` line and the key file holds one line: a comma,
    a space or a CR changes what is matched; a short key can be guessed."""
    with pytest.raises(Exception) as caught:
        evaluate(make_config(hosts=2), {**SECRETS, "apiKey": key})
    assert expected in str(caught.value)
    assert key not in str(caught.value)  # a secret, never quoted back


# --- RSA host keys (pulumi-command offers only ssh-rsa for them, which OpenSSH 8.8+ refuses) ---

RSA_LINE = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQDrsa"


def test_a_known_hosts_file_with_rsa_first_pins_the_ed25519_key(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    """After `ssh-keyscan` a host's RSA line often comes first: the ed25519 one is pinned."""
    config = unpinned(make_config)
    known = tmp_path / "known_hosts"
    address = config["hosts"][1]["address"]
    known.write_text(
        f"{address} {RSA_LINE}\n{address} ecdsa-sha2-nistp256 AAAAecdsa\n"
        f"{address} ssh-ed25519 AAAAed25519\n"
        f"[203.0.113.7]:2222 {RSA_LINE}\n[203.0.113.7]:2222 ecdsa-sha2-nistp256 AAAAbastion\n"
    )
    config["ssh"]["knownHostsFile"] = str(known)
    ev = evaluate(config, SECRETS)
    connection = unwrap(ev.named("spark2-preflight").inputs["connection"])
    assert connection["hostKey"] == "ssh-ed25519 AAAAed25519"
    assert connection["proxy"]["hostKey"] == "ecdsa-sha2-nistp256 AAAAbastion"


def test_an_rsa_only_host_is_refused_naming_the_file_and_the_fix(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = unpinned(make_config)
    known = tmp_path / "known_hosts"
    address = config["hosts"][1]["address"]
    known.write_text(f"{address} {RSA_LINE}\n[203.0.113.7]:2222 ssh-ed25519 AAAAbastion\n")
    config["ssh"]["knownHostsFile"] = str(known)
    with pytest.raises(Exception) as caught:
        evaluate(config, SECRETS)
    assert str(caught.value) == (
        "invalid spark-vllm configuration:\n"
        f"ssh.knownHostsFile: {known} lists only an RSA key (ssh-rsa) for spark2 ({address}): "
        "pulumi-command offers the server only ssh-rsa (SHA-1) as host-key algorithm for an "
        "RSA pin, which OpenSSH 8.8 and later refuse ('no common algorithm for host key'), so "
        "every step would fail. Add its ed25519 or ECDSA key: "
        f"`ssh-keyscan -t ed25519,ecdsa -p 22 {address} >> {known}` (or set hosts[1].hostKey)"
    )


def test_an_rsa_host_key_setting_is_refused_with_its_key(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    config["hosts"][1]["hostKey"] = RSA_LINE
    with pytest.raises(Exception) as caught:
        evaluate(config, SECRETS)
    message = str(caught.value)
    assert message.startswith(
        "invalid spark-vllm configuration:\nhosts[1].hostKey: spark2's pinned key is RSA "
        "(ssh-rsa): pulumi-command offers the server only ssh-rsa (SHA-1)"
    ), message
    assert message.endswith(
        f"Pin its ed25519 or ECDSA key instead (`ssh-keyscan -t ed25519,ecdsa -p 22 "
        f"{config['hosts'][1]['address']}`)"
    ), message


@pytest.mark.parametrize("word", ["", "   "])
def test_an_empty_word_in_extra_args_is_refused_with_its_key(
    make_config: ConfigFactory, word: str
) -> None:
    """pulumi-docker refuses a container command with an empty value, after every step before
    it ran: refused here, before anything, naming the item."""
    config = make_config(hosts=2)
    config["vllm"]["extraArgs"] = ["--max-num-seqs", "8", word]
    assert problem(config) == (
        "vllm.extraArgs[2]: an empty word: each item is one argument of `vllm serve` (the "
        "container's command refuses an empty one); remove it"
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("DOCKER_CONTEXT", "would send every container to that context's daemon"),
        ("DOCKER_CERT_PATH", "would dial each host's ssh:// daemon with TLS"),
        ("DOCKER_TLS_VERIFY", "would dial each host's ssh:// daemon with TLS"),
    ],
)
def test_a_docker_variable_in_the_environment_is_refused_before_anything(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch, name: str, why: str
) -> None:
    """The Docker provider inherits pulumi's environment and reads these over its `host`."""
    monkeypatch.setenv(name, "elsewhere")
    with pytest.raises(Exception) as caught:
        evaluate(make_config(hosts=2), SECRETS)
    assert str(caught.value) == (
        f"invalid spark-vllm configuration:\nenvironment: {name} is set: "
        f"{DOCKER_ENVIRONMENT[name]}; run pulumi without it (`env -u {name} pulumi up`)"
    )
    assert why in DOCKER_ENVIRONMENT[name]
    monkeypatch.setenv(name, "")  # empty: the provider's default, accepted
    assert evaluate(make_config(hosts=2), SECRETS).named("spark1-preflight")
