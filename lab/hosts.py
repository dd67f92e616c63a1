"""Simulated machines: their private files, their first process and their daemons."""

from __future__ import annotations

import functools
import http.client
import os
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lab.engines import DEFAULT_ENGINE, daemon_json, fetched_dir, storage_driver
from lab.net import NETNS_DIR
from lab.proc import SCRIPTS_DIR, LabError, ensure_ed25519_key, ok, run, tail, wait_until
from lab.spec import LabSpec

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
INIT_TIMEOUT = 15.0
SSHD_TIMEOUT = 15.0
DOCKERD_TIMEOUT = 60.0


@dataclass(frozen=True)
class Node:
    """One simulated machine as the lab builds it (bastion or Spark host)."""

    name: str
    netns: str
    hostdir: Path
    listen: tuple[str, ...]  # addresses sshd binds
    with_docker: bool
    cgroup_parent: str
    engine: str = DEFAULT_ENGINE  # lab/engines.py
    engine_dir: Path | None = None  # its unpacked binaries (None: the machine's own Docker)

    @property
    def host_key_path(self) -> Path:
        # Where a real machine keeps it (the host's own /etc/ssh is bound over the machine's):
        # what a step reads from /etc/ssh/ssh_host_*_key.pub is the key its sshd presents.
        return self.hostdir / "etc" / "ssh" / "ssh_host_ed25519_key"

    @property
    def init_pid_file(self) -> Path:
        return self.hostdir / "init.pid"

    @property
    def ready_file(self) -> Path:
        return self.hostdir / "init.ready"


def hosts_dir(state_dir: Path) -> Path:
    return state_dir / "hosts"


def nodes_of(spec: LabSpec) -> list[Node]:
    """Bastion first (if any), then spark1..N."""
    nodes: list[Node] = []
    base = hosts_dir(spec.state_dir)
    if spec.topology == "bastion":
        nodes.append(
            Node(
                "bastion",
                spec.netns("bastion"),
                base / "bastion",
                (spec.outside_far_ip, spec.bastion_mgmt_ip),
                False,
                spec.cgroup_parent("bastion"),
            )
        )
    for i, name in enumerate(spec.host_names):
        listen: tuple[str, ...] = (spec.host_mgmt_ip(i), spec.host_fabric_ip(i))
        if spec.topology == "jump" and i == 0:
            listen = (*listen, spec.outside_far_ip)
        engine = spec.engine(i)
        nodes.append(
            Node(
                name,
                spec.netns(name),
                base / name,
                listen,
                True,
                spec.cgroup_parent(name),
                engine,
                fetched_dir(spec.cache_dir, engine),
            )
        )
    return nodes


# -- private files ------------------------------------------------------------------------------


def etc_hosts(spec: LabSpec, me: str, my_ip: str) -> str:
    """Like a real machine: localhost and its own name only (the program must not rely on
    the lab having taught hosts each other's names)."""
    return f"127.0.0.1\tlocalhost\n{my_ip}\t{me}\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def prepare_files(spec: LabSpec, node: Node, client_pubkey: str) -> None:
    for sub in ("root/.ssh", "etc/docker", "tmp", "ssh", "log", "mnt"):
        (node.hostdir / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(node.hostdir / "root", 0o700)
    os.chmod(node.hostdir / "root/.ssh", 0o700)
    os.chmod(node.hostdir / "tmp", 0o1777)
    auth = node.hostdir / "root/.ssh/authorized_keys"
    auth.write_text(client_pubkey.strip() + "\n")  # the lab's client key only: no host trust
    auth.chmod(0o600)
    (node.hostdir / "etc/hosts").write_text(etc_hosts(spec, node.name, node.listen[0]))
    (node.hostdir / "etc/hostname").write_text(node.name + "\n")
    (node.hostdir / "etc/docker/daemon.json").write_text(daemon_json(node.engine))
    own_etc_ssh(node.hostdir / "etc/ssh")
    ensure_ed25519_key(node.host_key_path, f"{node.name}-host", f"{node.name}: host key")
    listen = "\n".join(f"ListenAddress {addr}" for addr in node.listen)
    config = (TEMPLATES_DIR / "sshd_config.in").read_text()
    config = config.format(name=node.name, listen=listen, hostdir=node.hostdir)
    (node.hostdir / "ssh/sshd_config").write_text(config)


def own_etc_ssh(target: Path) -> None:
    """The machine's /etc/ssh (client config, moduli) without its host keys: each host has one
    key of its own there."""
    shutil.copytree(
        "/etc/ssh",
        target,
        ignore=shutil.ignore_patterns("ssh_host_*"),
        dirs_exist_ok=True,
        symlinks=True,
    )


def host_public_key(node: Node) -> str:
    """'ssh-ed25519 AAAA...' without the comment."""
    fields = node.host_key_path.with_suffix(".pub").read_text().split()
    return f"{fields[0]} {fields[1]}"


# -- first process ------------------------------------------------------------------------------


def read_init_pid(node: Node) -> int | None:
    try:
        pid = int(node.init_pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(tok) for tok in text.split()]


def start_init(spec: LabSpec, node: Node) -> int:
    """Start the host's first process and return its pid as this machine sees it."""
    existing = read_init_pid(node)
    if existing:
        return existing
    node.ready_file.unlink(missing_ok=True)
    log = (node.hostdir / "log" / "init.log").open("ab")
    argv = [
        "nsenter",
        f"--net={NETNS_DIR / node.netns}",
        "--",
        "unshare",
        "--mount",
        "--uts",
        "--ipc",
        "--pid",
        "--fork",
        "--kill-child",
        "--propagation",
        "private",
        "--",
        "/bin/bash",
        str(host_visible_script(node, "host-init.sh")),
        node.name,
        str(node.hostdir),
        spec.shm_size,
        str(node.engine_dir or ""),
    ]
    # A session of its own: the host outlives this Python process (the CLI exits after `up`).
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
    )
    log.close()
    wait_until(
        lambda: node.ready_file.exists() or proc.poll() is not None,
        timeout=INIT_TIMEOUT,
        what=f"{node.name}: first process (host-init.sh) ready",
        detail=lambda: tail(node.hostdir / "log" / "init.log"),
    )
    if proc.poll() is not None:
        raise LabError(
            f"{node.name}: host-init.sh exited with {proc.returncode}\n"
            + tail(node.hostdir / "log" / "init.log")
        )
    # unshare --fork: its only child is the init script, which became tini (PID 1 inside).
    children = child_pids(proc.pid)
    if len(children) != 1:
        raise LabError(f"{node.name}: expected one child of unshare {proc.pid}, got {children}")
    node.init_pid_file.write_text(f"{children[0]}\n")
    (node.hostdir / "unshare.pid").write_text(f"{proc.pid}\n")
    return children[0]


def in_host(pid: int, argv: list[str]) -> list[str]:
    """argv run inside every namespace (and the root dir) of the host whose PID 1 is pid."""
    return ["nsenter", "-t", str(pid), "-a", "--", *argv]


# -- daemons ------------------------------------------------------------------------------------


def host_visible_script(node: Node, name: str) -> Path:
    """A copy of lab/scripts/<name> in the host's own dir: the checkout may live under a path
    every host hides (a clone under /tmp), while the state dir never does (LabSpec checks it)."""
    copy = node.hostdir / name
    shutil.copyfile(SCRIPTS_DIR / name, copy)
    return copy


def start_daemons(node: Node, pid: int) -> None:
    argv = [
        "/bin/bash",
        str(host_visible_script(node, "host-daemons.sh")),
        str(node.hostdir),
        "1" if node.with_docker else "0",
        node.cgroup_parent,
        str(node.engine_dir or ""),
        storage_driver(node.engine),
    ]
    run(in_host(pid, argv), timeout=30, what=f"{node.name}: start daemons (host-daemons.sh)")


def tcp_open_from(netns: str, addr: str, port: int) -> bool:
    """Probe addr:port from inside netns (bash /dev/tcp: busybox wget crashes on refusal)."""
    return ok(
        [
            "nsenter",
            f"--net={NETNS_DIR / netns}",
            "--",
            "timeout",
            "3",
            "bash",
            "-c",
            f"exec 3<>/dev/tcp/{addr}/{port}",
        ],
        timeout=5,
    )


def wait_sshd(node: Node) -> None:
    for addr in node.listen:
        wait_until(
            functools.partial(tcp_open_from, node.netns, addr, 22),
            timeout=SSHD_TIMEOUT,
            what=f"{node.name}: sshd listening on {addr}:22",
            detail=lambda: tail(node.hostdir / "log" / "sshd.log"),
        )


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=3)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(3)
        sock.connect(self._path)
        self.sock = sock


def docker_ping(pid: int) -> bool:
    """GET /_ping on the host's docker socket, reached through its PID 1's view of the files."""
    conn = _UnixHTTPConnection(f"/proc/{pid}/root/run/docker.sock")
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().read() == b"OK"
    except OSError:
        return False
    finally:
        conn.close()


def wait_dockerd(node: Node, pid: int) -> None:
    wait_until(
        lambda: docker_ping(pid),
        timeout=DOCKERD_TIMEOUT,
        interval=0.2,
        what=f"{node.name}: dockerd answering on /run/docker.sock",
        detail=lambda: tail(node.hostdir / "log" / "dockerd.log"),
    )


def bring_up(spec: LabSpec, node: Node) -> int:
    pid = start_init(spec, node)
    start_daemons(node, pid)
    return pid


def wait_ready(node: Node, pid: int) -> None:
    wait_sshd(node)
    if node.with_docker:
        wait_dockerd(node, pid)


# -- teardown -----------------------------------------------------------------------------------


def stop_containers_and_dockerd(node: Node, pid: int) -> None:
    """Remove containers first (their cgroups go with them), then stop dockerd cleanly so it
    unmounts its overlays; raylet ignores SIGTERM, so containers are removed with -f (SIGKILL)."""
    if not node.with_docker or not docker_ping(pid):
        return
    listing = run(in_host(pid, ["docker", "ps", "-aq"]), timeout=30, check=False)
    ids = listing.stdout.decode().split()
    if ids:
        run(in_host(pid, ["docker", "rm", "-f", *ids]), timeout=60, check=False)
    stop_dockerd(node, pid, timeout=20)


def stop_dockerd(node: Node, pid: int, timeout: float) -> None:
    """SIGTERM to the host's dockerd (it stops its containers first), then wait for its exit."""
    dockerd_pid = _read_pid(Path(f"/proc/{pid}/root/run/docker.pid"))
    if dockerd_pid is None:
        return
    # The pid file holds dockerd's pid inside the host; signal it from inside too.
    ok(in_host(pid, ["kill", "-TERM", str(dockerd_pid)]), timeout=10)
    wait_until(
        lambda: not ok(in_host(pid, ["kill", "-0", str(dockerd_pid)]), timeout=5),
        timeout=timeout,
        interval=0.2,
        what=f"{node.name}: dockerd exit after SIGTERM",
    )


def shut_down(node: Node, pid: int) -> None:
    """What a reboot's shutdown does to a host: dockerd stops its containers (their stop
    signal, then SIGKILL after its shutdown timeout) and exits, sshd exits, and the firewall
    rules, which live in the kernel, are gone. Files on disk stay."""
    if node.with_docker:
        stop_dockerd(node, pid, timeout=90)
    sshd_pid = _read_pid(Path(f"/proc/{pid}/root/run/sshd.pid"))
    if sshd_pid is not None:
        ok(in_host(pid, ["kill", "-TERM", str(sshd_pid)]), timeout=10)
    flush = "for t in iptables ip6tables; do $t -w 5 -F && $t -w 5 -X; done"
    ok(in_host(pid, ["sh", "-c", flush]), timeout=20)


def boot(node: Node, pid: int) -> None:
    """The daemons start again, as at boot; dockerd restarts containers by their policy."""
    start_daemons(node, pid)
    wait_ready(node, pid)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def kill_host(node: Node) -> None:
    """Killing PID 1 of the host's PID namespace ends every process in it (containers too)."""
    for pid_file in (node.init_pid_file, node.hostdir / "unshare.pid"):
        pid = _read_pid(pid_file)
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            wait_until(
                functools.partial(_gone, pid),
                timeout=10,
                what=f"{node.name}: process {pid} gone after SIGKILL",
            )
        pid_file.unlink(missing_ok=True)
    node.ready_file.unlink(missing_ok=True)


def _gone(pid: int) -> bool:
    """Dead, or a zombie waiting for a parent that is not us to reap it."""
    return not pid_alive(pid) or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
