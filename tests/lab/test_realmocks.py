"""RealMocks against a throwaway sshd and dockerd on loopback.

The sshd is run from a temp sshd_config (its own host key, authorized key file and pid file); the
client key's authorized_keys entry sets DOCKER_HOST (PermitUserEnvironment) so the docker CLI in
every SSH session talks to a throwaway dockerd, not the machine's. Nothing outside tmp is touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pytest

from tests.cli import PulumiCli
from tests.lab import realmocks
from tests.mockvalues import SECRET_SIG_KEY, SECRET_SIG_VALUE, is_secret, unwrap_secrets

RealMocks = realmocks.RealMocks
run_program = realmocks.run_program

PROJECT = "realmocks-test"
IMAGE = "realmocks-busybox:test"
CONTAINER_PREFIX = "realmocks-"


def require(condition: bool, reason: str) -> None:
    """Skip when the machine cannot host the test; on CI a missing prerequisite is a failure."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"lab prerequisite missing on CI: {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout_s}s")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True
    )
    return Path(f"{path}.pub").read_text().strip()


# ---------------------------------------------------------------------------------------------
# Fixtures: dockerd, sshd, a busybox image
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lab:
    port: int
    host_key: str  # "ssh-ed25519 AAAA..."
    client_key: Path
    known_hosts: Path
    docker_host: str  # unix:///... of the throwaway dockerd
    workdir: Path

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", *args],
            env={**os.environ, "DOCKER_HOST": self.docker_host},
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def inspect(self, name: str) -> dict[str, Any] | None:
        result = self.docker("container", "inspect", name, check=False)
        return json.loads(result.stdout)[0] if result.returncode == 0 else None


@pytest.fixture(scope="module")
def dockerd() -> Iterator[str]:
    require(os.geteuid() == 0, "needs root")
    require(shutil.which("dockerd") is not None and shutil.which("docker") is not None, "no docker")
    # Short paths: the exec root holds unix sockets (108-byte limit).
    root = Path(tempfile.mkdtemp(prefix="rmd-", dir="/tmp"))
    socket_path = root / "d.sock"
    log = (root / "dockerd.log").open("wb")
    process = subprocess.Popen(
        [
            "dockerd",
            "--data-root", str(root / "data"),
            "--exec-root", str(root / "x"),
            "--pidfile", str(root / "d.pid"),
            "-H", f"unix://{socket_path}",
            "--iptables=false", "--ip6tables=false", "--bridge=none",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    docker_host = f"unix://{socket_path}"
    try:
        wait_for(
            lambda: (
                subprocess.run(
                    ["docker", "version"],
                    env={**os.environ, "DOCKER_HOST": docker_host},
                    capture_output=True,
                    check=False,
                ).returncode
                == 0
            ),
            30,
            "dockerd",
        )
        yield docker_host
    finally:
        stop_process(process)
        log.close()
        unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)


def unmount_below(root: Path) -> None:
    """dockerd leaves its default netns bind-mounted under the exec root after it stops."""
    mount_points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount_point in sorted(mount_points, key=len, reverse=True):
        if mount_point.startswith(f"{root}/"):
            subprocess.run(["umount", "-l", mount_point], check=False, capture_output=True)


@pytest.fixture(scope="module")
def lab(dockerd: str) -> Iterator[Lab]:
    require(Path("/usr/sbin/sshd").exists() and shutil.which("ssh") is not None, "no OpenSSH")
    workdir = Path(tempfile.mkdtemp(prefix="rms-", dir="/tmp"))
    host_key = keygen(workdir / "host_key")
    client_public = keygen(workdir / "client_key")
    port = free_port()
    (workdir / "authorized_keys").write_text(
        f'environment="DOCKER_HOST={dockerd}" {client_public}\n'
    )
    (workdir / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
    config = workdir / "sshd_config"
    config.write_text(
        textwrap.dedent(f"""\
            Port {port}
            ListenAddress 127.0.0.1
            HostKey {workdir / "host_key"}
            PidFile {workdir / "sshd.pid"}
            AuthorizedKeysFile {workdir / "authorized_keys"}
            PermitRootLogin prohibit-password
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            UsePAM no
            PermitUserEnvironment yes
            AllowTcpForwarding yes
            StrictModes no
            MaxStartups 100:30:200
            MaxSessions 100
            """)
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
    log = (workdir / "sshd.log").open("wb")
    process = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: port_open(port), 15, "sshd")
        yield Lab(port, host_key, workdir / "client_key", workdir / "known_hosts", dockerd, workdir)
    finally:
        stop_process(process)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def busybox_image(lab: Lab) -> str:
    """A tiny local image (static busybox), imported rather than pulled: no registry needed."""
    rootfs = lab.workdir / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    for applet in ("sh", "sleep", "cat", "env", "echo", "false", "true", "test"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    tarball = lab.workdir / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
    lab.docker("import", str(tarball), IMAGE)
    return IMAGE


# ---------------------------------------------------------------------------------------------
# The program under test: one file, scenarios chosen by config
# ---------------------------------------------------------------------------------------------

PROGRAM = """
import pulumi
import pulumi_docker as docker
from pulumi_command import remote

cfg = pulumi.Config()
lab = cfg.require_object("lab")
scenario = cfg.require("scenario")
key = cfg.require_secret("privateKey")


def connection(host_key, proxy=False):
    hop = dict(host="127.0.0.1", port=lab["port"], user="root", private_key=key,
               host_key=host_key, dial_error_limit=2, per_dial_timeout=5)
    if proxy:
        hop["proxy"] = remote.ProxyConnectionArgs(**hop)
    return remote.ConnectionArgs(**hop)


work = lab["workdir"]
if scenario == "bad-host-key":
    remote.Command("bad", connection=connection(lab["wrongHostKey"]), create="true",
                   add_previous_output_in_env=False)
elif scenario == "failing-command":
    remote.Command("fails", connection=connection(lab["hostKey"]),
                   create="echo to-stdout; echo to-stderr >&2; exit 3",
                   add_previous_output_in_env=False)
else:
    marker = remote.Command(
        "marker",
        connection=connection(lab["hostKey"]),
        create=f"cat > {work}/marker && echo created",
        delete=f"rm -f {work}/marker && touch {work}/deleted",
        stdin=pulumi.Output.secret("s3cret-stdin"),
        add_previous_output_in_env=False,
    )
    via_proxy = remote.Command(
        "via-proxy",
        connection=connection(lab["hostKey"], proxy=True),
        create=f"touch {work}/via-proxy && echo proxied",
        add_previous_output_in_env=False,
    )
    unchecked = remote.Command(
        "unchecked",
        connection=connection(None),
        create="echo unchecked",
        add_previous_output_in_env=False,
    )
    provider = docker.Provider(
        "host",
        host=f"ssh://root@127.0.0.1:{lab['port']}",
        ssh_opts=["-F", "/dev/null", "-o", "BatchMode=yes", "-i", lab["clientKey"],
                  "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={lab['knownHosts']}",
                  "-o", "StrictHostKeyChecking=yes",
                  # Shared master connection, as recommended for many docker resources per host.
                  "-o", "ControlMaster=auto", "-o", f"ControlPath={work}/cm-%C",
                  "-o", "ControlPersist=20"],
    )
    on_host = pulumi.ResourceOptions(provider=provider)
    image = docker.RemoteImage("image", name=lab["imageTag"], keep_locally=False, opts=on_host)
    dies = scenario == "dying-container"
    container = docker.Container(
        "app",
        name=lab["containerName"],
        image=image.image_id,
        entrypoints=["sh", "-c"],
        command=["exit 7" if dies else "echo started; exec sleep 300"],
        envs=["GREETING=hello world", pulumi.Output.secret("TOKEN=env-secret")],
        labels=[docker.ContainerLabelArgs(label="app", value="realmocks")],
        init=True,
        restart="no" if dies else "unless-stopped",
        ulimits=[docker.ContainerUlimitArgs(name="nofile", soft=1024, hard=2048)],
        network_mode="host",
        healthcheck=None if dies else docker.ContainerHealthcheckArgs(
            tests=["CMD-SHELL", 'test -n "$GREETING"'], interval="1s", retries=3),
        wait=not dies,
        wait_timeout=30,
        opts=pulumi.ResourceOptions(provider=provider, depends_on=[marker]),
    )
    pulumi.export("markerStdout", marker.stdout)
    pulumi.export("proxyStdout", via_proxy.stdout)
    pulumi.export("uncheckedStdout", unchecked.stdout)
    pulumi.export("imageId", image.image_id)
    pulumi.export("containerId", container.id)
    pulumi.export("secretThing", pulumi.Output.secret("hush"))
    pulumi.log.warn("deployed by the test program")
"""


@dataclass
class Deployment:
    lab: Lab
    program_dir: Path
    image_tag: str
    container_name: str
    mocks: RealMocks

    def config(self, scenario: str, **extra: Any) -> dict[str, Any]:
        return {
            "scenario": scenario,
            "privateKey": self.lab.client_key.read_text(),
            "lab": {
                "port": self.lab.port,
                "hostKey": self.lab.host_key,
                "clientKey": str(self.lab.client_key),
                "knownHosts": str(self.lab.known_hosts),
                "workdir": str(self.lab.workdir),
                "imageTag": self.image_tag,
                "containerName": self.container_name,
                **extra,
            },
        }

    def cli(self, scenario: str, **extra: Any) -> PulumiCli:
        """The throwaway project's stack `test`: its settings, and the private key as a secret."""
        cli = PulumiCli(self.program_dir)
        config = self.config(scenario, **extra)
        cli.stack_from("test", {k: v for k, v in config.items() if k != "privateKey"})
        cli.config_set("test", "privateKey", config["privateKey"], secret=True)
        return cli

    def run(self, scenario: str = "deploy", **extra: Any) -> realmocks.StackOutputs:
        return run_program(self.cli(scenario, **extra), "test", self.mocks)


@pytest.fixture
def deployment(lab: Lab, busybox_image: str, tmp_path: Path) -> Iterator[Deployment]:
    program_dir = tmp_path / "program"
    program_dir.mkdir()
    (program_dir / "__main__.py").write_text(PROGRAM)
    (program_dir / "Pulumi.yaml").write_text(f"name: {PROJECT}\nruntime: python\n")
    # A throwaway tag per test: RemoteImage has keepLocally false, so teardown removes the tag.
    suffix = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]
    image_tag = f"realmocks-doomed:{suffix}"
    lab.docker("tag", busybox_image, image_tag)
    for marker in ("marker", "deleted", "via-proxy"):
        (lab.workdir / marker).unlink(missing_ok=True)
    mocks = RealMocks(command_timeout_s=60)
    deployment = Deployment(lab, program_dir, image_tag, f"{CONTAINER_PREFIX}{suffix}", mocks)
    try:
        yield deployment
    finally:
        # End the docker provider's shared ssh master connections (they would linger 20 s).
        for control_path in lab.workdir.glob("cm-*"):
            subprocess.run(
                ["ssh", "-S", str(control_path), "-O", "exit", "unused"],
                capture_output=True,
                check=False,
                timeout=10,
            )
        # Whatever a failing test left behind.
        leftovers = lab.docker("ps", "-aq", "--filter", f"name={CONTAINER_PREFIX}", check=False)
        for container_id in leftovers.stdout.split():
            lab.docker("rm", "-f", container_id, check=False)
        lab.docker("rmi", image_tag, check=False)


# ---------------------------------------------------------------------------------------------
# Tests that need the throwaway hosts
# ---------------------------------------------------------------------------------------------


@pytest.mark.lab
def test_program_deploys_for_real_and_teardown_undoes_it(deployment: Deployment) -> None:
    lab = deployment.lab
    outputs = deployment.run()

    assert outputs["markerStdout"] == "created"
    assert outputs["proxyStdout"] == "proxied"
    assert (lab.workdir / "marker").read_text() == "s3cret-stdin"  # stdin really fed
    assert (lab.workdir / "via-proxy").exists()
    assert outputs["secretThing"] == "hush"
    assert outputs.secret_names == {"secretThing"}
    assert "WARNING: deployed by the test program" in deployment.mocks.program_log

    container = lab.inspect(deployment.container_name)
    assert container is not None
    assert container["Id"] == outputs["containerId"]
    assert container["State"]["Running"]
    assert container["Image"] == outputs["imageId"]
    assert {"GREETING=hello world", "TOKEN=env-secret"} <= set(container["Config"]["Env"])
    assert container["Config"]["Labels"]["app"] == "realmocks"
    assert container["Config"]["Entrypoint"] == ["sh"]
    assert container["Config"]["Cmd"][0] == "-c"
    host_config = container["HostConfig"]
    assert host_config["Init"] is True
    assert host_config["NetworkMode"] == "host"
    assert host_config["RestartPolicy"]["Name"] == "unless-stopped"
    assert host_config["Ulimits"] == [{"Name": "nofile", "Soft": 1024, "Hard": 2048}]

    journal = deployment.mocks.journal
    types = [entry.type for entry in journal]
    assert types.index(realmocks.TYPE_COMMAND) < types.index(realmocks.TYPE_CONTAINER)
    assert all(entry.resource_id for entry in journal)  # what new_resource returned, for reuse
    marker_entry = next(entry for entry in journal if entry.name == "marker")
    assert is_secret(marker_entry.outputs["stdin"])  # secrets stay wrapped in state
    assert is_secret(marker_entry.outputs["connection"])
    assert outputs["uncheckedStdout"] == "unchecked"
    assert [w for w in deployment.mocks.warnings if "NOT checked" in w] == [
        f"command:remote:Command 'unchecked': root@127.0.0.1:{lab.port}: no hostKey given, "
        "the host key is NOT checked"
    ]
    assert container["State"]["Health"]["Status"] == "healthy"  # `wait` waited for it

    deployment.mocks.teardown()
    assert lab.inspect(deployment.container_name) is None
    assert not (lab.workdir / "marker").exists()
    assert (lab.workdir / "deleted").exists()  # the delete command ran
    assert lab.docker("image", "inspect", deployment.image_tag, check=False).returncode != 0
    assert deployment.mocks.journal == []


@pytest.mark.lab
def test_second_run_in_one_process_works_and_a_name_conflict_fails_like_the_provider(
    deployment: Deployment,
) -> None:
    first = deployment.run()
    deployment.mocks.teardown()
    deployment.lab.docker("tag", IMAGE, deployment.image_tag)  # teardown removed the tag

    second = deployment.run()
    assert second["containerId"] != first["containerId"]
    assert deployment.lab.inspect(deployment.container_name) is not None

    # A third run against the live deployment: the container name is taken, as for a real `up`
    # from an empty state against hosts that still run the old containers.
    conflicting = RealMocks(command_timeout_s=60)
    with pytest.raises(Exception, match=r"Conflict\. The container name .* is already in use"):
        run_program(deployment.cli("deploy"), "test", conflicting)
    assert not any(entry.type == realmocks.TYPE_CONTAINER for entry in conflicting.journal)
    conflicting.teardown()
    # The conflicting run's teardown must leave the live deployment's container alone.
    survivor = deployment.lab.inspect(deployment.container_name)
    assert survivor is not None and survivor["Id"] == second["containerId"]
    deployment.mocks.teardown()
    assert deployment.lab.inspect(deployment.container_name) is None


@pytest.mark.lab
def test_host_key_mismatch_fails_clearly(deployment: Deployment, tmp_path: Path) -> None:
    wrong_key = keygen(tmp_path / "other_host_key")
    with pytest.raises(ConnectionError) as failure:
        deployment.run("bad-host-key", wrongHostKey=wrong_key)
    message = str(failure.value)
    assert "host key does not match" in message
    assert "root@127.0.0.1" in message
    assert "PRIVATE KEY" not in message
    assert deployment.mocks.journal == []


@pytest.mark.lab
def test_failing_command_reports_exit_status_and_output(deployment: Deployment) -> None:
    with pytest.raises(RuntimeError) as failure:
        deployment.run("failing-command")
    message = str(failure.value)
    assert "Process exited with status 3" in message
    assert "to-stdout" in message and "to-stderr" in message


@pytest.mark.lab
def test_a_container_that_dies_at_start_is_created_and_stored_as_not_running(
    deployment: Deployment,
) -> None:
    """As pulumi-docker creates a container (terraform-provider-docker v4.0.0 on, PR #841):
    started, read once, never waited for, never failed when it dies; the read stores mustRun
    false for a container it saw stopped, so the next plain `up` plans an update that starts
    it. A death at start is for the steps that wait for the container to say."""
    deployment.run("dying-container")
    created = [e for e in deployment.mocks.journal if e.type == realmocks.TYPE_CONTAINER]
    assert len(created) == 1 and created[0].inputs["mustRun"] is False, created
    found = deployment.lab.inspect(deployment.container_name)
    assert found is not None
    assert (found["State"]["Status"], found["State"]["ExitCode"]) == ("exited", 7)
    deployment.mocks.teardown()
    assert deployment.lab.inspect(deployment.container_name) is None


# ---------------------------------------------------------------------------------------------
# Pure translation tests (no hosts needed)
# ---------------------------------------------------------------------------------------------


def test_container_inputs_translate_to_docker_run_flags() -> None:
    flags, env_text = realmocks.container_run_args(
        {
            "name": "c",
            "image": "sha256:abc",
            "entrypoints": ["bash", "-c", "exec x", "launcher"],
            "command": ["arg1"],
            "envs": ["A=1", "B=two words"],
            "networkMode": "host",
            "ipcMode": "host",
            "shmSize": 1024.0,
            "ulimits": [{"name": "memlock", "soft": -1.0, "hard": -1.0}],
            "gpus": "all",
            "init": True,
            "restart": "on-failure",
            "maxRetryCount": 3.0,
            "mounts": [{"type": "bind", "source": "/h", "target": "/c", "readOnly": True}],
            "volumes": [{"hostPath": "/a", "containerPath": "/b"}],
            "capabilities": {"adds": ["SYS_PTRACE"]},
            "healthcheck": {"tests": ["CMD", "curl", "-f", "http://x"], "retries": 3.0},
            "mustRun": True,
        }
    )
    assert env_text == "A=1\nB=two words\n"
    assert "A=1" not in " ".join(flags)
    expected_pairs = [
        ("--entrypoint", "bash"),
        ("--network", "host"),
        ("--ipc", "host"),
        ("--shm-size", "1024m"),
        ("--ulimit", "memlock=-1:-1"),
        ("--gpus", "all"),
        ("--restart", "on-failure:3"),
        ("--mount", "type=bind,target=/c,source=/h,readonly"),
        ("-v", "/a:/b"),
        ("--cap-add", "SYS_PTRACE"),
        ("--health-cmd", "curl -f http://x"),
        ("--health-retries", "3"),
    ]
    for flag, value in expected_pairs:
        assert flags[flags.index(flag) + 1] == value, flag
    assert "--init" in flags
    assert flags[-5:] == ["sha256:abc", "-c", "exec x", "launcher", "arg1"]


def test_untranslated_container_inputs_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="networksAdvanced"):
        realmocks.container_run_args(
            {"image": "x", "networksAdvanced": [{"name": "n"}], "rm": False}
        )


def test_every_container_of_the_real_program_translates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project's own program (with its offline test harness and the dev stack's config):
    realmocks must translate every container input it sets, and accept every command."""
    harness = pytest.importorskip("tests.program.harness")
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    config = harness.load_stack_config("dev")
    config["ssh"] = {"privateKeyPath": str(key), "knownHostsFile": str(tmp_path / "known_hosts")}
    host_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAISpark1KeySpark1KeySpark1Key0"
    addresses = [host.get("address") for host in config["hosts"]]
    (tmp_path / "known_hosts").write_text("".join(f"{a} {host_key}\n" for a in addresses))
    monkeypatch.setenv("SPARK_VLLM_LOCAL_DIR", str(tmp_path / "local"))
    evaluation = harness.evaluate(config, {"apiKey": "k-test-0123456789abcdef01", "hfToken": "t"})
    containers = evaluation.by_type(realmocks.TYPE_CONTAINER)
    assert containers
    for registration in containers:
        realmocks.container_run_args(unwrap_secrets(registration.inputs))
    for registration in evaluation.by_type(realmocks.TYPE_COMMAND):
        realmocks.connection_from_inputs(registration.inputs["connection"], registration.name)
        assert not realmocks.is_set(unwrap_secrets(registration.inputs.get("environment")))
    for registration in evaluation.by_type(realmocks.TYPE_DOCKER_PROVIDER):
        realmocks.docker_host_from_provider_inputs(registration.inputs, registration.name)


def test_failure_message_shows_only_the_streams_logging_allows() -> None:
    connection = realmocks.connection_from_inputs({"host": "h"}, "t")
    result = realmocks.RemoteResult(2, "secret-out", "plain-err")
    message = str(realmocks.command_failure(connection, "cmd", result, "t", "stderr"))
    assert "Process exited with status 2" in message
    assert "plain-err" in message and "secret-out" not in message


def test_only_the_programs_own_modules_are_forgotten_between_runs() -> None:
    program_dir = Path(sys.prefix).resolve().parent  # the project holding this venv
    sdk_file = pulumi.__file__
    assert not realmocks.is_program_module(sdk_file, program_dir)
    assert realmocks.is_program_module(str(program_dir / "stacks" / "config.py"), program_dir)
    assert not realmocks.is_program_module(None, program_dir)


def test_command_environment_is_refused_because_sshd_drops_it() -> None:
    args = pulumi.runtime.MockResourceArgs(
        typ=realmocks.TYPE_COMMAND,
        name="env",
        inputs={"connection": {"host": "h"}, "create": "true", "environment": {"A": "1"}},
        custom=True,
    )
    with pytest.raises(ValueError, match="sshd drops it"):
        RealMocks().new_resource(args)


def test_no_step_starts_after_the_first_failure() -> None:
    """The engine cancels the run at its first failed step (step_executor.go): a later
    registration is not performed, and the run reports the first failure."""
    args = pulumi.runtime.MockResourceArgs(
        typ=realmocks.TYPE_COMMAND,
        name="env",
        inputs={"connection": {"host": "h"}, "create": "true", "environment": {"A": "1"}},
        custom=True,
    )
    mocks = RealMocks()
    with pytest.raises(ValueError, match="sshd drops it"):
        mocks.new_resource(args)
    later = pulumi.runtime.MockResourceArgs(
        typ=realmocks.TYPE_COMMAND,
        name="later",
        inputs={"connection": {"host": "unreachable.invalid"}, "create": "touch /tmp/x"},
        custom=True,
    )
    with pytest.raises(realmocks.RunCancelled, match=r"'later': not started: .*sshd drops it"):
        mocks.new_resource(later)
    assert isinstance(mocks.first_failure, ValueError) and mocks.journal == []
    component = pulumi.runtime.MockResourceArgs(typ="x:index:C", name="c", inputs={}, custom=False)
    assert mocks.new_resource(component) == (None, {})  # components have no step


def test_a_lab_container_reads_as_the_api_would_have_made_it() -> None:
    """`docker run` takes a one-word --entrypoint: the rest went into Cmd, and is put back."""
    inputs = {"entrypoints": ["bash", "-c", "script"], "command": ["a", "b"]}
    inspect = {"Config": {"Entrypoint": ["bash"], "Cmd": ["-c", "script", "a", "b"]}}
    made = realmocks.as_the_api_made_it(inspect, inputs)
    assert made["Config"] == {"Entrypoint": ["bash", "-c", "script"], "Cmd": ["a", "b"]}
    changed = {"Config": {"Entrypoint": ["bash"], "Cmd": ["-c", "other", "a"]}}
    assert realmocks.as_the_api_made_it(changed, inputs) == changed


def test_secrets_unwrap_at_any_depth() -> None:
    wrapped = {SECRET_SIG_KEY: SECRET_SIG_VALUE, "value": {"privateKey": "k"}}
    assert unwrap_secrets({"connection": wrapped}) == {"connection": {"privateKey": "k"}}
    connection = realmocks.connection_from_inputs(
        {**wrapped, "value": {"host": "h", "port": 2222.0, "proxy": {"host": "j"}}}, "t"
    )
    assert connection.target.port == 2222
    assert connection.proxy is not None and connection.proxy.port == 22
    assert "privateKey" not in repr(connection) and "'k'" not in repr(connection)


def test_a_command_printing_invalid_utf8_fails_as_the_providers_response_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pulumi-command hands stdout and stderr back as proto3 strings: an invalid byte fails
    the response's marshaling after the command ran. The stand-in fails the same way, so a
    step whose output the wrapper did not make valid (stacks/plan/steps.py UTF8_OUTPUT) fails
    here too, where the lab can see it."""
    printed = realmocks.run_process(["printf", r"ok \377\n"], None, 10)
    assert printed.invalid_utf8 and printed.exit_code == 0
    assert not realmocks.run_process(["printf", "caf\u00e9\n"], None, 10).invalid_utf8
    monkeypatch.setattr(realmocks, "run_over_ssh", lambda *args: printed)
    connection = realmocks.connection_from_inputs({"host": "h"}, "step")
    with pytest.raises(RuntimeError, match="string field contains invalid UTF-8"):
        RealMocks()._run_command(connection, "true", None, "step", None)
