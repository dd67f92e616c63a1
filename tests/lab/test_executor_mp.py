"""vllm.executor mp on the lab, for real, driven by the real Pulumi CLI and engine as the README's
lab flow runs them (tests/lab/cli_stack.py): one vLLM container per node and no Ray, through
the bastion; the lifecycle Pulumi's own ProgramTest runs (preview and refresh expect no changes
on the untouched deployment); a worker rank killed; a worker that cannot reach the rendezvous;
a switch of executors on the running stack, both ways, each preview checked against the Day two
table; a refresh that repairs drift; and a destroy (the stand-in implements vLLM's mp mode: a
rendezvous at the master port, each node checking its own ranks, README of the stand-in)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lab import Lab
from lab.stack import PROJECT
from tests.lab import attacker
from tests.lab.cli_stack import (
    CliStack,
    changes,
    cli_deployed,
    cli_next_up,
    counts,
    documented_counts,
    init_stack,
    outputs_by_name,
    plain_settings,
)
from tests.lab.deploying import (
    API_KEY,
    PREFIX,
    STATE,
    complete,
    default_lab_config,
    host_sh,
    lab_config,
)
from tests.lab.faulting import JOIN_FAULT_SECONDS, wait_for
from tests.lab.realcli import PLUGINS, REPO, PulumiFailed, RealPulumi, pulumi_binary
from tests.lab.timings import record_figure, record_timing
from tests.program.previews import up_then_preview

Stack = CliStack

pytestmark = pytest.mark.lab

WORKER = "spark2"
MASTER_PORT = 29501


def mp_config(lab: Lab, **timeouts: int) -> dict[str, Any]:
    """The lab stack as committed: vllm.executor unset, so mp, the default."""
    config = default_lab_config(lab)
    assert "executor" not in config[f"{PROJECT}:vllm"] and f"{PROJECT}:ray" not in config
    if timeouts:
        config[f"{PROJECT}:timeouts"] = {**config[f"{PROJECT}:timeouts"], **timeouts}
    return config


@pytest.fixture(scope="module")
def stack(
    lab_factory: Callable[..., Lab], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    lab = lab_factory("mp", hosts=2, topology="bastion")
    started = time.monotonic()
    with cli_deployed(lab, mp_config(lab), tmp_path_factory.mktemp("cli")) as stack:
        record_timing("e2e first up, real CLI (bastion, 2 hosts, executor mp)",
                      time.monotonic() - started)  # fmt: skip
        yield stack
    lab.down()


def model_plan(before: dict[str, Any], after: dict[str, Any]) -> dict[str, str]:
    """What our model of the engine (tests/engine, through the program tests' harness) plans
    for `after` on a stack deployed from `before`: every resource that is not "same"."""
    plain = [
        {key.split(":", 1)[1]: value for key, value in config.items() if "apiKey" not in key}
        for config in (before, after)
    ]
    planned, deleted = up_then_preview(*plain)
    return {**planned, **dict.fromkeys(deleted, "delete")}


def server_answers(lab: Lab) -> bool:
    """A real completion from inside the head, with the stack's API key."""
    probe = (f"printf '%s\\n' {API_KEY} | timeout 20 docker exec -i {PREFIX}-vllm "
             "python3 /spark-vllm/bin/vllm_probe.py 8000 tiny-chat 2>&1 | tail -n 1")  # fmt: skip
    return host_sh(lab, "spark1", f"{probe} || true").startswith("ready")


def restarts(lab: Lab, host: str) -> int:
    script = f"docker inspect --format '{{{{.RestartCount}}}}' {PREFIX}-vllm"
    return int(host_sh(lab, host, script))


def test_every_node_serves_the_model_without_ray(stack: Stack) -> None:
    lab, outputs = stack.lab, stack.outputs
    assert outputs["executor"] == "mp" and "ready after" in outputs["readiness"]
    status, reply = complete(stack.endpoint, outputs["modelId"])
    assert status == 200
    # The stand-in's text names every rank's node: both took part.
    fabric = [lab.spec.host_fabric_ip(i) for i in range(2)]
    assert reply["choices"][0]["text"].startswith(f"ranks={','.join(fabric)} "), reply
    worker = ["docker-filter", "firewall", "memory-guard"]
    head = [*worker, "front"]
    for host, others in (("spark1", head), (WORKER, worker)):
        running = host_sh(lab, host, "docker ps --format '{{.Names}}' | sort").split()
        assert running == sorted(f"{PREFIX}-{name}" for name in [*others, "vllm"]), running
        assert host_sh(lab, host, "pgrep -x 'raylet|gcs_server' || true") == "", host
    worker_log = host_sh(lab, WORKER, f"docker logs {PREFIX}-vllm 2>&1")
    assert "headless multiproc executor" in worker_log
    assert f"joined the rendezvous at {fabric[0]}:{MASTER_PORT}" in worker_log
    # The supervisor says so on its next look after the server answers (it polls each second,
    # and the readiness probe through the front can answer first): wait for it, bounded.
    wait_for(
        lambda: (
            "every node joined the rendezvous"
            in host_sh(lab, "spark1", f"docker logs {PREFIX}-vllm 2>&1")
        ),
        30,
        "the head's supervisor reports every node in the rendezvous",
    )
    # The rendezvous (torch's TCPStore, on [::]) and vLLM's own ports are on the fabric only:
    # the firewall drops them on the mgmt network, IPv4 and IPv6.
    hosts = ("spark1", WORKER)
    probed = attacker.assert_the_lan_reaches_only_ssh_and_the_endpoint(lab, hosts, 8000)
    assert MASTER_PORT in probed["spark1"], probed
    # One dual-stack socket (`*` in ss: [::] with IPV6_V6ONLY off), as torch's TCPStore binds.
    assert f"*:{MASTER_PORT}" in host_sh(lab, "spark1", f"ss -Hltn 'sport = :{MASTER_PORT}'")


def test_the_pinned_cli_ran_it_with_the_labs_plugins(stack: Stack) -> None:
    """The engine is the real one at the pinned version; the language host and the providers
    the proxy does not serve are the lab's, and the engine says so (an ambient plugin)."""
    version = subprocess.run([pulumi_binary(), "version"], capture_output=True, text=True)
    pinned = (REPO / "scripts/pulumi-build/modules.tsv").read_text()
    assert f"github.com/pulumi/pulumi/pkg/v3@{version.stdout.strip()}\t" in pinned, version
    first_up = next(run for run in stack.cli.runs if run.args[0] == "up")
    for plugin in ("pulumi-language-python", "pulumi-resource-command", "pulumi-resource-docker"):
        assert f"using {plugin} from $PATH at {PLUGINS}/{plugin}" in first_up.output, plugin


def test_the_untouched_deployment_previews_and_refreshes_with_no_changes(stack: Stack) -> None:
    """ProgramTest's lifecycle (pulumi/pulumi pkg/testing/integration): after `up`, a preview
    and a refresh that expect no changes; then what a user pays on every run, the share spent
    reading facts over SSH included."""
    cli = stack.cli
    preview = cli.run("preview", "--expect-no-changes")
    cli.run("refresh", "--yes", "--skip-preview", "--expect-no-changes")
    noop = cli.run("up", "--yes", "--skip-preview", "--expect-no-changes")
    assert "unchanged" in noop.output and "created" not in noop.output, noop.output[-2000:]
    record_figure(
        "real CLI on the untouched lab stack (2 hosts, mp): what every run costs",
        "; ".join(
            f"{name} {run.seconds:.1f} s ({cli.facts_seconds(run) / run.seconds:.0%} reading "
            "facts over SSH)"
            for name, run in (("preview", preview), ("no-op up", noop))
        ),
    )


def test_a_second_stack_of_the_same_name_is_refused_and_touches_nothing(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Safe by default (docs/security.md): a colleague's `pulumi stack init lab` in another
    backend, same hosts, same SSH user. Its `up` is refused on every host before it writes
    anything, naming both instances; its `destroy` leaves the serving stack as it was."""
    lab, ours = stack.lab, str(stack.outputs["instance"])
    hosts = lab.spec.host_names
    claims = (f"cat {STATE}/.spark-vllm-instance; docker ps -q --no-trunc | sort; "
              f"docker volume ls -q --filter label=spark-vllm.instance={ours}")  # fmt: skip
    before = {host: host_sh(lab, host, claims) for host in hosts}
    assert all(text.startswith(ours) and "spark-vllm-claim-" in text
               for text in before.values()), before  # fmt: skip
    other = RealPulumi.for_project(tmp_path_factory.mktemp("other-instance"))
    init_stack(other, stack.name, stack.config)
    refused = other.run("up", "--yes", "--skip-preview", check=False)
    assert refused.returncode != 0
    theirs = outputs_by_name(other)["instance-token"]["stdout"]
    for host in hosts:
        assert (f"spark-vllm: {host}: scripts: {STATE} is held by another stack instance of "
                f"deployment {PROJECT}/{stack.name}: instance {ours}, this stack's is "
                f"{theirs}") in refused.output, refused.output[-3000:]  # fmt: skip
    other.run("destroy", "--yes", "--skip-preview")
    assert {host: host_sh(lab, host, claims) for host in hosts} == before
    assert server_answers(lab)


def test_an_upgrade_that_edits_a_host_script_updates_only_the_scripts(stack: Stack) -> None:
    """Day two's row, on the real engine: what `pulumi preview` shows is what the docs say,
    `up` does it, and the next preview expects no changes."""
    script = stack.cli.project_dir / "components/scripts/memory-check.sh"
    script.write_text(script.read_text() + "# an upgrade's edit\n")
    plan = stack.cli.preview()
    assert counts(plan) == documented_counts("upgrade of spark-vllm that edits a host script")
    assert {name for name, op in plan.items() if op == "update"} == {
        f"{host}-scripts" for host in stack.lab.spec.host_names
    }
    done = cli_next_up(stack, "an upgrade that edits a host script (real CLI)", stack.config)
    assert done.changed() == {name: op for name, op in plan.items() if op == "update"}
    stack.cli.run("preview", "--expect-no-changes")


def test_a_killed_worker_rank_takes_the_server_down_and_every_node_rejoins(stack: Stack) -> None:
    lab = stack.lab
    head_restarts = restarts(lab, "spark1")
    started = time.monotonic()
    # A crash of the worker's vLLM (SIGKILL, as the OOM killer would), not of its supervisor.
    lab.sh(WORKER, "pkill -KILL -f '/vllm serve'")
    # vLLM itself would not notice while idle; the head's launcher sees the rank's connection
    # to the rendezvous go, stops the server, and Docker restarts both nodes' containers.
    wait_for(lambda: restarts(lab, "spark1") > head_restarts, 60, "the head's server restarted")
    wait_for(lambda: server_answers(lab), 180, "the server answers again")
    record_timing("fault: a killed worker rank (mp), until the server answers (no pulumi)",
                  time.monotonic() - started)  # fmt: skip
    head_log = host_sh(lab, "spark1", f"docker logs {PREFIX}-vllm 2>&1 | grep launcher")
    assert f"{WORKER} ({lab.spec.host_fabric_ip(1)}) left the rendezvous" in head_log, head_log
    run = cli_next_up(stack, "pulumi up --refresh after a killed worker rank (mp)", stack.config,
                      refresh=True)  # fmt: skip
    assert run.changed() == {}, "nothing is left for pulumi to repair"


def test_a_killed_head_server_brings_every_node_back_without_pulumi(stack: Stack) -> None:
    lab = stack.lab
    worker_restarts = restarts(lab, WORKER)
    started = time.monotonic()
    lab.sh("spark1", "pkill -KILL -f '/vllm serve'")
    # The headless node would wait for ever (as vLLM's do); its launcher sees the head's store
    # go and restarts its ranks, which join the restarted head's next rendezvous.
    wait_for(lambda: restarts(lab, WORKER) > worker_restarts, 60, "the worker's ranks restarted")
    wait_for(lambda: server_answers(lab), 180, "the server answers again")
    record_timing("fault: a killed head server (mp), until the server answers (no pulumi)",
                  time.monotonic() - started)  # fmt: skip
    worker_log = host_sh(lab, WORKER, f"docker logs {PREFIX}-vllm 2>&1 | grep launcher")
    assert "is gone (the server there stopped or restarted)" in worker_log, worker_log


def test_a_worker_that_cannot_reach_the_rendezvous_is_named(stack: Stack) -> None:
    lab = stack.lab
    worker_ip = lab.spec.host_fabric_ip(1)
    block = ["-s", worker_ip, "-p", "tcp", "--dport", str(MASTER_PORT), "-j", "DROP"]
    lab.exec("spark1", ["iptables", "-I", "INPUT", *block])
    started = time.monotonic()
    try:
        with pytest.raises(PulumiFailed) as caught:
            cli_next_up(stack, "a worker blocked from the rendezvous (mp)",
                        mp_config(lab, rayJoinSeconds=JOIN_FAULT_SECONDS))  # fmt: skip
    finally:
        lab.exec("spark1", ["iptables", "-D", "INPUT", *block])
    record_timing("fault (mp): time to the error", time.monotonic() - started)
    error = str(caught.value)
    assert "spark1: vllm-ready: vLLM exited during start-up" in error, error
    assert (
        f"likely cause: {WORKER} ({worker_ip}) did not join the rendezvous at "
        f"{lab.spec.host_fabric_ip(0)}:{MASTER_PORT} within {JOIN_FAULT_SECONDS}s" in error
    ), error
    assert (
        f"likely cause: {WORKER} cannot reach the rendezvous {lab.spec.host_fabric_ip(0)}:"
        f"{MASTER_PORT}: the connection timed out" in error
    ), error
    for node in ("spark1", WORKER):
        assert f"--- {node}: last 50 lines of {PREFIX}-vllm ---" in error
    started = time.monotonic()
    cli_next_up(stack, "clean re-run after the blocked rendezvous (mp)", mp_config(lab))
    record_timing("fault (mp): clean re-run", time.monotonic() - started)
    assert server_answers(lab)


def test_switching_executors_on_the_running_stack_is_a_clean_plan_both_ways(stack: Stack) -> None:
    lab = stack.lab
    to_ray = {**lab_config(lab)}
    stack.cli.replace_config(stack.name, plain_settings(to_ray))
    planned = stack.cli.preview()
    assert counts(planned) == documented_counts("switch back (mp → ray)"), planned
    # Our model of the engine (the program tests' preview) is held to it: the same plan of
    # every custom resource (the model records no components).
    assert model_plan(mp_config(lab), to_ray) == changes(stack.cli.preview(custom_only=True))
    run = cli_next_up(stack, "switch executor: mp to ray", to_ray)
    assert run.changed() == {n: op for n, op in planned.items() if op != "same"}
    changed = run.changed()
    assert changed["vllm-container"] == "replace" and changed["vllm-spark2"] == "delete"
    assert {changed[n] for n in ("ray-head", "ray-spark2", "ray-joined")} == {"create"}
    assert stack.outputs["executor"] == "ray"
    assert complete(stack.endpoint, stack.outputs["modelId"])[0] == 200
    for host, container in (("spark1", "ray-head"), (WORKER, "ray-worker")):
        names = set(host_sh(lab, host, "docker ps --format '{{.Names}}'").split())
        assert f"{PREFIX}-{container}" in names, (host, names)
    assert host_sh(lab, WORKER, "docker ps -aq --filter name=spark-vllm-vllm") == ""

    stack.cli.replace_config(stack.name, plain_settings(mp_config(lab)))
    planned = stack.cli.preview()
    assert counts(planned) == documented_counts("switch executors (`vllm.executor` ray → mp)")
    assert model_plan(to_ray, mp_config(lab)) == changes(stack.cli.preview(custom_only=True))
    back = cli_next_up(stack, "switch executor: ray to mp", mp_config(lab))
    changed = back.changed()
    assert changed["vllm-container"] == "replace" and changed["vllm-spark2"] == "create"
    assert {changed[n] for n in ("ray-head", "ray-spark2", "ray-joined")} == {"delete"}
    assert complete(stack.endpoint, stack.outputs["modelId"])[0] == 200
    for host in ("spark1", WORKER):
        assert host_sh(lab, host, "pgrep -x 'raylet|gcs_server' || true") == "", host
        running = set(host_sh(lab, host, "docker ps --format '{{.Names}}'").split())
        ours = {"vllm", "firewall", "memory-guard", "docker-filter"}
        ours |= {"front"} if host == "spark1" else set()
        assert running == {f"{PREFIX}-{name}" for name in ours}, (host, running)


def test_up_refresh_repairs_a_stopped_and_a_removed_container(stack: Stack) -> None:
    """Drift the README names: `pulumi up --refresh` starts a stopped container again in place
    and creates a missing one; the next preview expects no changes."""
    lab = stack.lab
    lab.sh("spark1", f"docker stop {PREFIX}-front")
    lab.sh(WORKER, f"docker rm -f {PREFIX}-memory-guard")
    run = cli_next_up(stack, "drift: the front stopped, a guard removed", stack.config,
                      refresh=True)  # fmt: skip
    assert run.changed() == {"front-container": "update", f"memory-guard-{WORKER}": "create"}
    assert complete(stack.endpoint, stack.outputs["modelId"])[0] == 200
    assert f"{PREFIX}-memory-guard" in host_sh(lab, WORKER, "docker ps --format '{{.Names}}'")
    stack.cli.run("preview", "--expect-no-changes")


def test_destroy_leaves_only_what_the_docs_keep(stack: Stack) -> None:
    """`pulumi destroy` removes the containers, the fabric key and its authorizations, the API
    key file and the installed scripts; the image and the weights stay (README, Quick start)."""
    lab = stack.lab
    plan = stack.destroy()
    assert set(plan.values()) == {"delete"}, plan
    for host in lab.spec.host_names:
        assert host_sh(lab, host, "docker ps -aq") == "", f"{host}: containers left"
        assert host_sh(lab, host, f"ls -A {STATE} 2>/dev/null || true") == "", host
        # The host's claim for the stack instance is released (stacks/plan/instance.py).
        assert host_sh(lab, host, "docker volume ls -q") == "", f"{host}: volumes left"
        assert "spark-vllm-lab" in host_sh(lab, host, "docker images --format '{{.Repository}}'")
        # The fabric key's authorization (stacks/plan/fabric.py fabric_marker) is gone.
        assert "spark-vllm-fabric:" not in host_sh(lab, host, "cat ~/.ssh/authorized_keys")
    weights = host_sh(lab, WORKER, "ls /root/.cache/huggingface/hub")
    assert "models--" in weights, weights
