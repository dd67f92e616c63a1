"""Lab: bring a lab up, check it, run commands in it, tear it down."""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from lab import client, engines, hfmodel, image, net
from lab.hosts import (
    Node,
    boot,
    bring_up,
    docker_ping,
    host_public_key,
    hosts_dir,
    in_host,
    kill_host,
    nodes_of,
    prepare_files,
    read_init_pid,
    shut_down,
    stop_containers_and_dockerd,
    tcp_open_from,
    wait_ready,
)
from lab.proc import LabError, run, wait_until
from lab.spec import (
    HF_MODEL,
    HF_REVISION,
    IMAGE_NAME,
    BastionInfo,
    HostInfo,
    LabInfo,
    LabSpec,
)

REQUIRED_TOOLS = (
    "ip",
    "nsenter",
    "unshare",
    "tini",
    "sshd",
    "ssh",
    "ssh-keygen",
    "dockerd",
    "containerd",
    "runc",
    "docker",
    "tar",
    "ldd",
    "dpkg-query",
    "timeout",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
LOCK_TIMEOUT = 600.0
log = logging.getLogger("lab")


def missing_prerequisites(spec: LabSpec | None = None) -> list[str]:
    """What keeps a lab from starting here (empty: nothing)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (euid 0)")
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    tools = list(REQUIRED_TOOLS) + (["tc"] if spec and spec.fabric_rate else [])
    missing += [f"tool {t}" for t in tools if shutil.which(t, path=path) is None]
    if not Path("/usr/bin/python3").exists():
        missing.append("/usr/bin/python3")
    return missing


class Lab:
    def __init__(self, spec: LabSpec | None = None) -> None:
        self.spec = spec or LabSpec()
        self.state_dir = self.spec.state_dir
        self.timings: dict[str, float] = {}

    # -- paths ----------------------------------------------------------------------------------

    @property
    def lab_json(self) -> Path:
        return self.state_dir / "lab.json"

    def info(self) -> LabInfo:
        """The running lab's description (raises if it is not up)."""
        if not self.lab_json.exists():
            raise LabError(f"no lab is up in {self.state_dir} ({self.lab_json} missing)")
        return LabInfo.from_json(self.lab_json.read_text())

    def node(self, name: str) -> Node:
        for node in nodes_of(self.spec):
            if node.name == name:
                return node
        raise LabError(f"no host {name!r} in this lab")

    # -- up -------------------------------------------------------------------------------------

    def up(self) -> LabInfo:
        """Bring the lab up; if it is already up and healthy, return its info unchanged."""
        self._check_prerequisites()
        with self._locked():
            return self._up()

    def _up(self) -> LabInfo:
        if self.lab_json.exists():
            existing = self.info()
            if existing.extra.get("spec") != self._spec_record():
                raise LabError(
                    f"a lab with another spec is up in {self.state_dir}; "
                    "run `python -m lab down` first"
                )
            problems = self.problems()
            if not problems:
                self._restore_content(existing)
                return existing
            # Something died since: rebuild from a clean slate rather than patch it up.
            self.down()
        elif self._leftovers():
            self.down()  # a partial or failed earlier `up`
        return self._build()

    def _restore_content(self, info: LabInfo) -> None:
        """Put back the head's image or seeded model if a test or user removed them (cheap when
        both are there: one `docker image inspect`)."""
        head = self.node(info.head.name)
        pid = read_init_pid(head)
        if pid is None:
            return
        if self.spec.with_model:
            self._seed_models(head)
        if self.spec.with_image:
            present = run(
                in_host(pid, ["docker", "image", "inspect", IMAGE_NAME]), timeout=30, check=False
            )
            if present.returncode != 0:
                path, digest = image.rootfs_tarball(self.spec.cache_dir, self.spec.vllm)
                self._import_image(head, {head.name: pid}, path, digest)

    def _seed_models(self, head: Node) -> None:
        """The lab's models in the head's HF cache: the stand-in's, or with `vllm: real` the
        tiny real model its image's build wrote."""
        real_model = None
        if self.spec.vllm == "real":
            tarball, _ = image.rootfs_tarball(self.spec.cache_dir, "real")
            real_model = image.model_dir(tarball)
        hfmodel.seed_models(head.hostdir / "root/.cache/huggingface", real_model)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One up/down at a time per state dir (bounded wait, then a clear error)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / ".lock").open("w") as handle:

            def take() -> bool:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                return True

            wait_until(
                take,
                timeout=LOCK_TIMEOUT,
                interval=0.5,
                what=f"lock {self.state_dir}/.lock (another up/down running)",
            )
            yield

    def _check_prerequisites(self) -> None:
        missing = missing_prerequisites(self.spec)
        if missing:
            raise LabError(
                "lab prerequisites missing: "
                + ", ".join(missing)
                + " (install with lab/install-deps.sh, run as root)"
            )

    def _spec_record(self) -> dict[str, object]:
        record = asdict(self.spec)
        return json.loads(json.dumps(record, default=str))  # type: ignore[no-any-return]

    def _build(self) -> LabInfo:
        started = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        (self.state_dir / "spec.json").write_text(json.dumps(self._spec_record(), indent=2))
        key = client.ensure_client_key(self.state_dir)
        pubkey = key.with_suffix(".pub").read_text()
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            # The image build (first time ~1 min, cached ~0 s) overlaps with the hosts starting.
            tarball = (
                pool.submit(image.rootfs_tarball, self.spec.cache_dir, self.spec.vllm)
                if self.spec.with_image
                else None
            )
            for engine in sorted(set(self.spec.engines)):
                engines.ensure_fetched(self.spec.cache_dir, engine)
            net.build_network(self.spec)
            nodes = nodes_of(self.spec)
            pids = {}
            for node in nodes:
                prepare_files(self.spec, node, pubkey)
                pids[node.name] = bring_up(self.spec, node)
            for node in nodes:
                wait_ready(node, pids[node.name])
            self.timings["hosts"] = time.monotonic() - started
            info = self._describe(nodes)
            self._write_client_files(info)
            if tarball is not None:
                path, digest = tarball.result(timeout=1800)
                self.timings["image_build"] = time.monotonic() - started
                self._import_image(self.node(self.spec.host_names[0]), pids, path, digest)
            if self.spec.with_model:
                self._seed_models(self.node(info.head.name))
        self.timings["total"] = time.monotonic() - started
        info.extra["timings"] = dict(self.timings)
        self.lab_json.write_text(info.to_json())  # written last: its presence means "up"
        return info

    def _describe(self, nodes: list[Node]) -> LabInfo:
        spec = self.spec
        hosts = [
            HostInfo(
                name=name,
                mgmt_ip=spec.host_mgmt_ip(i),
                fabric_ip=spec.host_fabric_ip(i),
                fabric_ifname=spec.fabric_ifname(i),
                ssh_port=22,
                user="root",
                host_key=host_public_key(self.node(name)),
                netns=spec.netns(name),
                is_head=(i == 0),
                engine=spec.engine(i),
            )
            for i, name in enumerate(spec.host_names)
        ]
        bastion = None
        if spec.topology == "bastion":
            bastion = BastionInfo(
                address=spec.outside_far_ip,
                mgmt_ip=spec.bastion_mgmt_ip,
                ssh_port=22,
                user="root",
                host_key=host_public_key(self.node("bastion")),
                netns=spec.netns("bastion"),
            )
        return LabInfo(
            topology=spec.topology,
            prefix=spec.prefix,
            state_dir=str(self.state_dir),
            client_key=str(self.state_dir / "id_ed25519"),
            known_hosts=str(self.state_dir / "known_hosts"),
            ssh_config=str(self.state_dir / "ssh_config"),
            image=IMAGE_NAME if spec.with_image else "",
            hf_model=HF_MODEL,
            hf_revision=HF_REVISION,
            hosts=hosts,
            bastion=bastion,
            mgmt_subnet=spec.mgmt_subnet,
            fabric_subnet=spec.fabric_subnet,
            outside_subnet=spec.outside_subnet,
            extra={
                "outside_far_ip": spec.outside_far_ip,
                "outside_root_ip": spec.outside_root_ip,
                "spec": self._spec_record(),
            },
        )

    def _write_client_files(self, info: LabInfo) -> None:
        Path(info.known_hosts).write_text(client.known_hosts_text(info))
        Path(info.ssh_config).write_text(client.ssh_config_text(info))
        (self.state_dir / "cm").mkdir(mode=0o700, exist_ok=True)

    def _import_image(self, head: Node, pids: dict[str, int], tar: Path, digest: str) -> None:
        pid = pids[head.name]
        label = run(
            in_host(
                pid,
                [
                    "docker",
                    "image",
                    "inspect",
                    IMAGE_NAME,
                    "--format",
                    f'{{{{index .Config.Labels "{image.IMAGE_LABEL}"}}}}',
                ],
            ),
            timeout=30,
            check=False,
        )
        if label.returncode == 0 and label.stdout.decode().strip() == digest:
            return
        started = time.monotonic()
        with tar.open("rb") as stdin:
            done = subprocess.run(
                in_host(pid, image.import_argv(digest)),
                stdin=stdin,
                capture_output=True,
                timeout=600,
            )
        if done.returncode != 0:
            raise LabError(
                f"{head.name}: docker import of {tar} failed: "
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )
        self.timings["image_import"] = time.monotonic() - started

    def import_tarball(self, host: str, tar: Path, argv: list[str], timeout: float = 300) -> None:
        """`argv` (a `docker import - NAME` command line) on `host`, reading `tar`: an image the
        lab builds, where users' hosts would pull one."""
        pid = read_init_pid(self.node(host))
        if pid is None:
            raise LabError(f"{host}: not running")
        with tar.open("rb") as stdin:
            done = subprocess.run(
                in_host(pid, argv), stdin=stdin, capture_output=True, timeout=timeout
            )
        if done.returncode != 0:
            raise LabError(
                f"{host}: {' '.join(argv)} of {tar} failed: "
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )

    # -- checks ---------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """What is wrong with the running lab (empty: healthy)."""
        found = []
        for node in nodes_of(self.spec):
            if not net.netns_exists(node.netns):
                found.append(f"{node.name}: netns {node.netns} missing")
                continue
            pid = read_init_pid(node)
            if pid is None:
                found.append(f"{node.name}: first process not running")
                continue
            for addr in node.listen:
                if not tcp_open_from(node.netns, addr, 22):
                    found.append(f"{node.name}: sshd not answering on {addr}:22")
            if node.with_docker and not docker_ping(pid):
                found.append(f"{node.name}: dockerd not answering")
        return found

    def _leftovers(self) -> bool:
        return bool(net.lab_netns_names(self.spec)) or hosts_dir(self.state_dir).exists()

    # -- running commands -----------------------------------------------------------------------

    def ssh(
        self,
        host: str,
        command: str,
        *,
        timeout: float = 60,
        check: bool = True,
        multiplex: bool = True,
        extra_options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run command on host as a client of the lab would: ssh from this machine through the
        bastion (or the head), with the lab key and pinned host keys. extra_options go before
        the destination (e.g. ["-o", "SendEnv=X"]); env is the ssh client's environment."""
        info = self.info()
        argv = client.ssh_argv(
            info, info.host(host), command, multiplex=multiplex, extra_options=extra_options
        )
        return self._run_text(argv, timeout, check, f"ssh {host}: {command}", env=env)

    def ssh_bastion(
        self, command: str, *, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        info = self.info()
        if info.bastion is None:
            raise LabError("this lab has no bastion (topology jump)")
        b = info.bastion
        argv = [
            client.SSH,
            *client.common_options(info),
            "-p",
            str(b.ssh_port),
            f"{b.user}@{b.address}",
            "--",
            command,
        ]
        return self._run_text(argv, timeout, check, f"ssh bastion: {command}")

    def exec(
        self,
        host: str,
        argv: list[str],
        *,
        timeout: float = 60,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv directly inside host's namespaces (nsenter), bypassing ssh: for assertions."""
        pid = read_init_pid(self.node(host))
        if pid is None:
            raise LabError(f"{host}: not running")
        return self._run_text(in_host(pid, argv), timeout, check, f"{host}: {argv}", input)

    def sh(
        self, host: str, script: str, *, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """exec() of a bash -c script."""
        return self.exec(host, ["bash", "-c", script], timeout=timeout, check=check)

    @staticmethod
    def _run_text(
        argv: list[str],
        timeout: float,
        check: bool,
        what: str,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(
                argv,
                env=dict(env) if env is not None else None,
                capture_output=True,
                text=True,
                timeout=timeout,
                input=input,
                stdin=None if input is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"{what}: timed out after {timeout:.0f}s") from exc
        if check and done.returncode != 0:
            raise LabError(
                f"{what}: exit {done.returncode}\nstdout: {done.stdout[-2000:]}\n"
                f"stderr: {done.stderr[-2000:]}"
            )
        return done

    def reboot(self, *hosts: str) -> None:
        """Reboot these hosts together: every one shuts down (dockerd stops its containers,
        sshd exits, firewall rules go), then every one boots (daemons start again; dockerd
        restarts containers by their restart policy). Nothing else is done for them."""
        nodes = [self.node(h) for h in hosts]
        found = {n.name: read_init_pid(n) for n in nodes}
        pids = {name: pid for name, pid in found.items() if pid is not None}
        if len(pids) != len(nodes):
            raise LabError(f"cannot reboot {sorted(set(found) - set(pids))}: not running")
        with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
            list(pool.map(lambda n: shut_down(n, pids[n.name]), nodes))
            list(pool.map(lambda n: boot(n, pids[n.name]), nodes))

    def ssh_options(self, host: str) -> list[str]:
        """OpenSSH client arguments that reach host (for pulumi_docker ssh_opts and the like)."""
        info = self.info()
        return client.ssh_options(info, info.host(host))

    # -- down -----------------------------------------------------------------------------------

    def down(self) -> None:
        """Remove everything `up` (even a failed one) created, except the client key and the
        image cache. Safe to call twice. Tears down what lab.json recorded when it differs
        from this Lab's spec (e.g. `up --prefix x` followed by a plain `down`)."""
        self._check_prerequisites()
        with self._locked():
            recorded = self._recorded_spec()
            if recorded is not None and recorded != self.spec:
                # Only the recorded one: this spec's names may belong to another lab.
                Lab(recorded)._teardown()
            else:
                self._teardown()

    def _recorded_spec(self) -> LabSpec | None:
        """The spec the last `up` in this state dir started with (written before anything else,
        so a failed `up` with other subnets or prefix is still torn down completely)."""
        try:
            record = json.loads((self.state_dir / "spec.json").read_text())
            return LabSpec(
                **{
                    **record,
                    "state_dir": Path(record["state_dir"]),
                    "cache_dir": Path(record["cache_dir"]),
                    "fabric_ifnames": tuple(record["fabric_ifnames"]),
                }
            )
        except (OSError, KeyError, TypeError, ValueError):
            return None

    def _teardown(self) -> None:
        client.close_control_masters(self.state_dir)
        for node in self._all_nodes():
            pid = read_init_pid(node)
            if pid is not None:
                try:
                    stop_containers_and_dockerd(node, pid)
                except LabError as exc:
                    # Killing the host below still ends dockerd and its containers.
                    log.warning("%s; killing the host anyway", exc)
            kill_host(node)
        self._kill_netns_stragglers()
        net.delete_network(self.spec)
        remove_cgroups(self.spec.prefix)
        self._check_no_mounts()
        for leftover in ("lab.json", "known_hosts", "ssh_config", "spec.json"):
            (self.state_dir / leftover).unlink(missing_ok=True)
        if hosts_dir(self.state_dir).exists():
            shutil.rmtree(hosts_dir(self.state_dir))

    def _all_nodes(self) -> list[Node]:
        """The spec's nodes plus any host dir left by an earlier run with more hosts."""
        nodes = nodes_of(self.spec)
        known = {n.name for n in nodes}
        base = hosts_dir(self.state_dir)
        if base.is_dir():
            for extra in sorted(p for p in base.iterdir() if p.is_dir() and p.name not in known):
                nodes.append(
                    Node(
                        extra.name,
                        self.spec.netns(extra.name),
                        extra,
                        (),
                        True,
                        self.spec.cgroup_parent(extra.name),
                    )
                )
        return nodes

    def _kill_netns_stragglers(self) -> None:
        """Processes someone started in a lab netns by hand (nsenter, ip netns exec)."""
        for ns in net.lab_netns_names(self.spec):
            for pid in net.netns_pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_until(
                functools.partial(net.netns_empty, ns),
                timeout=10,
                what=f"netns {ns}: processes gone",
            )

    def _check_no_mounts(self) -> None:
        left = lab_mounts(self.spec)
        if left:
            raise LabError("mounts left after down: " + ", ".join(left))

    # -- status ---------------------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        up = self.lab_json.exists()
        return {
            "state_dir": str(self.state_dir),
            "up": up,
            "problems": self.problems() if up else [],
            "netns": net.lab_netns_names(self.spec),
            "info": json.loads(self.lab_json.read_text()) if up else None,
        }


def lab_mounts(spec: LabSpec) -> list[str]:
    """Mount points of this machine that belong to the lab (its netns files, its state dir)."""
    markers = (str(spec.state_dir) + "/", f"{net.NETNS_DIR}/{spec.prefix}-")
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(markers):
            points.append(point)
    return points


def lab_cgroups(prefix: str) -> list[Path]:
    """Cgroups dockerd created for this lab's hosts (--cgroup-parent=/<prefix>-<host>)."""
    found: list[Path] = []
    if not CGROUP_ROOT.is_dir():
        return found
    for hierarchy in CGROUP_ROOT.iterdir():
        if hierarchy.is_dir():
            found += [p for p in hierarchy.glob(f"{prefix}-*") if p.is_dir()]
    return found


def remove_cgroups(prefix: str) -> None:
    """rmdir deepest first; a cgroup whose last task just died can take a moment to empty."""

    def attempt() -> bool:
        for top in lab_cgroups(prefix):
            for path in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
                _try_rmdir(path)
            _try_rmdir(top)
        return not lab_cgroups(prefix)

    wait_until(
        attempt,
        timeout=15,
        interval=0.3,
        what=f"remove cgroups {prefix}-*",
        detail=lambda: str(lab_cgroups(prefix)),
    )


def _try_rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def lab_routes(spec: LabSpec) -> list[str]:
    """Routes of this machine into any of the lab's subnets."""
    nets = (spec.mgmt_net, spec.fabric_net, spec.outside_net)
    out = run(["ip", "-4", "route", "show"], timeout=10).stdout.decode()
    found = []
    for line in out.splitlines():
        tokens = line.split()
        dst = tokens[1] if tokens[0] in ("unreachable", "blackhole", "prohibit") else tokens[0]
        if dst == "default":
            continue
        with contextlib.suppress(ValueError):
            if any(ipaddress.ip_network(dst, strict=False).overlaps(n) for n in nets):
                found.append(line)
    return found


def lab_processes(spec: LabSpec) -> list[int]:
    """Processes whose command line names the lab's state dir (its sshd, dockerd, ssh masters)."""
    # The dir as a whole path component: /x/s0-jump must not match /x/s0-jump3's processes.
    markers = tuple(str(spec.state_dir).encode() + end for end in (b"/", b"\0", b" ", b":"))
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            if any(marker in cmdline for marker in markers):
                found.append(int(proc.name))
    return found


def leftovers(spec: LabSpec) -> list[str]:
    """Anything of this lab still on the machine; empty after a clean `down`."""
    found = [f"netns {n}" for n in net.lab_netns_names(spec)]
    found += [f"mount {m}" for m in lab_mounts(spec)]
    found += [f"cgroup {c}" for c in lab_cgroups(spec.prefix)]
    found += [f"route {r}" for r in lab_routes(spec)]
    found += [f"process {p}" for p in lab_processes(spec)]
    if Path(f"/sys/class/net/{spec.root_ifname}").exists():
        found.append(f"link {spec.root_ifname}")
    return found
