"""Monitoring (`monitoring.enabled`), as pure specs: Prometheus and Grafana on the head's
loopback, node_exporter on each node's fabric IP, the files they read, and the step that waits
until every target is scraped.

Where each listens, and why nothing of it reaches the management network:
- Prometheus and Grafana: 127.0.0.1 on the head (an `ssh -L` tunnel reaches them). Prometheus
  has no bearer-token check of its own (its web config knows basic auth and TLS only), and
  vLLM's /metrics is not behind its key (vLLM checks /v1 only): loopback, not a password, is
  what keeps them private.
- The servers' /metrics: each server listens on the head's loopback, or on its worker's fabric
  IP where the firewall's guard admits its port on loopback and the fabric only.
- The front's metrics: the head's loopback (front.metricsPort); with `keys`, its per-key
  counters at KEY_METRICS_PATH on the same listener.
- node_exporter: each node's fabric IP, a port the guard holds whether or not monitoring runs
  (stacks/plan/firewall.py), so turning monitoring on or off changes no guard.
- Ray's metrics (when a model runs with Ray): ray.metricsExportPort, fixed and guarded already.

Each container is replaced when what it reads changes (a label holds the files' digest): the
models of the fleet are Prometheus's targets, so adding one restarts Prometheus (seconds; its
data stays on the head) and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from stacks.config import MonitoringImageConfig
from stacks.plan import names
from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.containers import RESTART_POLICY, ContainerSpec, EntryScripts, Mount, Role
from stacks.plan.firewall import (
    CONTAINER_FIREWALL_DIR,
    FIREWALLED_LABEL,
    GATE_WAIT_SECONDS,
    MARKER_FRESH_SECONDS,
    MARKER_NAME,
    chain_name,
    firewall_dir,
)
from stacks.plan.front import KEY_METRICS_PATH
from stacks.plan.hosts import written
from stacks.plan.image import ImagePull
from stacks.plan.later import PINNED_IMAGE, Later
from stacks.plan.server_plan import per_server
from stacks.plan.steps import (
    Receipt,
    StepSpec,
    Timeouts,
    check,
    owned,
    script_call,
    undoable,
)

DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "components" / "dashboards"

GRAFANA_PASSWORD_FILE = "admin-password"  # in grafana_secrets_dir (grafana-password.sh)
GRAFANA_PASSWORD_PREFIX = "spark-vllm-grafana-password "  # the step's line with it
CONTAINER_GRAFANA_SECRETS = "/run/spark-vllm-grafana"  # grafana_secrets_dir, read-only
GRAFANA_PASSWORD_LABEL = "spark-vllm.grafana-password"  # the password step's ID

# Inside the containers.
CONTAINER_CONFIG_DIR = "/etc/spark-vllm"  # prometheus.yml
CONTAINER_DATA_DIR = "/prometheus"  # its TSDB
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"  # Grafana's default provisioning path
CONTAINER_DASHBOARDS = "/var/lib/spark-vllm/dashboards"  # the shipped dashboards, read-only
HOST_ROOT = "/host"  # node_exporter's read-only view of the host's root
HOME_DASHBOARD = "spark-vllm-serving.json"

# What the container read, as a digest: new files replace it.
CONFIG_DIGEST_LABEL = "spark-vllm.monitoring-config"
MONITORING_IMAGE_PULL_MINUTES = 15
RAY_PROBE_SECONDS = 15  # how long a Ray node's metrics agent is given to answer (after the join)
READY_SECONDS = 180  # the readiness step's bound at least: every target scraped once, UIs answering


@dataclass(frozen=True)
class ScrapeTarget:
    """One endpoint Prometheus scrapes, with the labels it adds to every series; `path` when it
    is not Prometheus's default, /metrics (one per job: Prometheus's `metrics_path`)."""

    job: str
    address: str  # host:port
    labels: tuple[tuple[str, str], ...]
    path: str | None = None


def monitoring_dir(plan: ClusterPlan) -> str:
    return f"{plan.head.state_dir}/monitoring"


def config_dir(plan: ClusterPlan) -> str:
    return f"{monitoring_dir(plan)}/etc"


def grafana_dir(plan: ClusterPlan) -> str:
    return f"{monitoring_dir(plan)}/grafana"


def grafana_secrets_dir(plan: ClusterPlan) -> str:
    """Grafana's admin password on the head: a directory of its own, mounted into Grafana's
    container alone (not under grafana_dir, which the files step writes afresh)."""
    return f"{plan.head.state_dir}/grafana-secrets"


def grafana_password(plan: ClusterPlan) -> StepSpec:
    """Grafana's admin password, made once on the head (grafana-password.sh): its own secret,
    not derived from the API key, so that whoever learns one learns nothing of the other. Its
    output (the password, for the stack's secret output) is a Pulumi secret and not logged."""
    head, file = plan.head, f"{grafana_secrets_dir(plan)}/{GRAFANA_PASSWORD_FILE}"
    step = undoable(
        plan,
        names.GRAFANA_PASSWORD,
        head,
        "grafana-password.sh",
        ("write", "remove"),
        {"file": file},
        (check("files", file),),
        quiet="none",
    )
    return replace(step, secret_stdout=True)


def parse_grafana_password(stdout: str) -> str:
    """The password from the step's output (grafana-password.sh)."""
    for line in stdout.splitlines():
        if line.startswith(GRAFANA_PASSWORD_PREFIX):
            return line.removeprefix(GRAFANA_PASSWORD_PREFIX)
    raise ValueError("spark-vllm: Grafana's password step printed no password")


def data_dir(plan: ClusterPlan) -> str:
    return f"{monitoring_dir(plan)}/prometheus"


def prometheus_address(plan: ClusterPlan) -> str:
    return f"127.0.0.1:{plan.config.monitoring.prometheus.port}"


def grafana_address(plan: ClusterPlan) -> str:
    return f"127.0.0.1:{plan.config.monitoring.grafana.port}"


def node_exporter_address(plan: ClusterPlan, node: NodePlan) -> str:
    return f"{node.fabric_ip}:{plan.config.monitoring.node_exporter.port}"


def published_views(plan: ClusterPlan) -> dict[str, dict[str, str]]:
    """Prometheus's and Grafana's URLs on the head's loopback, and the tunnel that reaches each
    from the user's machine (through the bastion or the jump host as the deployment does)."""
    head = plan.head
    addresses = {"prometheus": prometheus_address(plan)}
    if plan.config.monitoring.grafana.enabled:
        addresses["grafana"] = grafana_address(plan)
    jump = f"-J {head.jump.user}@{head.jump.address}:{head.jump.port} " if head.jump else ""
    views = {}
    for name, address in addresses.items():
        port = address.rsplit(":", 1)[1]
        views[name] = {
            "url": f"http://{address}",
            "tunnel": f"ssh {jump}-p {head.ssh.port} -L {port}:{address} "
            f"{head.ssh.user}@{head.ssh.address}",
        }
    return views


def scrape_targets(plan: ClusterPlan) -> tuple[ScrapeTarget, ...]:
    """Every endpoint: each server (its served name and slot), the front (with `keys`, its
    per-key counters too), each node's exporter, each Ray node when the fleet runs Ray, and
    Prometheus itself."""
    cfg = plan.config.monitoring
    targets = [
        ScrapeTarget(
            "vllm",
            f"{server.server_address}:{server.server_port}",
            (
                ("model", server.served.served_name),
                ("node", server.server_node.name),
                ("server", server.slot.named("vllm")),
            ),
        )
        for server in per_server(plan)
    ]
    front = f"127.0.0.1:{plan.config.front.metrics_port}"
    targets.append(ScrapeTarget("front", front, (("node", plan.head.name),)))
    if plan.config.keys:
        # The same listener, no key needed (loopback); the job comes with the first key and
        # goes with the last, so any other key change leaves Prometheus as it is.
        targets.append(
            ScrapeTarget("front-keys", front, (("node", plan.head.name),), KEY_METRICS_PATH)
        )
    if cfg.node_exporter.enabled:
        targets += [
            ScrapeTarget("node", node_exporter_address(plan, node), (("node", node.name),))
            for node in plan.nodes
        ]
    driver = next((server for server in per_server(plan) if server.uses_ray), None)
    if driver is not None:
        port = plan.config.ray.metrics_export_port
        targets += [
            ScrapeTarget("ray", f"{node.fabric_ip}:{port}", (("node", node.name),))
            for node in driver.nodes
        ]
    targets.append(
        ScrapeTarget("prometheus", prometheus_address(plan), (("node", plan.head.name),))
    )
    return tuple(targets)


RAY_TARGETS_FILE = "ray-targets.json"  # beside prometheus.yml: the Ray nodes that export


def prometheus_config(plan: ClusterPlan) -> str:
    """prometheus.yml (as JSON, which YAML reads): one job per kind of target, each target with
    its own labels (a static config per target). Ray's job reads its targets from a file the
    `-ray-targets` step writes: only the nodes whose Ray exports metrics."""
    interval = f"{plan.config.monitoring.prometheus.scrape_interval_seconds}s"
    jobs: dict[str, list[dict[str, object]]] = {}
    paths: dict[str, dict[str, str]] = {}
    for target in scrape_targets(plan):
        jobs.setdefault(target.job, []).append(
            {"targets": [target.address], "labels": dict(target.labels)}
        )
        if target.path is not None:
            paths[target.job] = {"metrics_path": target.path}
    # Read again when the file changes (Prometheus watches it), and every 30 s besides.
    ray_file = f"{CONTAINER_CONFIG_DIR}/{RAY_TARGETS_FILE}"
    discovered = {"file_sd_configs": [{"files": [ray_file], "refresh_interval": "30s"}]}
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": job,
                **paths.get(job, {}),
                **(discovered if job == "ray" else {"static_configs": statics}),
            }
            for job, statics in jobs.items()
        ],
    }
    return json.dumps(config, indent=1, sort_keys=True) + "\n"


def grafana_datasource(plan: ClusterPlan) -> str:
    """Grafana's provisioned datasource: the Prometheus beside it (both on the head's host
    network). Its uid is what the dashboards' `datasource` variable picks by type."""
    interval = f"{plan.config.monitoring.prometheus.scrape_interval_seconds}s"
    document = {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Prometheus",
                "uid": "spark-vllm-prometheus",
                "type": "prometheus",
                "access": "proxy",
                "url": f"http://{prometheus_address(plan)}",
                "isDefault": True,
                "editable": False,
                "jsonData": {"timeInterval": interval},
            }
        ],
    }
    return json.dumps(document, indent=1) + "\n"


def grafana_dashboards_provider() -> str:
    document = {
        "apiVersion": 1,
        "providers": [
            {
                "name": "spark-vllm",
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "options": {"path": CONTAINER_DASHBOARDS},
            }
        ],
    }
    return json.dumps(document, indent=1) + "\n"


def shipped_dashboards() -> dict[str, str]:
    """The dashboards spark-vllm ships (components/dashboards/), by file name."""
    return {path.name: path.read_text() for path in sorted(DASHBOARDS_DIR.glob("*.json"))}


def monitoring_files(plan: ClusterPlan) -> dict[str, str]:
    """Every file the monitoring containers read, by its path on the head."""
    files = {f"{config_dir(plan)}/prometheus.yml": prometheus_config(plan)}
    if plan.config.monitoring.grafana.enabled:
        base = grafana_dir(plan)
        # Grafana's provisioning reads `.yaml`/`.yml` files only (pkg/services/provisioning/
        # {datasources,dashboards}/config_reader.go); JSON is YAML.
        files[f"{base}/provisioning/datasources/spark-vllm.yaml"] = grafana_datasource(plan)
        files[f"{base}/provisioning/dashboards/spark-vllm.yaml"] = grafana_dashboards_provider()
        for name, text in shipped_dashboards().items():
            files[f"{base}/dashboards/{name}"] = text
    return files


def files_digest(files: dict[str, str], prefix: str) -> str:
    """The digest of the files under `prefix`: a container's label (a change replaces it)."""
    h = hashlib.sha256()
    for path in sorted(p for p in files if p.startswith(prefix)):
        h.update(f"{path}\0{files[path]}\0".encode())
    return h.hexdigest()[:16]


def write_files(plan: ClusterPlan) -> StepSpec:
    """The files on the head, whole on the command line (they hold no secret): `pulumi
    preview` shows what a change of the fleet does to Prometheus's targets."""
    head, files = plan.head, monitoring_files(plan)
    step = names.MONITORING_FILES
    dirs = sorted({path.rsplit("/", 1)[0] for path in files})
    create = " && ".join(
        [
            # Written afresh: a dashboard no longer shipped, or Grafana off, leaves no file.
            f"rm -rf {shlex.quote(grafana_dir(plan))}",
            f"mkdir -p {' '.join(shlex.quote(d) for d in dirs)}",
            *(written(p, t) for p, t in files.items()),
        ]
    )
    return StepSpec(
        name=step,
        node=head,
        create=create,
        receipts=(Receipt(step, head, tuple(check("files", path) for path in files)),),
        delete=owned(
            plan,
            head,
            f"rm -rf {shlex.quote(config_dir(plan))} {shlex.quote(grafana_dir(plan))} && "
            f"{_drop_monitoring_dir(plan)}",
        ),
    )


def _drop_monitoring_dir(plan: ClusterPlan) -> str:
    """The directory goes with whichever of the files and the data is deleted last (the two
    deletes may run at once; one already gone, or removed by hand, is no failure)."""
    path = shlex.quote(monitoring_dir(plan))
    return f"{{ rmdir --ignore-fail-on-non-empty {path} 2>/dev/null || [ ! -e {path} ]; }}"


def prometheus_data(plan: ClusterPlan) -> StepSpec:
    """Prometheus's data directory on the head (bounded by its retention): the step reports its
    size; its delete empties it (Prometheus writes as root: from the serving image, as
    compile-cache.sh does) and removes it."""
    head = plan.head
    remove = script_call(
        head, "monitoring-data.sh", "remove", dir=data_dir(plan), image=PINNED_IMAGE.text
    )
    return StepSpec(
        name=names.MONITORING_DATA,
        node=head,
        create=script_call(head, "monitoring-data.sh", "report", dir=data_dir(plan)),
        delete=owned(plan, head, f"{remove} && {_drop_monitoring_dir(plan)}"),
        timeouts=Timeouts(create=3, update=3, delete=6),
    )


def monitoring_ready(plan: ClusterPlan) -> StepSpec:
    """Waits (bounded) until Prometheus answers, has scraped every target once and finds each up,
    and Grafana answers; prints a line per job (monitoring_ready.py)."""
    head, cfg = plan.head, plan.config.monitoring
    # Prometheus spreads its first scrapes over one interval: two, and some, at the least.
    bound = max(READY_SECONDS, 2 * cfg.prometheus.scrape_interval_seconds + 60)
    flags: dict[str, str | float] = {
        "prometheus": prometheus_address(plan),
        "jobs": ",".join(dict.fromkeys(t.job for t in scrape_targets(plan))),
        # Ray's metrics come from its dashboard agent, absent from a minimal Ray install.
        "optional_jobs": "ray",
        "timeout_seconds": bound,
    }
    if cfg.grafana.enabled:
        flags["grafana"] = grafana_address(plan)
    return StepSpec(
        name=names.MONITORING_READY,
        node=head,
        create=script_call(head, "monitoring_ready.py", **flags),
        timeouts=Timeouts(create=bound // 60 + 2),
    )


def ray_targets(plan: ClusterPlan) -> StepSpec | None:
    """With a Ray model: the Ray nodes whose metrics port answers, written for Prometheus's
    `ray` job (monitoring_ray_targets.py); a node whose Ray exports none is said and left out.
    None without Ray."""
    ray = [t for t in scrape_targets(plan) if t.job == "ray"]
    if not ray:
        return None
    head = plan.head
    path = f"{config_dir(plan)}/{RAY_TARGETS_FILE}"
    create = script_call(
        head,
        "monitoring_ray_targets.py",
        file=path,
        timeout_seconds=RAY_PROBE_SECONDS,
        targets=",".join(f"{t.address}={dict(t.labels)['node']}" for t in ray),
    )
    return StepSpec(
        name=names.MONITORING_RAY_TARGETS,
        node=head,
        create=create,
        delete=owned(plan, head, f"rm -f {shlex.quote(path)}"),
        timeouts=Timeouts(create=RAY_PROBE_SECONDS // 60 + 2),
        # Replaced with a new Ray cluster (`ray-joined`): outside a cascade the engine would
        # delete the old file after the new step wrote it (step_generator.go: a replacement
        # creates first unless deleteBeforeReplace; its delete runs at the end of the run).
        delete_first=True,
    )


def image_later(name: str) -> Later:
    """A monitoring image's ID on its node, by its pull's name."""
    return Later(f"monitoring.{name}")


def prometheus_pull(plan: ClusterPlan) -> ImagePull:
    return _pull(plan.config.monitoring.prometheus.image, "prometheus")


def grafana_pull(plan: ClusterPlan) -> ImagePull:
    return _pull(plan.config.monitoring.grafana.image, "grafana")


def node_exporter_pull(plan: ClusterPlan) -> ImagePull:
    return _pull(plan.config.monitoring.node_exporter.image, "nodeExporter")


def _pull(image: MonitoringImageConfig, part: str) -> ImagePull:
    return ImagePull(
        image.ref,
        image.platform,
        True,
        MONITORING_IMAGE_PULL_MINUTES,
        key=f"monitoring.{part}.image.ref",
        output="the monitoring output",
    )


def _container(
    plan: ClusterPlan,
    node: NodePlan,
    role: Role,
    entrypoint: tuple[str, ...],
    command: tuple[str, ...],
    mounts: tuple[Mount, ...],
    labels: dict[str, str],
    env: tuple[str, ...] = (),
    user: str = "0:0",
) -> ContainerSpec:
    """Host network like every container here (so loopback is the head's); root unless `user`
    says otherwise, because what Prometheus and Grafana read is the deploying user's (the state
    directory is mode 700); no GPU."""
    every = {**plan.labels, "spark-vllm.role": role, "spark-vllm.node": node.name, **labels}
    return ContainerSpec(
        name=f"{plan.config.docker.container_prefix}-{role}",
        node=node,
        role=role,
        entrypoint=entrypoint,
        command=command,
        env=env,
        restart=RESTART_POLICY[role],
        host_pid=False,
        mounts=mounts,
        labels=tuple(sorted(every.items())),
        gpus=False,
        shm_size_mb=None,
        ulimits=(),
        devices=(),
        stop_seconds=10,
        user=user,
    )


def prometheus_container(plan: ClusterPlan) -> ContainerSpec:
    cfg = plan.config.monitoring.prometheus
    files = monitoring_files(plan)
    return _container(
        plan,
        plan.head,
        "prometheus",
        ("prometheus",),
        (
            f"--config.file={CONTAINER_CONFIG_DIR}/prometheus.yml",
            f"--storage.tsdb.path={CONTAINER_DATA_DIR}",
            f"--storage.tsdb.retention.time={cfg.retention_time}",
            f"--storage.tsdb.retention.size={cfg.retention_size}",
            f"--web.listen-address={prometheus_address(plan)}",
        ),
        (
            Mount(config_dir(plan), CONTAINER_CONFIG_DIR, read_only=True),
            Mount(data_dir(plan), CONTAINER_DATA_DIR),
        ),
        {CONFIG_DIGEST_LABEL: files_digest(files, config_dir(plan))},
    )


def grafana_container(plan: ClusterPlan) -> ContainerSpec:
    """Grafana with the datasource and dashboards provisioned, on the head's loopback; anonymous
    visitors view (whoever reaches loopback has SSH to the head), `admin`'s password is its own
    secret (grafana_password: read from its file, never in the container's configuration, and
    the only secret the container mounts); no phoning home."""
    cfg = plan.config.monitoring.grafana
    files = monitoring_files(plan)
    env = {
        "GF_SERVER_HTTP_ADDR": "127.0.0.1",
        "GF_SERVER_HTTP_PORT": str(cfg.port),
        "GF_AUTH_ANONYMOUS_ENABLED": "true",
        "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
        "GF_SECURITY_ADMIN_PASSWORD__FILE": f"{CONTAINER_GRAFANA_SECRETS}/{GRAFANA_PASSWORD_FILE}",
        "GF_ANALYTICS_REPORTING_ENABLED": "false",
        "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
        "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false",
        "GF_NEWS_NEWS_FEED_ENABLED": "false",
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": f"{CONTAINER_DASHBOARDS}/{HOME_DASHBOARD}",
    }
    return _container(
        plan,
        plan.head,
        "grafana",
        ("/run.sh",),
        (),
        (
            Mount(f"{grafana_dir(plan)}/provisioning", GRAFANA_PROVISIONING, read_only=True),
            Mount(f"{grafana_dir(plan)}/dashboards", CONTAINER_DASHBOARDS, read_only=True),
            Mount(grafana_secrets_dir(plan), CONTAINER_GRAFANA_SECRETS, read_only=True),
        ),
        {CONFIG_DIGEST_LABEL: files_digest(files, grafana_dir(plan))},
        env=tuple(f"{k}={v}" for k, v in sorted(env.items())),
    )


def node_exporter_container(
    plan: ClusterPlan, node: NodePlan, scripts: EntryScripts
) -> ContainerSpec:
    """node_exporter on `node`'s fabric IP, reading the host through a read-only view of its
    root; only the collectors the dashboards and a user diagnosing a host need. With the
    firewall, behind its gate (exporter-gate.sh, POSIX: the image has no bash): after a reboot
    it listens only once the guard drops the fabric's addresses off every other interface."""
    collectors = ("meminfo", "cpu", "loadavg", "filesystem", "netdev", "pressure", "uname")
    entrypoint: tuple[str, ...] = ("node_exporter",)
    mounts: tuple[Mount, ...] = (Mount("/", HOST_ROOT, read_only=True),)
    labels: dict[str, str] = {}
    if plan.config.fabric.firewall:
        marker = f"{CONTAINER_FIREWALL_DIR}/{MARKER_NAME}"
        gate = (marker, str(MARKER_FRESH_SECONDS), str(GATE_WAIT_SECONDS))
        entrypoint = ("sh", "-c", scripts.exporter_gate, "exporter-gate", *gate, "--", *entrypoint)
        mounts += (Mount(firewall_dir(node), CONTAINER_FIREWALL_DIR, read_only=True),)
        labels[FIREWALLED_LABEL] = chain_name(plan)
    return _container(
        plan,
        node,
        "node-exporter",
        entrypoint,
        (
            f"--web.listen-address={node_exporter_address(plan, node)}",
            f"--path.rootfs={HOST_ROOT}",
            "--collector.disable-defaults",
            *(f"--collector.{name}" for name in collectors),
        ),
        mounts,
        labels,
        # The one of them on a network: `nobody`, as the official image runs it (what it reads
        # of /proc and /sys is world-readable; the host's secrets under /host are not).
        user="65534:65534",
    )
