"""Every configuration problem is one clean error naming the key, before any resource exists."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacks.config import TimeoutsConfig
from tests.cli import CliError
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate, unwrap
from tests.program.planning import error_of


def with_host(config: dict[str, Any], index: int, **changes: Any) -> dict[str, Any]:
    config["hosts"][index].update(changes)
    return config


CASES = [
    ("duplicate name", lambda c: with_host(c, 1, name="spark1"),
     "hosts[1].name: 'spark1' is used by two hosts"),
    ("bad fabric ip", lambda c: with_host(c, 0, fabricIp="10.241.0.300"),
     "hosts[0].fabricIp: Input is not a valid IPv4 address"),
    ("duplicate fabric ip", lambda c: with_host(c, 1, fabricIp="10.241.0.11"),
     "hosts[1].fabricIp: 10.241.0.11 is also spark1's"),
    ("port out of range", lambda c: with_host(c, 0, port=70000),
     "hosts[0].port: Input should be less than or equal to 65535"),
    ("unknown key", lambda c: with_host(c, 0, fabricIf="eth0"),
     "hosts[0].fabricIf: is not a known setting"),
    ("missing user", lambda c: (c["hosts"][0].pop("user"), c)[1],
     "hosts[0].user: is required"),
    ("two heads", lambda c: with_host(with_host(c, 0, head=True), 1, head=True),
     "hosts[1].head: only one host can be the Ray head"),
    ("via unknown", lambda c: with_host(c, 1, via="spark9"),
     "hosts[1].via: 'spark9' is neither a host name"),
    ("via bastion without bastion", lambda c: (c.pop("bastion"), c)[1],
     "hosts[1].via: says 'bastion' but no bastion is configured"),
    # Named as the wrong `via`, not as the address the fabric rule would then see from outside.
    ("via unknown, reached at its fabric ip",
     lambda c: with_host(c, 1, via="spark9", address="10.241.0.12"),
     "hosts[1].via: 'spark9' is neither a host name"),
    ("via bastion without bastion, reached at its fabric ip",
     lambda c: with_host((c.pop("bastion"), c)[1], 1, address="10.241.0.12"),
     "hosts[1].via: says 'bastion' but no bastion is configured"),
    ("via chain", lambda c: with_host(c, 2, via="spark2"),
     "hosts[2].via: spark3 -> spark2 -> bastion is a chain of two jump hosts"),
    ("via itself", lambda c: with_host(c, 1, via="spark2"),
     "hosts[1].via: spark2 cannot be reached through itself"),
    ("tp x pp", lambda c: {**c, "vllm": {"tensorParallelSize": 2}},
     "vllm.tensorParallelSize x vllm.pipelineParallelSize = 2 x 1 = 2, but the hosts declare 3"),
    ("reserved name", lambda c: with_host(c, 2, name="bastion"),
     "hosts[2].name: 'bastion' is reserved"),
    ("bad interface", lambda c: with_host(c, 0, fabricInterface="a-very-long-ifname0"),
     "hosts[0].fabricInterface: String should match pattern"),
    ("relative cache", lambda c: {**c, "model": {**c["model"], "cacheDir": "cache"}},
     "model.cacheDir: must be an absolute path on the hosts"),
    ("bad host key", lambda c: with_host(c, 0, hostKey="AAAA"),
     "hosts[0].hostKey: must look like 'ssh-ed25519 AAAA...'"),
    ("no auth", lambda c: {**c, "ssh": {}},
     "ssh: set exactly one of privateKeyPath or useAgent: true"),
    ("same ports", lambda c: {**c, "vllm": {**c["vllm"], "port": 6379}},
     "ray.port: 6379 is also vllm.port"),
    ("ray port in worker range", lambda c: {**c, "ray": {"nodeManagerPort": 10500}},
     "ray.nodeManagerPort: 10500 is inside ray.minWorkerPort..maxWorkerPort (10002-10999)"),
    ("api key in extra args", lambda c: {**c, "vllm": {**c["vllm"], "extraArgs": ["--api-key=x"]}},
     "vllm.extraArgs[0]: --api-key is managed by spark-vllm; set the apiKey secret instead"),
    ("derived env", lambda c: {**c, "vllm": {**c["vllm"], "env": {"GLOO_SOCKET_IFNAME": "lo"}}},
     "vllm.env.GLOO_SOCKET_IFNAME: is derived per node"),
    ("top-level typo", lambda c: {**c, "vlm": {"port": 1}},
     "vlm: is not a known setting (check the spelling)"),
    ("no hosts", lambda c: {**c, "hosts": []},
     "hosts: List should have at least 1 item"),
    ("bad address", lambda c: with_host(c, 0, address="10.0.0.1; rm -rf /"),
     "hosts[0].address: Value error, '10.0.0.1; rm -rf /' is not a host name or IP address"),
    ("unknown executor", lambda c: {**c, "vllm": {**c["vllm"], "executor": "slurm"}},
     "vllm.executor: Input should be 'ray' or 'mp'"),
    ("mp with mixed gpu counts", lambda c: with_host(with_host(
        {**c, "vllm": {**c["vllm"], "executor": "mp", "tensorParallelSize": 6}}, 0, gpus=3),
        1, gpus=2),
     "hosts[0].gpus: spark1 declares 3 GPU(s), but vllm.executor mp places 2 rank(s) on every "
     "node (6 ranks over 3 hosts); mixed GPU counts need executor ray"),
    ("mp world size that does not divide",
     lambda c: with_host(with_host(
         {**c, "vllm": {**c["vllm"], "executor": "mp", "tensorParallelSize": 5}}, 0, gpus=2),
         1, gpus=2),
     "vllm.executor: mp places world_size / nnodes ranks on every node, and 5 ranks"),
    ("nnodes with ray", lambda c: {**c, "vllm": {**c["vllm"], "extraArgs": ["--nnodes", "3"]}},
     "vllm.extraArgs[0]: --nnodes is for vLLM's multi-node mode without Ray, which vLLM "
     "refuses with the Ray executor; set vllm.executor: mp instead"),
    ("ray flag with mp", lambda c: {**c, "vllm": {
        **c["vllm"], "executor": "mp", "extraArgs": ["--ray-workers-use-nsight"]}},
     "vllm.extraArgs[0]: --ray-workers-use-nsight configures vLLM's Ray executor; "
     "vllm.executor is mp (no Ray)"),
    ("headless is ours", lambda c: {**c, "vllm": {
        **c["vllm"], "executor": "mp", "extraArgs": ["--headless"]}},
     "vllm.extraArgs[0]: --headless is managed by spark-vllm"),
    ("ray env with mp", lambda c: {**c, "vllm": {
        **c["vllm"], "executor": "mp", "env": {"RAY_DEDUP_LOGS": "0"}}},
     "vllm.env.RAY_DEDUP_LOGS: no Ray runs with vllm.executor mp"),
    ("server port among mp's queue ports", lambda c: {**c, "vllm": {
        **c["vllm"], "executor": "mp", "port": 29510}},
     "vllm.port: 29510 is inside the ports vLLM's message queues use (vllm.masterPort + 1 to "
     "+ 32: 29502-29533)"),
    ("master port taken", lambda c: {**c, "vllm": {**c["vllm"], "masterPort": 6379}},
     "ray.port: 6379 is also vllm.masterPort"),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_problem_is_reported_with_its_key(
    make_config: ConfigFactory, mutate: Any, message: str
) -> None:
    text = error_of(mutate(make_config(hosts=3)))
    assert text.startswith("invalid spark-vllm configuration:\n")
    assert message.replace("Value error, ", "") in text
    assert "Traceback" not in text


CLI_REFUSALS = [
    ("hosts as text", lambda c: {**c, "hosts": "spark1"},
     "validating stack config: Stack 'dev' with configuration key 'hosts' must be of type "
     "'array<object>'"),
    ("ssh as a list", lambda c: {**c, "ssh": ["~/.ssh/id_ed25519"]},
     "validating stack config: Stack 'dev' with configuration key 'ssh' must be of type 'object'"),
    ("missing image", lambda c: {k: v for k, v in c.items() if k != "image"},
     "validating stack config: Stack 'dev' is missing configuration value 'image'"),
    ("missing image and model",
     lambda c: {k: v for k, v in c.items() if k not in ("image", "model")},
     "validating stack config: Stack 'dev' is missing configuration values 'image' and 'model'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "message"), [c[1:] for c in CLI_REFUSALS], ids=[c[0] for c in CLI_REFUSALS]
)
def test_what_the_cli_refuses_never_reaches_the_program(
    make_config: ConfigFactory, mutate: Any, message: str
) -> None:
    with pytest.raises(CliError) as caught:
        evaluate(mutate(make_config(hosts=3)), SECRETS)
    assert str(caught.value) == message


def test_several_problems_are_all_listed(make_config: ConfigFactory) -> None:
    config = with_host(make_config(hosts=2), 0, port=0, fabricIp="x")
    text = error_of(config)
    assert "hosts[0].port" in text and "hosts[0].fabricIp" in text


def test_an_unreadable_key_file_is_named(make_config: ConfigFactory) -> None:
    text = error_of({**make_config(hosts=2), "ssh": {"privateKeyPath": "/nonexistent/key"}})
    assert text == (
        "invalid spark-vllm configuration:\n"
        "ssh.privateKeyPath: cannot read /nonexistent/key (No such file or directory)"
    )


def test_agent_auth_needs_a_running_agent(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    text = error_of({**make_config(hosts=2), "ssh": {"useAgent": True}})
    assert "SSH_AUTH_SOCK is not set" in text


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[str]:
    """A socket that accepts connections, as a running ssh-agent's does."""
    path = str(tmp_path / "agent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(8)
        yield path


def test_agent_auth_passes_no_key_and_no_socket_path(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch, agent: str
) -> None:
    """pulumi-command dials SSH_AUTH_SOCK itself: the path, new at every login, stays out of
    the state, so another session's `up` plans nothing."""
    monkeypatch.setenv("SSH_AUTH_SOCK", agent)
    ev = evaluate({**make_config(hosts=2), "ssh": {"useAgent": True}}, SECRETS)
    connection = ev.named("spark2-preflight").inputs["connection"]["value"]
    assert "agentSocketPath" not in connection and "privateKey" not in connection
    assert agent not in json.dumps(unwrap(ev.named("spark2-preflight").inputs))


@pytest.mark.parametrize("use_agent", [True, False])
def test_a_dead_agent_socket_is_refused_once_before_anything(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, use_agent: bool
) -> None:
    """A socket left by an ended session: pulumi-command would dial it on every step, with a
    private key too. A live agent beside a key is fine."""
    dead = tmp_path / "gone.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(dead))  # bound, never listening, then closed: as an agent that died
    monkeypatch.setenv("SSH_AUTH_SOCK", str(dead))
    config = make_config(hosts=2)
    if use_agent:
        config["ssh"] = {"useAgent": True}
    text = error_of(config)
    assert text.startswith(
        f"invalid spark-vllm configuration:\nenvironment: SSH_AUTH_SOCK is {dead}, where no SSH "
        "agent answers ("
    ), text
    assert text.endswith("or run pulumi without it (`env -u SSH_AUTH_SOCK pulumi up`)"), text


def test_unpinned_hosts_get_a_loud_warning(make_config: ConfigFactory) -> None:
    """Only with ssh.allowUnpinned: without it they are refused (test_config_hardening)."""
    config = make_config(hosts=2)
    del config["hosts"][1]["hostKey"]
    del config["bastion"]["hostKey"]
    config["ssh"]["allowUnpinned"] = True
    ev = evaluate(config, SECRETS)
    assert any("NOT pinned for: bastion, spark2" in w for w in ev.warnings)


def test_known_hosts_file_pins_keys(make_config: ConfigFactory, tmp_path) -> None:
    config = make_config(hosts=2)
    for host in config["hosts"]:
        del host["hostKey"]
    del config["bastion"]["hostKey"]
    known = tmp_path / "known_hosts"
    known.write_text(
        "10.240.1.11 ssh-ed25519 AAAAkeyOne\n"
        "10.240.1.12 ssh-ed25519 AAAAkeyTwo\n"
        "[203.0.113.7]:2222 ssh-ed25519 AAAAkeyBastion\n"
    )
    config["ssh"]["knownHostsFile"] = str(known)
    ev = evaluate(config, SECRETS)
    pins = (" is a tag", "is a branch or tag")  # the image's tag, the model's branch
    assert [w for w in ev.warnings if not any(pin in w for pin in pins)] == []  # keys pinned
    connection = ev.named("spark2-preflight").inputs["connection"]["value"]
    assert connection["hostKey"] == "ssh-ed25519 AAAAkeyTwo"
    assert connection["proxy"]["hostKey"] == "ssh-ed25519 AAAAkeyBastion"


def test_a_missing_known_hosts_file_is_named(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    config["ssh"]["knownHostsFile"] = "/nonexistent/known_hosts"
    assert error_of(config) == (
        "invalid spark-vllm configuration:\n"
        "ssh.knownHostsFile: /nonexistent/known_hosts does not exist"
    )


def test_the_production_timeouts_stay_what_the_reference_says() -> None:
    """The lab's fault tests shorten the join timeout to what the lab needs (tests/lab): a user
    who sets nothing still gets these, as the configuration reference lists them."""
    defaults = TimeoutsConfig().model_dump(by_alias=True)
    assert defaults == {
        "rayJoinSeconds": 300,
        "vllmReadySeconds": 1800,
        "vllmExecuteColdSeconds": 1800,
        "vllmExecuteWarmSeconds": 600,
        "vllmProgressSeconds": 30,
        "copyProgressSeconds": 10,
        "copyStallSeconds": 180,
        "imageTransferMinutes": 60,
        "weightsTransferMinutes": 240,
    }
    reference = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    lines = reference.read_text().splitlines()
    for key, value in defaults.items():
        row = next(line for line in lines if line.startswith(f"| `timeouts.{key}` |"))
        assert row.split(" | ")[2] == f"`{value}`", row
