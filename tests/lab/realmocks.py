"""Pulumi mocks that *perform* each create for real, over SSH, against real hosts.

There is no Pulumi CLI on the test machines, so the program is run under Pulumi's mock runtime.
`RealMocks` turns that runtime into a small executor: every `command:remote:Command`,
`docker:index/remoteImage:RemoteImage` and `docker:index/container:Container` the program
registers is carried out with the real OpenSSH client and the remote host's docker CLI, the way
pulumi-command and pulumi-docker would do it. `teardown()` undoes the creates in reverse order,
the way `pulumi destroy` would.

`run_program()` runs a whole project (its `__main__.py`) under these mocks, the way the CLI and
the Python language host run it, and returns the resolved stack outputs.

Secrets (private keys, passwords, stdin) never go on a command line, into a log or into an
exception message: keys are written to 0600 files, stdin is streamed, env values go through a file.
A failing command's message shows only the output streams its `logging` input allows.

    mocks = RealMocks()                       # command_timeout_s
    cli = PulumiCli(Path("."))                # Pulumi.yaml checked as the CLI checks it
    cli.stack_init("lab"); cli.config_set("lab", "apiKey", "k-test-0123456789abcdef01", secret=True)
    outputs = run_program(cli, "lab", mocks)
    outputs["endpointUrl"], outputs.secret_names
    mocks.journal, mocks.warnings, mocks.program_log
    mocks.teardown()                          # or teardown(journal); raises TeardownError

Limits: creates only (no update, diff, refresh or replace); no invokes; docker only over ssh://;
no password or encrypted-key auth; Pulumi's customTimeouts are not visible here, so every remote
command is bounded by `command_timeout_s` (env REALMOCKS_COMMAND_TIMEOUT, default 20 min).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json
import logging
import os
import runpy
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.stack import massage, run_in_stack

from tests.cli import PulumiCli, handed_to_program
from tests.engine.container_read import read_container
from tests.engine.images import repo_digest
from tests.engine.urns import AliasSpec, EngineUrns
from tests.mockvalues import ProviderInvokeError, is_secret, unwrap_secrets

log = logging.getLogger(__name__)

TYPE_DOCKER_PROVIDER = "pulumi:providers:docker"
TOKEN_LOCAL_RUN = "command:local:run"
TYPE_COMMAND = "command:remote:Command"
TYPE_REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
TYPE_CONTAINER = "docker:index/container:Container"
TYPE_STACK_REFERENCE = "pulumi:pulumi:StackReference"
TYPE_LOCAL_COMMAND = "command:local:Command"

# Pulumi's customTimeouts are not visible to mocks; this bounds every remote command instead.
DEFAULT_COMMAND_TIMEOUT_S = float(os.environ.get("REALMOCKS_COMMAND_TIMEOUT", 20 * 60))
# pulumi-docker's default `wait_timeout` (seconds) when `wait` is true.
DEFAULT_CONTAINER_WAIT_TIMEOUT_S = 60.0
# Docker CLI calls (inspect, run, rm) are short; anything longer is a hung connection.
DOCKER_CALL_TIMEOUT_S = 120.0
# ssh exits 255 on its own errors; these texts tell them apart from a remote command's exit 255.
SSH_OWN_ERROR_MARKERS = (
    "Host key verification failed",
    "REMOTE HOST IDENTIFICATION HAS CHANGED",
    "Connection refused",
    "Connection timed out",
    "Permission denied (",
    "Could not resolve hostname",
    "No route to host",
    "Connection closed by",
    "kex_exchange_identification",
    "UNPROTECTED PRIVATE KEY FILE",
)
TAIL_LINES = 300  # pulumi-command shows the whole output; keep enough for every node's logs
# The logger the mock engine writes the program's pulumi.log messages to.
PROGRAM_LOGGER = "pulumi.program"


# ---------------------------------------------------------------------------------------------
# Values as the mock runtime delivers them
# ---------------------------------------------------------------------------------------------


def is_set(value: Any) -> bool:
    """Whether an input carries a value that would change what the provider does."""
    return value is not None and value is not False and value != [] and value != {} and value != ""


def as_int(value: Any, default: int) -> int:
    # Nested numbers arrive as floats.
    return default if value is None else int(value)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "...(truncated)"


# ---------------------------------------------------------------------------------------------
# SSH, as pulumi-command would connect
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SshTarget:
    """One hop of a pulumi-command connection (secret fields kept only in memory)."""

    host: str
    port: int = 22
    user: str = "root"
    private_key: str | None = field(default=None, repr=False)
    host_key: str | None = None
    agent_socket_path: str | None = None
    per_dial_timeout: int = 15
    dial_error_limit: int = 10

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def known_hosts_pattern(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


@dataclass(frozen=True)
class SshConnection:
    target: SshTarget
    proxy: SshTarget | None = None

    @property
    def agent_socket_path(self) -> str | None:
        return self.target.agent_socket_path or (
            self.proxy.agent_socket_path if self.proxy else None
        )


def target_from_inputs(raw: Mapping[str, Any], what: str) -> SshTarget:
    if not raw.get("host"):
        raise ValueError(f"{what}: connection has no host")
    if raw.get("password") and not raw.get("privateKey"):
        # OpenSSH in BatchMode cannot type a password; the lab and the program use keys.
        raise NotImplementedError(f"{what}: password authentication is not supported by realmocks")
    if raw.get("privateKeyPassword"):
        raise NotImplementedError(f"{what}: encrypted private keys are not supported by realmocks")
    return SshTarget(
        host=str(raw["host"]),
        port=as_int(raw.get("port"), 22),
        user=str(raw.get("user") or "root"),
        private_key=raw.get("privateKey") or None,
        host_key=raw.get("hostKey") or None,
        agent_socket_path=raw.get("agentSocketPath") or None,
        per_dial_timeout=as_int(raw.get("perDialTimeout"), 15),
        dial_error_limit=as_int(raw.get("dialErrorLimit"), 10),
    )


def connection_from_inputs(raw_connection: Any, what: str) -> SshConnection:
    raw = unwrap_secrets(raw_connection)
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: connection input is missing or not an object")
    proxy_raw = raw.get("proxy")
    proxy = target_from_inputs(proxy_raw, f"{what} (proxy)") if proxy_raw else None
    return SshConnection(target=target_from_inputs(raw, what), proxy=proxy)


class SshFiles:
    """Temp key and known_hosts files for one ssh invocation; removed on close."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="realmocks-ssh-"))
        os.chmod(self.dir, 0o700)
        self._count = 0

    def write(self, stem: str, content: str) -> Path:
        self._count += 1
        path = self.dir / f"{stem}-{self._count}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(content if content.endswith("\n") else content + "\n")
        return path

    def close(self) -> None:
        for child in self.dir.iterdir():
            child.unlink()
        self.dir.rmdir()


def hop_options(target: SshTarget, files: SshFiles, warnings: list[str]) -> list[str]:
    """OpenSSH options that make one hop behave like pulumi-command's Go SSH client."""
    options = ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-T"]
    if target.private_key:
        key_file = files.write("key", target.private_key)
        options += ["-i", str(key_file), "-o", "IdentitiesOnly=yes"]
    if target.host_key:
        # One line per key, in case several key types are pinned.
        lines = [line.strip() for line in target.host_key.splitlines() if line.strip()]
        known_hosts = files.write(
            "known_hosts", "".join(f"{target.known_hosts_pattern} {line}\n" for line in lines)
        )
        options += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    else:
        # pulumi-command does not check the host key when none is given; say so, loudly.
        warnings.append(f"{target.address}: no hostKey given, the host key is NOT checked")
        options += ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
    options += ["-o", "GlobalKnownHostsFile=/dev/null"]
    if target.per_dial_timeout > 0:
        options += ["-o", f"ConnectTimeout={target.per_dial_timeout}"]
    # dialErrorLimit -1 means unlimited in pulumi-command; bound it anyway so a test cannot hang.
    attempts = target.dial_error_limit if target.dial_error_limit > 0 else 100
    options += ["-o", f"ConnectionAttempts={attempts}", "-p", str(target.port)]
    return options


def ssh_argv(connection: SshConnection, files: SshFiles, warnings: list[str]) -> list[str]:
    """`ssh ... -- user@host`; the remote command string is appended by the caller."""
    argv = ["ssh", *hop_options(connection.target, files, warnings)]
    if connection.proxy is not None:
        proxy = connection.proxy
        proxy_argv = [
            "ssh",
            *hop_options(proxy, files, warnings),
            "-W",
            "%h:%p",
            "--",
            f"{proxy.user}@{proxy.host}",
        ]
        argv += ["-o", "ProxyCommand=" + shlex.join(proxy_argv)]
    return [*argv, "--", f"{connection.target.user}@{connection.target.host}"]


@dataclass
class RemoteResult:
    exit_code: int
    stdout: str
    stderr: str
    # Bytes that are not UTF-8 in either stream (shown here as U+FFFD): pulumi-command's
    # response carries both as proto3 strings, whose marshaling then fails.
    invalid_utf8: bool = False

    @property
    def is_ssh_failure(self) -> bool:
        return self.exit_code == 255 and any(m in self.stderr for m in SSH_OWN_ERROR_MARKERS)


def run_process(
    argv: Sequence[str],
    stdin: str | None,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> RemoteResult:
    """Runs argv with stdin streamed (never on the command line); bounded by timeout_s."""
    try:
        completed = subprocess.run(
            list(argv),
            input=stdin.encode() if stdin is not None else None,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            env=dict(env) if env is not None else None,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace")
        err = (exc.stderr or b"").decode(errors="replace")
        raise TimeoutError(
            f"timed out after {timeout_s:.0f}s\n"
            f"stdout (tail):\n{tail(out)}\nstderr (tail):\n{tail(err)}"
        ) from None
    return RemoteResult(
        completed.returncode,
        completed.stdout.decode(errors="replace"),
        completed.stderr.decode(errors="replace"),
        invalid_utf8=not (is_utf8(completed.stdout) and is_utf8(completed.stderr)),
    )


def is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def run_over_ssh(
    connection: SshConnection,
    command: str,
    stdin: str | None,
    timeout_s: float,
    warnings: list[str],
) -> RemoteResult:
    """Runs `command` as the remote user's shell would (pulumi-command's session.Run)."""
    files = SshFiles()
    try:
        env = dict(os.environ)
        if connection.agent_socket_path:
            env["SSH_AUTH_SOCK"] = connection.agent_socket_path
        argv = [*ssh_argv(connection, files, warnings), command]
        try:
            return run_process(argv, stdin, timeout_s, env)
        except TimeoutError as exc:
            raise TimeoutError(
                f"ssh {connection.target.address}: running {short(command)!r}: {exc}"
            ) from None
    finally:
        files.close()


def command_failure(
    connection: SshConnection,
    command: str,
    result: RemoteResult,
    what: str,
    logging_mode: str | None = None,
) -> Exception:
    """An error worded like pulumi-command's, with the output tails that show the real cause.

    Only the streams the command's `logging` input allows are shown: a program that turns logging
    off for a stream does so because it may carry secrets."""
    if result.is_ssh_failure:
        hint = ""
        if "Host key verification failed" in result.stderr:
            hint = " (the server's host key does not match the hostKey given)"
        via = f" via proxy {connection.proxy.address}" if connection.proxy else ""
        return ConnectionError(
            f"{what}: ssh: cannot connect to {connection.target.address}{via}{hint}: "
            f"{tail(result.stderr, 10)}"
        )
    mode = logging_mode or "stdoutAndStderr"
    hidden = f"(not shown: the command's logging is {mode})"
    stdout = tail(result.stdout) if mode in ("stdout", "stdoutAndStderr") else hidden
    stderr = tail(result.stderr) if mode in ("stderr", "stdoutAndStderr") else hidden
    return RuntimeError(
        f"{what}: Process exited with status {result.exit_code}: running {short(command)!r}:\n"
        f"stdout (tail):\n{stdout}\nstderr (tail):\n{stderr}"
    )


# ---------------------------------------------------------------------------------------------
# Docker on a remote host, through the ssh options a docker.Provider carries
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DockerHost:
    """What a `docker.Provider` records: `ssh://user@addr:port` plus extra ssh options."""

    user: str
    address: str
    port: int
    ssh_opts: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"ssh://{self.user}@{self.address}:{self.port}"


def docker_host_from_provider_inputs(inputs: Mapping[str, Any], what: str) -> DockerHost:
    plain = unwrap_secrets(dict(inputs))
    host = plain.get("host") or ""
    if not host.startswith("ssh://"):
        raise NotImplementedError(
            f"{what}: docker provider host {host!r} is not ssh://USER@ADDR:PORT; realmocks "
            "only reaches docker over SSH"
        )
    rest = host.removeprefix("ssh://").rstrip("/")
    user, _, hostport = rest.rpartition("@")
    address, _, port = hostport.rpartition(":") if hostport.count(":") == 1 else (hostport, "", "")
    ssh_opts = plain.get("sshOpts") or []
    if isinstance(ssh_opts, str):
        ssh_opts = json.loads(ssh_opts)  # provider inputs arrive JSON-encoded
    return DockerHost(
        user=user or "root",
        address=address,
        port=int(port) if port else 22,
        ssh_opts=tuple(str(opt) for opt in ssh_opts),
    )


def docker_ssh_argv(host: DockerHost) -> list[str]:
    """The ssh the docker CLI's connhelper spawns: `ssh OPTS [-o ConnectTimeout=30] -T -l U -p P
    -- HOST`."""
    argv = ["ssh", *host.ssh_opts]
    if not any("ConnectTimeout" in opt for opt in host.ssh_opts):
        argv += ["-o", "ConnectTimeout=30"]
    return [*argv, "-T", "-l", host.user, "-p", str(host.port), "--", host.address]


def run_docker(
    host: DockerHost,
    docker_args: Sequence[str],
    stdin: str | None = None,
    timeout_s: float = DOCKER_CALL_TIMEOUT_S,
    prelude: str = "",
) -> RemoteResult:
    """Runs `docker ARGS` with the remote host's docker CLI (the remote shell parses the line)."""
    remote_line = prelude + shlex.join(["docker", *docker_args])
    try:
        return run_process([*docker_ssh_argv(host), remote_line], stdin, timeout_s)
    except TimeoutError as exc:
        raise TimeoutError(
            f"{host.label}: docker {short(shlex.join(docker_args))}: {exc}"
        ) from None


def docker_or_raise(host: DockerHost, docker_args: Sequence[str], action: str) -> str:
    result = run_docker(host, docker_args)
    if result.exit_code != 0:
        raise RuntimeError(f"{host.label}: {action}: {tail(result.stderr or result.stdout, 15)}")
    return result.stdout


def inspect_object(host: DockerHost, kind: str, name: str) -> dict[str, Any] | None:
    """`docker <kind> inspect name` as a dict; None when there is no such object."""
    result = run_docker(host, [kind, "inspect", name])
    if result.exit_code != 0:
        if result.is_ssh_failure:
            raise ConnectionError(f"{host.label}: {tail(result.stderr, 10)}")
        return None
    return json.loads(result.stdout)[0]


def inspect_image(host: DockerHost, name: str) -> dict[str, Any] | None:
    return inspect_object(host, "image", name)


def inspect_container(host: DockerHost, name: str) -> dict[str, Any] | None:
    return inspect_object(host, "container", name)


def as_the_api_made_it(inspect: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """`inspect` as it reads for a container the provider made through the API, with its whole
    `entrypoints` as Entrypoint: `docker run` takes a one-word `--entrypoint`, so the lab put
    the rest at the head of Cmd (container_run_args). A Cmd that does not start so is left as
    it is (what changed is then seen)."""
    entrypoints = [str(item) for item in unwrap_secrets(inputs.get("entrypoints")) or []]
    config = dict(inspect.get("Config") or {})
    cmd, extra = list(config.get("Cmd") or []), entrypoints[1:]
    if not extra or cmd[: len(extra)] != extra:
        return inspect
    config["Entrypoint"] = [*(config.get("Entrypoint") or []), *extra]
    config["Cmd"] = cmd[len(extra) :]
    return {**inspect, "Config": config}


def read_container_back(
    host: DockerHost, container_id: str, inputs: Mapping[str, Any]
) -> dict[str, Any] | None:
    """What pulumi-docker 5's read at refresh (resourceDockerContainerRead) writes back over a
    container's inputs, or None when it is gone: network and pid mode as Docker reports them
    (pid mode only when the state has one), mustRun false for a stopped container, and every
    other attribute the read writes back (tests/engine/container_read.py)."""
    found = inspect_container(host, container_id)
    if found is None:
        return None
    read = {"networkMode": found["HostConfig"]["NetworkMode"]}
    if inputs.get("pidMode"):
        read["pidMode"] = found["HostConfig"]["PidMode"]
    if not found["State"]["Running"]:
        read["mustRun"] = False
    made = as_the_api_made_it(found, dict(inputs))
    return {**read_container(made, inputs), **read}


def update_container(
    host: DockerHost, container_id: str, old: Mapping[str, Any], new: Mapping[str, Any]
) -> None:
    """terraform-provider-docker v4.5.0 resourceDockerContainerUpdate: the restart policy on
    the live container; mustRun false -> true starts it; the rest only changes the state."""
    if (old.get("restart"), old.get("maxRetryCount")) != (
        new.get("restart"),
        new.get("maxRetryCount"),
    ):
        policy = str(new.get("restart") or "no")
        if policy == "on-failure" and new.get("maxRetryCount"):
            policy += f":{int(new['maxRetryCount'])}"
        words = ["update", f"--restart={policy}", container_id]
        docker_or_raise(host, words, f"docker {' '.join(words)}")
    if new.get("mustRun", True) and not old.get("mustRun", True):
        docker_or_raise(host, ["start", container_id], f"docker start {container_id}")


def container_logs(host: DockerHost, name: str) -> str:
    result = run_docker(host, ["logs", "--tail", str(TAIL_LINES), name])
    return tail(result.stdout + result.stderr)


# ---------------------------------------------------------------------------------------------
# docker.Container inputs → `docker run`
# ---------------------------------------------------------------------------------------------

# Container inputs that only matter to the provider's own bookkeeping or to later updates.
CONTAINER_BOOKKEEPING_INPUTS = {
    "containerReadRefreshTimeoutMilliseconds",
    "destroyGraceSeconds",
    "removeVolumes",
    "mustRun",
    "wait",
    "waitTimeout",
    "start",
}


def mount_flag(mount: Mapping[str, Any]) -> str:
    parts = [f"type={mount['type']}", f"target={mount['target']}"]
    if mount.get("source"):
        parts.append(f"source={mount['source']}")
    if mount.get("readOnly"):
        parts.append("readonly")
    bind = mount.get("bindOptions") or {}
    if bind.get("propagation"):
        parts.append(f"bind-propagation={bind['propagation']}")
    tmpfs = mount.get("tmpfsOptions") or {}
    if tmpfs.get("sizeBytes") is not None:
        parts.append(f"tmpfs-size={int(tmpfs['sizeBytes'])}")
    if tmpfs.get("mode") is not None:
        parts.append(f"tmpfs-mode={int(tmpfs['mode']):o}")
    volume = mount.get("volumeOptions") or {}
    if is_set(volume):
        raise NotImplementedError("container mounts[].volumeOptions is not translated by realmocks")
    if any("," in part for part in parts):
        raise NotImplementedError(f"container mount field contains a comma: {parts}")
    return ",".join(parts)


def volume_flag(volume: Mapping[str, Any]) -> list[str]:
    if volume.get("fromContainer"):
        return ["--volumes-from", str(volume["fromContainer"])]
    source = volume.get("hostPath") or volume.get("volumeName")
    spec = f"{source}:{volume['containerPath']}" if source else str(volume["containerPath"])
    options = [
        opt
        for opt in ("ro" if volume.get("readOnly") else "", volume.get("selinuxRelabel") or "")
        if opt
    ]
    return ["-v", spec + (":" + ",".join(options) if options else "")]


def device_flag(device: Mapping[str, Any]) -> str:
    spec = str(device["hostPath"])
    spec += ":" + str(device.get("containerPath") or device["hostPath"])
    if device.get("permissions"):
        spec += ":" + str(device["permissions"])
    return spec


def healthcheck_flags(health: Mapping[str, Any]) -> list[str]:
    tests = [str(item) for item in health.get("tests") or []]
    flags: list[str] = []
    if tests:
        kind, rest = tests[0], tests[1:]
        if kind == "NONE":
            return ["--no-healthcheck"]
        if kind == "CMD-SHELL":
            flags += ["--health-cmd", " ".join(rest)]
        elif kind == "CMD":
            # The CLI only takes a shell string; quoting the argv keeps the same program and args.
            flags += ["--health-cmd", shlex.join(rest)]
        else:
            flags += ["--health-cmd", shlex.join(tests)]
    for key, flag in (
        ("interval", "--health-interval"),
        ("timeout", "--health-timeout"),
        ("startPeriod", "--health-start-period"),
        ("startInterval", "--health-start-interval"),
    ):
        if health.get(key) and health[key] != "0s":
            flags += [flag, str(health[key])]
    if health.get("retries") is not None:
        flags += ["--health-retries", str(int(health["retries"]))]
    return flags


def restart_flag(inputs: Mapping[str, Any]) -> list[str]:
    policy = inputs.get("restart")
    if not policy:
        return []
    if policy == "on-failure" and inputs.get("maxRetryCount"):
        return ["--restart", f"on-failure:{int(inputs['maxRetryCount'])}"]
    return ["--restart", str(policy)]


def container_run_args(inputs: Mapping[str, Any]) -> tuple[list[str], str]:
    """`docker run` options and image/args for the inputs, and the env-file text (K=V lines).

    Raises for any input that is set but has no translation, so nothing is dropped silently.
    """
    translated: set[str] = set(CONTAINER_BOOKKEEPING_INPUTS)
    flags: list[str] = []

    def take(key: str) -> Any:
        translated.add(key)
        return inputs.get(key)

    def simple(key: str, flag: str) -> None:
        value = take(key)
        if is_set(value):
            flags.extend([flag, str(value)])

    def boolean(key: str, flag: str) -> None:
        if take(key):
            flags.append(flag)

    name = take("name")
    if name:
        flags += ["--name", str(name)]
    simple("hostname", "--hostname")
    simple("domainname", "--domainname")
    simple("user", "--user")
    simple("workingDir", "--workdir")
    simple("networkMode", "--network")
    simple("ipcMode", "--ipc")
    simple("pidMode", "--pid")
    simple("utsMode", "--uts")
    simple("usernsMode", "--userns")
    simple("cgroupnsMode", "--cgroupns")
    simple("runtime", "--runtime")
    simple("stopSignal", "--stop-signal")
    simple("platform", "--platform")
    simple("gpus", "--gpus")
    simple("logDriver", "--log-driver")
    simple("cpuSet", "--cpuset-cpus")
    simple("cpus", "--cpus")
    boolean("privileged", "--privileged")
    boolean("init", "--init")
    boolean("readOnly", "--read-only")
    boolean("publishAllPorts", "--publish-all")
    translated.update({"restart", "maxRetryCount"})
    flags += restart_flag(inputs)
    if take("stopTimeout") is not None:
        flags += ["--stop-timeout", str(int(inputs["stopTimeout"]))]
    if is_set(take("shmSize")):
        flags += ["--shm-size", f"{int(inputs['shmSize'])}m"]  # MB, as pulumi-docker
    if is_set(take("memory")):
        flags += ["--memory", f"{int(inputs['memory'])}m"]
    if is_set(take("memorySwap")):
        swap = int(inputs["memorySwap"])
        flags += ["--memory-swap", "-1" if swap < 0 else f"{swap}m"]
    if is_set(take("cpuShares")):
        flags += ["--cpu-shares", str(int(inputs["cpuShares"]))]
    for ulimit in take("ulimits") or []:
        flags += ["--ulimit", f"{ulimit['name']}={int(ulimit['soft'])}:{int(ulimit['hard'])}"]
    for label in take("labels") or []:
        flags += ["--label", f"{label['label']}={label['value']}"]
    for key, value in (take("logOpts") or {}).items():
        flags += ["--log-opt", f"{key}={value}"]
    for mount in take("mounts") or []:
        flags += ["--mount", mount_flag(mount)]
    for volume in take("volumes") or []:
        flags += volume_flag(volume)
    for device in take("devices") or []:
        flags += ["--device", device_flag(device)]
    for path, options in (take("tmpfs") or {}).items():
        flags += ["--tmpfs", f"{path}:{options}" if options else path]
    for key, value in (take("sysctls") or {}).items():
        flags += ["--sysctl", f"{key}={value}"]
    for option in take("securityOpts") or []:
        flags += ["--security-opt", str(option)]
    for group in take("groupAdds") or []:
        flags += ["--group-add", str(group)]
    for server in take("dns") or []:
        flags += ["--dns", str(server)]
    for extra in take("hosts") or []:
        flags += ["--add-host", f"{extra['host']}:{extra['ip']}"]
    for port in take("ports") or []:
        spec = f"{int(port['external'])}:" if port.get("external") else ""
        if port.get("ip") and port.get("external"):
            spec = f"{port['ip']}:{spec}"
        flags += ["--publish", f"{spec}{int(port['internal'])}/{port.get('protocol') or 'tcp'}"]
    capabilities = take("capabilities") or {}
    for cap in capabilities.get("adds") or []:
        flags += ["--cap-add", str(cap)]
    for cap in capabilities.get("drops") or []:
        flags += ["--cap-drop", str(cap)]
    if is_set(take("healthcheck")):
        flags += healthcheck_flags(inputs["healthcheck"])

    entrypoints = [str(item) for item in take("entrypoints") or []]
    command = [str(item) for item in take("command") or []]
    if entrypoints:
        flags += ["--entrypoint", entrypoints[0]]
    image = take("image")
    if not image:
        raise ValueError("container has no image")
    # Like the provider, never pull implicitly: a missing image is an error, not a download.
    run_tail = ["--pull", "never", str(image), *entrypoints[1:], *command]

    env_lines = []
    for entry in take("envs") or []:
        if "\n" in str(entry):
            raise NotImplementedError(
                "container env values with newlines cannot go through an env file"
            )
        env_lines.append(str(entry))

    untranslated = sorted(
        key for key, value in inputs.items() if key not in translated and is_set(value)
    )
    if untranslated:
        raise NotImplementedError(
            "container inputs not translated by realmocks (set, so they would be dropped): "
            f"{untranslated}"
        )
    return [*flags, *run_tail], "".join(line + "\n" for line in env_lines)


# The env file lives only for the duration of `docker run`, in a private temp file on the host.
ENV_FILE_PRELUDE = (
    'umask 077; envf=$(mktemp) || exit 1; trap \'rm -f "$envf"\' EXIT; cat > "$envf" || exit 1; '
)


# ---------------------------------------------------------------------------------------------
# The journal: what was performed, for teardown
# ---------------------------------------------------------------------------------------------


@dataclass
class JournalEntry:
    type: str
    name: str
    key: str
    inputs: dict[str, Any] = field(repr=False)
    outputs: dict[str, Any] = field(repr=False)
    docker_host: DockerHost | None = None
    resource_id: str = ""  # the provider's ID of what it made
    options: RegistrationOptions | None = None  # as the program registered it (set by _record)
    # The old half of a replacement a failed run left in the state, marked for deletion: the
    # next run deletes it at its end (tests/lab/engine.py).
    pending_delete: bool = False
    # Deleted by a delete-before-replace whose create did not happen (tests/engine/steps.py).
    pending_replacement: bool = False
    # A create that failed after the provider made the resource (tests/engine/steps.py).
    init_errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class RegistrationOptions:
    """What the engine keeps of a registration besides its inputs (not in MockResourceArgs):
    its URN as the engine makes it, and what its aliases are made from."""

    urn: str
    dependencies: tuple[str, ...]
    replace_on_changes: tuple[str, ...]
    delete_before_replace: bool
    parent: str = ""
    aliases: tuple[AliasSpec, ...] = ()
    stack: str = ""
    project: str = ""
    # Which resources each input's value came from, and the provider's URN (what a cascade of
    # replacements follows: tests/engine/cascade.py).
    property_dependencies: tuple[tuple[str, tuple[str, ...]], ...] = ()
    provider_urn: str = ""


def entry_for(
    args: pulumi.runtime.MockResourceArgs,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    docker_host: DockerHost | None = None,
    resource_id: str = "",
) -> JournalEntry:
    """The state of one registration the mocks performed."""
    key = f"{args.typ}::{args.name}"
    return JournalEntry(args.typ, args.name, key, inputs, outputs, docker_host, resource_id)


class RunCancelled(Exception):
    """A step the engine did not start: an earlier step of the run failed."""


class TeardownError(Exception):
    """Every teardown step that failed, in the order they ran."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__("teardown failed:\n- " + "\n- ".join(failures))
        self.failures = failures


# ---------------------------------------------------------------------------------------------
# The mocks
# ---------------------------------------------------------------------------------------------


def refuse_previous_output_in_env(inputs: dict[str, Any], what: str) -> None:
    """pulumi-command (provider/pkg/provider/remote/commandOutputs.go `run`) passes a remote
    command's previous stdout and stderr as PULUMI_COMMAND_STDOUT/STDERR through an SSH `Setenv`
    unless `addPreviousOutputInEnv` is false; stock sshd refuses it (no AcceptEnv) and the
    provider only warns, so the command runs without them. The model never sets them either: a
    program must not rely on them, and says so by turning them off."""
    if unwrap_secrets(inputs.get("addPreviousOutputInEnv")) is not False:
        raise ValueError(
            f"{what}: `addPreviousOutputInEnv` is not false, but stock sshd refuses the "
            "previous output pulumi-command sets with Setenv; record what a step needs from "
            "its previous run on the host"
        )


class RealMocks(pulumi.runtime.Mocks):
    """Performs creates for real; thread-safe (the SDK calls mocks from a thread pool)."""

    def __init__(
        self,
        command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
    ) -> None:
        self.command_timeout_s = command_timeout_s
        self.journal: list[JournalEntry] = []
        self.warnings: list[str] = []
        self.stack_references: dict[str, dict[str, Any]] = {}
        # pulumi.log messages of the program (INFO and up), as "LEVEL: message".
        self.program_log: list[str] = []
        self._docker_hosts: dict[str, DockerHost] = {}
        self._lock = threading.Lock()
        # (type, name) -> the options of its registration, filled by OptionsMonitor.
        self.registrations: dict[tuple[str, str], RegistrationOptions] = {}
        # The run's first failed step: the engine starts no step after it (`new_resource`).
        self.first_failure: Exception | None = None
        # Each remote command's wall time, by resource name (the lab's figures read them).
        self.command_seconds: dict[str, float] = {}

    # -- pulumi.runtime.Mocks ------------------------------------------------------------------

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list[tuple[str, str]] | None]:
        if args.token == TOKEN_LOCAL_RUN:
            return self._local_run(args)
        raise NotImplementedError(f"realmocks does not perform invokes: {args.token}")

    def _local_run(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list[tuple[str, str]]]:
        """pulumi-command's `local.run` (provider/pkg/provider/local/commandOutputs.go): the
        command under `/bin/sh -c` with this process's environment plus `environment`, stdin
        when not empty; a non-zero exit is the invoke's error, with the output; stdout and
        stderr lose one trailing newline. Its error reaches the program as the engine sends it.
        """
        inputs = unwrap_secrets(dict(args.args))
        command = str(inputs["command"])
        if inputs.get("interpreter") or inputs.get("dir"):
            raise NotImplementedError("realmocks: local.run with interpreter/dir")
        env = {
            **os.environ,
            **{str(k): str(v) for k, v in (inputs.get("environment") or {}).items()},
        }
        stdin = inputs.get("stdin") or None
        try:
            result = run_process(["/bin/sh", "-c", command], stdin, self.command_timeout_s, env)
        except TimeoutError as exc:
            raise ProviderInvokeError(args.token, f"running {json.dumps(command)}: {exc}") from None
        if result.exit_code != 0:
            output = result.stdout + result.stderr
            # Go's %q is close to a JSON string for these commands.
            error = f"exit status {result.exit_code}: running {json.dumps(command)}:\n{output}"
            raise ProviderInvokeError(args.token, error)
        outputs = {
            **inputs,
            "stdout": result.stdout.removesuffix("\n"),
            "stderr": result.stderr.removesuffix("\n"),
        }
        return outputs, []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        """One step of the run. The first step that fails cancels the run: the engine's step
        executor checks its context before each step and starts none once a step failed
        (pulumi/pulumi v3.259 pkg/resource/deploy/step_executor.go `executeChain`,
        `cancelDueToError`; `--continue-on-error` is not modelled). Steps already running
        finish."""
        if args.custom and self.first_failure is not None:
            raise RunCancelled(f"{args.typ} {args.name!r}: not started: {self.first_failure}")
        try:
            return self.perform(args)
        except RunCancelled:
            raise
        except Exception as exc:
            with self._lock:
                if self.first_failure is None:
                    self.first_failure = exc
            raise

    def perform(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        """The step itself: a create (NextUp: whatever it plans)."""
        what = f"{args.typ} {args.name!r}"
        if args.typ == TYPE_DOCKER_PROVIDER:
            return self._create_docker_provider(args, what)
        if args.typ == TYPE_COMMAND:
            return self._create_command(args, what)
        if args.typ == TYPE_REMOTE_IMAGE:
            return self._create_remote_image(args, what)
        if args.typ == TYPE_CONTAINER:
            return self._create_container(args, what)
        if args.typ == TYPE_LOCAL_COMMAND:
            return self._create_local_command(args, what)
        if args.typ == TYPE_STACK_REFERENCE:
            return args.name, stack_reference_outputs(args, self.stack_references)
        if not args.custom:
            return None, dict(args.inputs)  # components have no create of their own
        raise NotImplementedError(
            f"realmocks cannot perform resource type {args.typ} ({args.name!r})"
        )

    # -- resource types ------------------------------------------------------------------------

    def _create_docker_provider(
        self, args: pulumi.runtime.MockResourceArgs, what: str
    ) -> tuple[str, dict]:
        docker_host = docker_host_from_provider_inputs(args.inputs, what)
        provider_id = f"{args.name}-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._docker_hosts[provider_id] = docker_host
        # In the state like any resource (its delete does nothing), so a next run finds it.
        self._record(
            entry_for(
                args,
                dict(args.inputs),
                dict(args.inputs),
                resource_id=provider_id,
            )
        )
        return provider_id, dict(args.inputs)

    def _create_command(self, args: pulumi.runtime.MockResourceArgs, what: str) -> tuple[str, dict]:
        inputs = args.inputs
        if is_set(unwrap_secrets(inputs.get("environment"))):
            raise ValueError(
                f"{what}: `environment` is set, but stock sshd drops it (no AcceptEnv); "
                "put values in the command or pass secrets on stdin"
            )
        refuse_previous_output_in_env(inputs, what)
        connection = connection_from_inputs(inputs.get("connection"), what)
        create = unwrap_secrets(inputs.get("create"))
        outputs = dict(inputs)
        if create:
            stdin = unwrap_secrets(inputs.get("stdin"))
            logging_mode = unwrap_secrets(inputs.get("logging"))
            started = time.monotonic()
            result = self._run_command(connection, str(create), stdin, what, logging_mode)
            self.command_seconds[args.name] = time.monotonic() - started
            outputs.update(
                stdout=result.stdout.removesuffix("\n"), stderr=result.stderr.removesuffix("\n")
            )
        else:
            outputs.update(stdout="", stderr="")
        command_id = f"{args.name}-{uuid.uuid4().hex[:12]}"
        self._record(
            entry_for(
                args,
                dict(inputs),
                outputs,
                resource_id=command_id,
            )
        )
        return command_id, outputs

    def _create_local_command(
        self, args: pulumi.runtime.MockResourceArgs, what: str
    ) -> tuple[str, dict]:
        """pulumi-command's local Command (provider/pkg/provider/local): `create` under
        `/bin/sh -c` in the program's directory, with stdin and `environment`; a non-zero exit
        fails the create; stdout and stderr lose one trailing newline."""
        inputs = args.inputs
        if unwrap_secrets(inputs.get("interpreter")) or unwrap_secrets(inputs.get("dir")):
            raise NotImplementedError(f"{what}: local Command with interpreter/dir")
        outputs = dict(inputs)
        create = unwrap_secrets(inputs.get("create"))
        if create:
            result = run_local(
                str(create),
                unwrap_secrets(inputs.get("stdin")),
                self.command_timeout_s,
                unwrap_secrets(inputs.get("environment")),
            )
            if result.exit_code != 0:
                output = tail(result.stderr or result.stdout, 10)
                raise RuntimeError(f"{what}: exit status {result.exit_code}: {output}")
            outputs.update(
                stdout=result.stdout.removesuffix("\n"), stderr=result.stderr.removesuffix("\n")
            )
        command_id = f"{args.name}-{uuid.uuid4().hex[:12]}"
        self._record(entry_for(args, dict(inputs), outputs, resource_id=command_id))
        return command_id, outputs

    def _run_command(
        self,
        connection: SshConnection,
        command: str,
        stdin: str | None,
        what: str,
        logging_mode: str | None,
    ) -> RemoteResult:
        warnings: list[str] = []
        try:
            result = run_over_ssh(connection, command, stdin, self.command_timeout_s, warnings)
        finally:
            self._warn(what, warnings)
        if result.invalid_utf8:
            # As the real provider's response fails (the command has run; nothing is recorded).
            raise RuntimeError(
                f"{what}: rpc error: code = Internal desc = grpc: error while marshaling: "
                "string field contains invalid UTF-8"
            )
        if result.exit_code != 0:
            raise command_failure(connection, command, result, what, logging_mode)
        return result

    def _create_remote_image(
        self, args: pulumi.runtime.MockResourceArgs, what: str
    ) -> tuple[str, dict]:
        inputs = args.inputs
        if is_set(inputs.get("build")):
            raise NotImplementedError(f"{what}: RemoteImage `build` is not performed by realmocks")
        docker_host = self._docker_host_for(args, what)
        name = str(inputs["name"])
        image = inspect_image(docker_host, name)
        if image is None:
            pull = [
                "pull",
                *(["--platform", str(inputs["platform"])] if inputs.get("platform") else []),
                name,
            ]
            docker_or_raise(docker_host, pull, f"{what}: pulling {name}")
            image = inspect_image(docker_host, name)
            if image is None:
                raise RuntimeError(
                    f"{what}: {name} still missing on {docker_host.label} after pull"
                )
        outputs = {
            **inputs,
            "name": name,
            "imageId": image["Id"],
            # The create ends with the provider's read: the digest of the name's repository,
            # not RepoDigests[0] (tests/engine/images.py).
            "repoDigest": repo_digest(name, list(image.get("RepoDigests") or [])),
        }
        image_resource_id = f"{image['Id']}{name}"  # the provider's id: image id + name
        self._record(
            entry_for(
                args,
                dict(inputs),
                outputs,
                docker_host,
                resource_id=image_resource_id,
            )
        )
        return image_resource_id, outputs

    def _create_container(
        self, args: pulumi.runtime.MockResourceArgs, what: str
    ) -> tuple[str, dict]:
        inputs = unwrap_secrets(dict(args.inputs))
        docker_host = self._docker_host_for(args, what)
        run_args, env_text = container_run_args(inputs)
        name = str(inputs.get("name") or "")
        verb = "run" if inputs.get("start", True) else "create"
        detach = ["-d"] if verb == "run" else []
        docker_args = [verb, *detach, "--env-file", "/dev/null", *run_args]
        prelude = ""
        if env_text:
            docker_args[docker_args.index("/dev/null")] = "ENVFILE"
            prelude = ENV_FILE_PRELUDE
        remote = run_docker_with_env_file(docker_host, docker_args, env_text, prelude)
        if remote.exit_code != 0:
            error = (
                f"{what}: Unable to create container on {docker_host.label}: "
                f"{tail(remote.stderr or remote.stdout, 15)}"
            )
            self._journal_failed_container(args, inputs, docker_host, name, remote, error)
            raise RuntimeError(error)
        container_id = remote.stdout.strip().splitlines()[-1]
        outputs = {**args.inputs, "name": name, "image": args.inputs["image"]}
        stored = dict(args.inputs)
        if (
            verb == "run"
            and inputs.get("mustRun", True)
            and not self._running(docker_host, container_id)
        ):
            # The create ends with a read (terraform-provider-docker v4.5.0
            # resource_docker_container_funcs.go: `return resourceDockerContainerRead`), which
            # stores must_run false for a container it sees stopped (read, 813-823): the next
            # plain `up` plans an update that starts it. The create itself never waits for the
            # container nor fails when it dies (since v4.0.0, PR #841): a container that dies at
            # start is seen by the steps that wait for it (Ray's join, vLLM's readiness).
            stored["mustRun"] = outputs["mustRun"] = False
        self._record(
            entry_for(
                args,
                stored,
                outputs,
                docker_host,
                resource_id=container_id,
            )
        )
        if inputs.get("wait"):
            wait_timeout = float(inputs.get("waitTimeout") or DEFAULT_CONTAINER_WAIT_TIMEOUT_S)
            wait_until_healthy(docker_host, container_id, wait_timeout, what)
        return container_id, outputs

    def _journal_failed_container(
        self,
        args: pulumi.runtime.MockResourceArgs,
        inputs: Mapping[str, Any],
        docker_host: DockerHost,
        name: str,
        remote: RemoteResult,
        error: str,
    ) -> None:
        """A container that was created but failed to start stays in the state with its ID and
        the error: the provider sets the ID right after ContainerCreate, before ContainerStart
        (terraform-provider-docker v4.5.0 resource_docker_container_funcs.go
        `resourceDockerContainerCreate`: `d.SetId(retContainer.ID)`, then "Unable to start
        container"), and the bridge returns that state with the error as an initialization
        error (pulumi-terraform-bridge `pkg/tfbridge/provider.go` `Create`:
        `initializationError(newstate.ID(), ...)`), which the engine keeps as the resource's
        state with its InitErrors (pulumi/pulumi step.go CreateStep.Apply). The next `up` plans
        an update, `up --refresh` starts it (tests/engine/steps.py). A name conflict leaves
        someone else's container, which must not be touched."""
        if not name or "is already in use" in remote.stderr:
            return
        found = inspect_container(docker_host, name)
        if found is not None:
            entry = entry_for(
                args,
                dict(args.inputs),
                {**args.inputs, "name": name, "image": inputs.get("image")},
                docker_host,
                resource_id=str(found["Id"]),
            )
            entry.init_errors = (error,)
            self._record(entry)

    @staticmethod
    def _running(docker_host: DockerHost, container_id: str) -> bool:
        """What the create's read sees: Docker's State.Running, which is true while a container
        waits for its restart too (moby container/state.go SetRestarting)."""
        return bool(container_state(docker_host, container_id).get("Running"))

    # -- bookkeeping ---------------------------------------------------------------------------

    def _docker_host_for(self, args: pulumi.runtime.MockResourceArgs, what: str) -> DockerHost:
        provider_ref = args.provider or ""
        provider_id = provider_ref.rsplit("::", 1)[-1] if "::" in provider_ref else ""
        with self._lock:
            docker_host = self._docker_hosts.get(provider_id)
        if docker_host is None:
            raise ValueError(
                f"{what}: no explicit docker provider (got {provider_ref!r}); every docker "
                "resource must name its host's docker.Provider"
            )
        return docker_host

    def _record(self, entry: JournalEntry) -> None:
        with self._lock:
            entry.options = self.registrations.get((entry.type, entry.name), entry.options)
            self.journal.append(entry)

    def _warn(self, what: str, warnings: list[str]) -> None:
        for warning in dict.fromkeys(warnings):
            message = f"{what}: {warning}"
            log.warning(message)
            with self._lock:
                self.warnings.append(message)

    def finish(self) -> None:
        """The engine's steps after the program's last registration (none for a first `up`)."""

    # -- teardown ------------------------------------------------------------------------------

    def state_entries(self) -> list[JournalEntry]:
        """What the stack's state holds after this run, oldest first."""
        with self._lock:
            return list(self.journal)

    def teardown(self) -> None:
        """`pulumi destroy`: undo everything the state holds, newest first; raises
        TeardownError listing every failure."""
        entries = self.state_entries()
        teardown(entries, self.command_timeout_s)
        with self._lock:
            done = {id(entry) for entry in entries}
            self.journal = [entry for entry in self.journal if id(entry) not in done]
        self.forget(entries)

    def forget(self, entries: list[JournalEntry]) -> None:
        """Entries that are gone from the hosts (a run's own bookkeeping hook)."""


def run_docker_with_env_file(
    docker_host: DockerHost, docker_args: list[str], env_text: str, prelude: str
) -> RemoteResult:
    """`docker run`, the env values streamed into a remote temp file (never on a command line)."""
    if not prelude:
        return run_docker(docker_host, docker_args)
    # The placeholder becomes "$envf", which must stay unquoted-expandable in the remote shell.
    line = shlex.join(["docker", *docker_args]).replace("ENVFILE", '"$envf"', 1)
    try:
        return run_process(
            [*docker_ssh_argv(docker_host), prelude + line], env_text, DOCKER_CALL_TIMEOUT_S
        )
    except TimeoutError as exc:
        raise TimeoutError(f"{docker_host.label}: docker run: {exc}") from None


def container_state(docker_host: DockerHost, container_id: str) -> dict[str, Any]:
    container = inspect_container(docker_host, container_id)
    if container is None:
        return {"Status": "dead", "ExitCode": None}
    return dict(container["State"])


def wait_until_healthy(
    docker_host: DockerHost, container_id: str, timeout_s: float, what: str
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        state = container_state(docker_host, container_id)
        health = (state.get("Health") or {}).get("Status")
        if health is None:
            raise RuntimeError(f"{what}: `wait` is set but the container has no healthcheck")
        if health == "healthy":
            return
        if state["Status"] != "running" or time.monotonic() >= deadline:
            raise RuntimeError(
                f"{what}: container did not become healthy within {timeout_s:.0f}s "
                f"(status {state['Status']}, health {health}); last log lines:\n"
                f"{container_logs(docker_host, container_id)}"
            )
        time.sleep(1.0)


def remove_container(docker_host: DockerHost, entry: JournalEntry) -> None:
    # By id when known: a container of the same name may since belong to a later deployment.
    target = entry.resource_id or str(entry.outputs.get("name") or "")
    grace = entry.inputs.get("destroyGraceSeconds")
    if grace:
        run_docker(docker_host, ["stop", "-t", str(int(grace)), target])
    remove_volumes = ["-v"] if entry.inputs.get("removeVolumes", True) else []
    result = run_docker(docker_host, ["rm", "-f", *remove_volumes, target])
    if result.exit_code != 0 and "No such container" not in result.stderr:
        raise RuntimeError(f"{docker_host.label}: docker rm {target}: {tail(result.stderr, 10)}")


def remove_image(docker_host: DockerHost, entry: JournalEntry) -> None:
    """What pulumi-docker does on destroy: `keepLocally` false (the default) removes the image."""
    if entry.inputs.get("keepLocally"):
        return
    force = ["-f"] if entry.inputs.get("forceRemove") else []
    result = run_docker(docker_host, ["rmi", *force, str(entry.outputs["name"])])
    if result.exit_code != 0 and "No such image" not in result.stderr:
        raise RuntimeError(f"{docker_host.label}: docker rmi: {tail(result.stderr, 10)}")


def run_local(
    command: str,
    stdin: str | None,
    timeout_s: float,
    environment: Mapping[str, Any] | None = None,
) -> RemoteResult:
    """As pulumi-command runs a local command: this process's environment plus `environment`."""
    env = {**os.environ, **{str(k): str(v) for k, v in (environment or {}).items()}}
    return run_process(["/bin/sh", "-c", command], stdin or None, timeout_s, env)


def stack_reference_outputs(
    args: pulumi.runtime.MockResourceArgs, references: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """A StackReference as the engine reads one: the other stack's outputs, and which of them
    are secrets (`secretOutputNames`, which the SDK uses to keep them secret here). `references`
    gives each stack's outputs, its secrets wrapped as the mock runtime wraps them."""
    outputs = references.get(args.name, {})
    return {
        **args.inputs,
        "outputs": {key: unwrap_secrets(value) for key, value in outputs.items()},
        "secretOutputNames": sorted(key for key, value in outputs.items() if is_secret(value)),
    }


def teardown_entry(entry: JournalEntry, command_timeout_s: float) -> None:
    if entry.type == TYPE_LOCAL_COMMAND:
        delete = unwrap_secrets(entry.inputs.get("delete"))
        if delete:
            result = run_local(
                str(delete),
                unwrap_secrets(entry.inputs.get("stdin")),
                command_timeout_s,
                unwrap_secrets(entry.inputs.get("environment")),
            )
            if result.exit_code != 0:
                raise RuntimeError(f"{entry.name}: delete: {tail(result.stderr, 10)}")
    elif entry.type == TYPE_COMMAND:
        delete = unwrap_secrets(entry.inputs.get("delete"))
        if delete:
            connection = connection_from_inputs(entry.inputs.get("connection"), entry.name)
            stdin = unwrap_secrets(entry.inputs.get("stdin"))
            result = run_over_ssh(connection, str(delete), stdin, command_timeout_s, [])
            logging_mode = unwrap_secrets(entry.inputs.get("logging"))
            if result.exit_code != 0:
                raise command_failure(connection, str(delete), result, "delete", logging_mode)
            if logging_mode != "none":
                # What a delete said (a kept rule, a directory left) shows beside a failed test.
                log.info("%s: delete: %s", entry.name, tail(result.stdout + result.stderr, 10))
    elif entry.type == TYPE_CONTAINER and entry.docker_host is not None:
        remove_container(entry.docker_host, entry)
    elif entry.type == TYPE_REMOTE_IMAGE and entry.docker_host is not None:
        remove_image(entry.docker_host, entry)


def delete_order(entries: Sequence[JournalEntry]) -> list[JournalEntry]:
    """Each entry after every entry that depends on it (the engine deletes in reverse
    dependency order, from the dependencies each registration named); otherwise newest first."""
    by_urn = {e.options.urn: e for e in entries if e.options is not None}
    dependents: dict[int, set[int]] = {id(e): set() for e in entries}
    for entry in entries:
        for urn in entry.options.dependencies if entry.options is not None else ():
            target = by_urn.get(urn)
            if target is not None and target is not entry:
                dependents[id(target)].add(id(entry))
    remaining, ordered = list(reversed(entries)), []
    done: set[int] = set()
    while remaining:
        ready = next((e for e in remaining if dependents[id(e)] <= done), remaining[0])
        ordered.append(ready)
        done.add(id(ready))
        remaining.remove(ready)
    return ordered


def teardown(
    journal: Sequence[JournalEntry], command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
) -> None:
    """Undoes journaled creates in reverse dependency order; keeps going past failures, then
    raises them all."""
    failures: list[str] = []
    for entry in delete_order(journal):
        try:
            teardown_entry(entry, command_timeout_s)
        except Exception as exc:  # collected, reported together below
            failures.append(f"{entry.type} {entry.name!r}: {exc}")
    if failures:
        raise TeardownError(failures)


# ---------------------------------------------------------------------------------------------
# Running a whole program under the mocks
# ---------------------------------------------------------------------------------------------


class StackOutputs(dict[str, Any]):
    """Resolved stack outputs (plain values); `secret_names` tells which outputs were secret."""

    def __init__(self, values: Mapping[str, Any], secret_names: set[str]) -> None:
        super().__init__(values)
        self.secret_names = frozenset(secret_names)


class OptionsMonitor(EngineUrns, pulumi_mocks.MockMonitor):
    """Hands the mocks what a registration says beyond its inputs (its URN as the engine
    makes it, aliases, dependencies, replaceOnChanges, deleteBeforeReplace), before they
    perform it."""

    def RegisterResource(self, request: Any) -> Any:
        if isinstance(self.mocks, RealMocks) and request.type != "pulumi:pulumi:Stack":
            self.mocks.registrations[(request.type, request.name)] = RegistrationOptions(
                urn=self.make_urn(request.parent, request.type, request.name),
                dependencies=tuple(request.dependencies),
                replace_on_changes=tuple(request.replaceOnChanges),
                delete_before_replace=request.deleteBeforeReplace,
                parent=request.parent,
                aliases=tuple(AliasSpec.from_request(a) for a in request.aliases),
                stack=pulumi.get_stack(),
                project=pulumi.get_project(),
                property_dependencies=property_dependencies(request),
                provider_urn=provider_urn(request.provider),
            )
        return super().RegisterResource(request)


def property_dependencies(request: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A RegisterResource request's propertyDependencies: input name -> resource URNs."""
    return tuple(
        (key, tuple(deps.urns)) for key, deps in sorted(request.propertyDependencies.items())
    )


def provider_urn(reference: str) -> str:
    """The URN of a provider reference `URN::ID` (sdk/go/common/providers ParseReference)."""
    return reference.rsplit("::", 1)[0] if reference else ""


def configure_mock_runtime(
    mocks: pulumi.runtime.Mocks, project: str, stack: str, root_directory: Path
) -> None:
    """What `set_mocks` does, minus creating a root Stack (run_in_stack creates its own, as the
    language host does), on freshly reset settings so a second run starts clean."""
    pulumi_settings.reset_options(
        project=project, stack=stack, root_directory=str(root_directory), preview=False
    )
    monitor = OptionsMonitor(mocks)
    settings = pulumi_mocks.MockSettings(
        monitor=monitor,
        monitor_features=set(monitor.GetDeploymentInfo(None).supportedFeatures),
        engine=pulumi_mocks.MockEngine(logging.getLogger(PROGRAM_LOGGER)),
        project=project,
        stack=stack,
        dry_run=False,
        organization="organization",
        root_directory=str(root_directory),
        callbacks=None,
    )
    pulumi_settings.configure(settings)


async def resolve_outputs(raw: Mapping[str, Any]) -> StackOutputs:
    values: dict[str, Any] = {}
    secret_names: set[str] = set()
    for name, value in raw.items():
        output = pulumi.Output.from_input(massage(value, []))
        values[name] = await output.future()
        if await output.is_secret():
            secret_names.add(name)
    return StackOutputs(values, secret_names)


def log_unretrieved_quietly(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """After a failed create, Pulumi leaves the dependents' futures failed and unretrieved (the run
    has already raised the original error). asyncio's default handler formats their tracebacks
    whenever the GC finalizes them, possibly on a worker thread; on CPython 3.11 that formatting
    calls ast.parse, whose AST state is shared between threads, and a race corrupts it for the rest
    of the process ("SystemError: AST constructor recursion depth mismatch"). One line, no
    traceback."""
    log.debug("asyncio: %s: %r", context.get("message"), context.get("exception"))


class ProgramLogCapture(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"{record.levelname}: {record.getMessage()}")


@contextlib.contextmanager
def captured_program_log(sink: list[str]) -> Iterator[None]:
    logger = logging.getLogger(PROGRAM_LOGGER)
    handler, old_level = ProgramLogCapture(sink), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@contextlib.contextmanager
def program_imports(program_dir: Path) -> Iterator[None]:
    """The program's directory on sys.path and as cwd (as the language host runs it); the program's
    own modules are forgotten afterwards so the next run imports them afresh. Modules of the
    same names imported from elsewhere (another copy of the project, as an upgrade test has)
    are set aside for the run, so the program imports its own."""
    shadowed = shadowed_modules(program_dir)
    for module_name in shadowed:
        del sys.modules[module_name]
    before = set(sys.modules)
    old_cwd = Path.cwd()
    sys.path.insert(0, str(program_dir))
    os.chdir(program_dir)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        with contextlib.suppress(ValueError):
            sys.path.remove(str(program_dir))
        for module_name in set(sys.modules) - before:
            if is_program_module(getattr(sys.modules[module_name], "__file__", None), program_dir):
                forget_module(module_name)
        sys.modules.update(shadowed)


def forget_module(module_name: str) -> None:
    """Drop a module, and its name from a parent package that stays loaded: `from package import
    name` reads the package's attribute first, so a kept package would hand the next run the
    forgotten module (its classes are not the next run's: isinstance fails)."""
    module = sys.modules.pop(module_name)
    parent_name, _, child = module_name.rpartition(".")
    parent = sys.modules.get(parent_name)
    if parent is not None and getattr(parent, child, None) is module:
        delattr(parent, child)


def shadowed_modules(program_dir: Path) -> dict[str, Any]:
    """Loaded modules whose top-level name the program directory also provides, loaded from
    another place."""
    local = {p.stem for p in program_dir.iterdir() if p.is_dir() or p.suffix == ".py"}
    local.discard("__main__")  # the test process's own entry point
    found = {}
    for module_name, module in list(sys.modules.items()):
        module_file = getattr(module, "__file__", None)
        if (
            module_name.split(".")[0] in local
            and module_file
            and not Path(module_file).resolve().is_relative_to(program_dir)
        ):
            found[module_name] = module
    return found


def is_program_module(module_file: str | None, program_dir: Path) -> bool:
    """A module of the program itself, not of an installed package: the project's venv usually
    lives inside the program directory, and re-importing the SDKs breaks their registrations
    ("Cannot re-register package command@...")."""
    if not module_file:
        return False
    path = Path(module_file).resolve()
    installed_roots = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if any(path.is_relative_to(root) for root in installed_roots):
        return False
    return path.is_relative_to(program_dir) and "site-packages" not in path.parts


def current_event_loop() -> asyncio.AbstractEventLoop | None:
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return None
    return None if loop.is_closed() or loop.is_running() else loop


def run_program(
    cli: PulumiCli, stack: str, mocks: RealMocks, max_parallel: int = 16
) -> StackOutputs:
    """Runs the project's `__main__.py` under `mocks` (an `up` from an empty state) and returns
    its resolved stack outputs. The run starts as the CLI starts one: the project and the stack's
    config pass the CLI's checks (a refusal raises `CliError`), and the program gets its config
    through PULUMI_CONFIG (tests/cli). Errors from creates or from the program propagate
    unchanged. Can be called repeatedly in one process; each run gets fresh runtime state and a
    fresh event loop."""
    program_config = cli.program_config(stack)
    program_dir = cli.project.path.parent.resolve()
    project = cli.project.name
    configure_mock_runtime(mocks, project, stack, program_dir)

    captured: dict[str, Any] = {}

    def program() -> None:
        captured["stack"] = pulumi_settings.get_root_resource()
        runpy.run_path(str(program_dir / "__main__.py"), run_name="__main__")

    previous_loop = current_event_loop()
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(log_unretrieved_quietly)
    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=max_parallel, thread_name_prefix="realmocks"
    )
    loop.set_default_executor(executor)
    asyncio.set_event_loop(loop)
    try:
        with (
            program_imports(program_dir),
            captured_program_log(mocks.program_log),
            handed_to_program(program_config),
        ):
            try:
                loop.run_until_complete(run_in_stack(program))
                outputs = loop.run_until_complete(resolve_outputs(captured["stack"].outputs))
            except Exception:
                # The run reports its first failed step, as `pulumi up` does; the steps it did
                # not start are no error of their own.
                if mocks.first_failure is not None:
                    raise mocks.first_failure from None
                raise
        mocks.finish()
        return outputs
    finally:
        # Creates still in flight after a failure finish here, so the journal is complete.
        executor.shutdown(wait=True)
        loop.close()
        # Code that runs Pulumi later in this process (mock tests) expects a usable current loop.
        asyncio.set_event_loop(previous_loop or asyncio.new_event_loop())
        # Collect the failed run's orphaned futures now, on this thread, not later from a worker.
        gc.collect()
        pulumi_settings.reset_options(project=project, stack=stack, preview=False)
