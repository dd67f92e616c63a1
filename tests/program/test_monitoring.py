"""Monitoring (stacks/plan/monitoring.py): what Prometheus scrapes, the files Prometheus and
Grafana read (checked by Debian's promtool where it is installed), where each listens, and what
`pulumi preview` shows when monitoring is turned on, off, or the fleet changes under it."""

from __future__ import annotations

import copy
import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stacks.plan import graph as g
from stacks.plan import monitoring, names
from stacks.plan.containers import ContainerSpec
from stacks.plan.firewall import guard_args
from stacks.plan.steps import StepSpec
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate
from tests.program.planning import fleet, graph_of
from tests.program.previews import up_then_preview
from tests.program.scripting import run

ON = {"enabled": True}


def monitored(config: dict[str, Any], **settings: Any) -> dict[str, Any]:
    config = copy.deepcopy(config)
    config["monitoring"] = {**ON, **settings}
    return config


def written_files(step: StepSpec) -> dict[str, str]:
    """What the files step writes: path -> text (from its `printf ... > path.tmp`)."""
    words = shlex.split(step.create)
    return {
        words[i + 4].removesuffix(".tmp"): words[i + 2]
        for i, word in enumerate(words[:-4])
        if word == "printf"
    }


def monitoring_entries(graph: g.DeploymentGraph) -> set[str]:
    return {entry.name for entry in graph.of(names.MONITORING)}


def test_off_by_default_nothing_of_it_is_planned(make_config: ConfigFactory) -> None:
    _, graph = graph_of(make_config(hosts=2))
    assert monitoring_entries(graph) == set()
    assert not [e for e in graph if "prometheus" in e.name or "grafana" in e.name]


def test_on_it_plans_prometheus_grafana_and_an_exporter_per_node(
    make_config: ConfigFactory,
) -> None:
    _, graph = graph_of(monitored(make_config(hosts=2, executor="mp")))
    assert monitoring_entries(graph) == {
        "monitoring-files",
        "monitoring-data",
        "monitoring-prometheus-pull",
        "monitoring-grafana-pull",
        "monitoring-node-exporter-spark1-pull",
        "monitoring-node-exporter-spark2-pull",
        "monitoring-node-exporter-spark1",
        "monitoring-node-exporter-spark2",
        "monitoring-prometheus",
        "monitoring-grafana-password",
        "monitoring-grafana",
        "monitoring-ready",
    }
    # Each exporter is pulled by its own node's daemon and runs there.
    for node in ("spark1", "spark2"):
        assert graph.by_name[f"monitoring-node-exporter-{node}-pull"].node == node
        assert graph.by_name[f"monitoring-node-exporter-{node}"].node == node
    # Its port is dropped off the fabric before it listens.
    assert "firewall-spark2" in graph.by_name["monitoring-node-exporter-spark2"].after
    ready = graph.by_name["monitoring-ready"]
    assert "vllm-ready" in ready.after
    assert set(ready.triggers) == {
        "monitoring-prometheus",
        "monitoring-grafana",
        "monitoring-node-exporter-spark1",
        "monitoring-node-exporter-spark2",
    }


def test_prometheus_scrapes_every_server_the_front_ray_and_each_node(
    make_config: ConfigFactory,
) -> None:
    config = fleet(make_config, 2)  # qwen, embed, coder: mp on both hosts
    config["models"][1]["hosts"] = ["spark2"]  # embed's server on the worker's fabric IP
    config["models"][1]["tensorParallelSize"] = 1
    config["models"][2]["executor"] = "ray"  # coder: Ray's driver, Ray on both hosts
    plan, _ = graph_of(monitored(config))
    by_job: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for target in monitoring.scrape_targets(plan):
        by_job.setdefault(target.job, []).append((target.address, dict(target.labels)))
    assert by_job["vllm"] == [
        ("127.0.0.1:8001", {"model": "qwen", "node": "spark1", "server": "vllm"}),
        ("10.241.0.12:8002", {"model": "embed", "node": "spark2", "server": "vllm-s1"}),
        ("127.0.0.1:8003", {"model": "coder", "node": "spark1", "server": "vllm-s2"}),
    ]
    assert by_job["front"] == [("127.0.0.1:8404", {"node": "spark1"})]
    assert by_job["node"] == [
        ("10.241.0.11:19100", {"node": "spark1"}),
        ("10.241.0.12:19100", {"node": "spark2"}),
    ]
    assert by_job["ray"] == [
        ("10.241.0.11:6385", {"node": "spark1"}),
        ("10.241.0.12:6385", {"node": "spark2"}),
    ]
    assert by_job["prometheus"] == [("127.0.0.1:9090", {"node": "spark1"})]


def test_without_ray_or_the_exporter_their_jobs_are_gone(make_config: ConfigFactory) -> None:
    plan, graph = graph_of(
        monitored(make_config(hosts=2, executor="mp"), nodeExporter={"enabled": False})
    )
    jobs = {t.job for t in monitoring.scrape_targets(plan)}
    assert jobs == {"vllm", "front", "prometheus"}
    assert not [name for name in monitoring_entries(graph) if "node-exporter" in name]
    wait = graph.by_name["monitoring-ready"].spec
    assert isinstance(wait, StepSpec)
    assert "--jobs vllm,front,prometheus --optional-jobs ray " in wait.create


def test_with_keys_prometheus_scrapes_each_keys_counters_from_the_front(
    make_config: ConfigFactory,
) -> None:
    """The front's metrics listener serves the per-key counters at /metrics/keys (loopback,
    no key): a job of its own, there with the first key and gone with the last."""
    config = monitored(make_config(hosts=2, executor="mp"))
    plan, graph = graph_of({**config, "keys": [{"name": "alice"}, {"name": "bob"}]})
    keyed = [t for t in monitoring.scrape_targets(plan) if t.job == "front-keys"]
    assert keyed == [
        monitoring.ScrapeTarget(
            "front-keys", "127.0.0.1:8404", (("node", "spark1"),), path="/metrics/keys"
        )
    ]
    jobs = json.loads(monitoring.prometheus_config(plan))["scrape_configs"]
    assert {job["job_name"]: job.get("metrics_path") for job in jobs} == {
        "vllm": None,
        "front": None,  # Prometheus's default, /metrics: HAProxy's own exporter
        "front-keys": "/metrics/keys",
        "node": None,
        "prometheus": None,
    }
    job = next(job for job in jobs if job["job_name"] == "front-keys")
    assert job["static_configs"] == [{"targets": ["127.0.0.1:8404"], "labels": {"node": "spark1"}}]
    # The wait needs it up too: the front serves it once its reload loaded the keys.
    wait = graph.by_name["monitoring-ready"].spec
    assert isinstance(wait, StepSpec)
    assert "--jobs vllm,front,front-keys,node,prometheus " in wait.create
    # Without keys: no such job, and the configuration as it always was.
    bare, _ = graph_of(config)
    assert "front-keys" not in {t.job for t in monitoring.scrape_targets(bare)}
    assert "metrics_path" not in monitoring.prometheus_config(bare)


def test_everything_listens_on_loopback_but_the_exporter_on_the_fabric(
    make_config: ConfigFactory,
) -> None:
    plan, graph = graph_of(monitored(make_config(hosts=2, executor="mp")))
    prometheus = graph.by_name["monitoring-prometheus"].spec
    grafana = graph.by_name["monitoring-grafana"].spec
    exporter = graph.by_name["monitoring-node-exporter-spark2"].spec
    assert isinstance(prometheus, ContainerSpec)
    assert isinstance(grafana, ContainerSpec)
    assert isinstance(exporter, ContainerSpec)
    assert "--web.listen-address=127.0.0.1:9090" in prometheus.command
    assert "--storage.tsdb.retention.time=15d" in prometheus.command
    assert "--storage.tsdb.retention.size=10GB" in prometheus.command
    env = dict(e.split("=", 1) for e in grafana.env)
    assert (env["GF_SERVER_HTTP_ADDR"], env["GF_SERVER_HTTP_PORT"]) == ("127.0.0.1", "3000")
    # The password is read from its file: no secret in the container's configuration, and
    # the only secret it mounts is its own.
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/spark-vllm-grafana/admin-password"
    assert SECRETS["apiKey"] not in json.dumps(grafana.env)
    state = plan.head.state_dir
    assert [(m.source, m.target) for m in grafana.mounts if "secret" in m.source] == [
        (f"{state}/grafana-secrets", "/run/spark-vllm-grafana")
    ]
    assert all(m.source != plan.api_key_dir for m in grafana.mounts)
    assert "--web.listen-address=10.241.0.12:19100" in exporter.command
    # The guard holds the exporter's port on every node, monitoring on or off.
    for config in (make_config(hosts=2, executor="mp"), monitored(make_config(hosts=2))):
        off_plan, _ = graph_of(config)
        for node in off_plan.nodes:
            args = guard_args(off_plan, node)
            assert "19100" in args[args.index("--tcp-ports") + 1].split(","), node.name
    assert plan.config.monitoring.enabled


def test_the_files_are_what_prometheus_and_grafana_read(make_config: ConfigFactory) -> None:
    plan, graph = graph_of(monitored(fleet(make_config, 2, ("qwen", "embed"))))
    step = graph.by_name["monitoring-files"].spec
    assert isinstance(step, StepSpec)
    files = written_files(step)
    state = plan.head.state_dir
    config = json.loads(files[f"{state}/monitoring/etc/prometheus.yml"])
    assert config["global"]["scrape_interval"] == "15s"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert [s["labels"]["model"] for s in jobs["vllm"]["static_configs"]] == ["qwen", "embed"]
    datasource = json.loads(
        files[f"{state}/monitoring/grafana/provisioning/datasources/spark-vllm.yaml"]
    )
    assert datasource["datasources"][0]["url"] == "http://127.0.0.1:9090"
    provider = json.loads(
        files[f"{state}/monitoring/grafana/provisioning/dashboards/spark-vllm.yaml"]
    )
    assert provider["providers"][0]["options"]["path"] == monitoring.CONTAINER_DASHBOARDS
    shipped = monitoring.shipped_dashboards()
    assert shipped and all(
        files[f"{state}/monitoring/grafana/dashboards/{name}"] == text
        for name, text in shipped.items()
    )
    # The containers' labels: the digest of what each reads.
    prometheus = graph.by_name["monitoring-prometheus"].spec
    assert isinstance(prometheus, ContainerSpec)
    assert (
        monitoring.CONFIG_DIGEST_LABEL,
        monitoring.files_digest(files, f"{state}/monitoring/etc"),
    ) in prometheus.labels


@pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's prometheus (promtool)")
@pytest.mark.parametrize("keys", [None, [{"name": "alice"}]])
def test_promtool_accepts_the_generated_configuration(
    make_config: ConfigFactory, tmp_path: Path, keys: list[dict[str, str]] | None
) -> None:
    config = fleet(make_config, 2)
    config["models"][2]["executor"] = "ray"
    if keys is not None:
        config["keys"] = keys  # the per-key job and its metrics_path
    plan, _ = graph_of(monitored(config))
    path = tmp_path / "prometheus.yml"
    path.write_text(monitoring.prometheus_config(plan))
    checked = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_turning_it_on_creates_only_its_own_resources(make_config: ConfigFactory) -> None:
    before = make_config(hosts=2, executor="mp")
    planned, deleted = up_then_preview(before, monitored(before))
    assert deleted == []
    assert {name: step for name, step in planned.items() if step != "create"} == {}
    _, graph = graph_of(monitored(before))
    assert set(planned) == monitoring_entries(graph)


def test_turning_it_off_deletes_only_its_own_resources(make_config: ConfigFactory) -> None:
    after = make_config(hosts=2, executor="mp")
    planned, deleted = up_then_preview(monitored(after), after)
    assert planned == {}
    _, graph = graph_of(monitored(after))
    assert set(deleted) == monitoring_entries(graph)


def test_a_model_added_restarts_prometheus_and_nothing_else_of_it(
    make_config: ConfigFactory,
) -> None:
    before = monitored(fleet(make_config, 2, ("qwen", "embed")))
    after = monitored(fleet(make_config, 2))
    planned, deleted = up_then_preview(before, after)
    assert deleted == []
    mine = {name: step for name, step in planned.items() if name.startswith("monitoring-")}
    assert mine == {
        "monitoring-files": "update",  # its targets
        "monitoring-prometheus": "replace",  # reads them at start
        "monitoring-ready": "replace",  # waits for the new one's targets
    }


def test_its_output_names_the_tunnels_and_the_targets(make_config: ConfigFactory) -> None:
    config = monitored(make_config(hosts=2, executor="mp"))
    up = evaluate(config, SECRETS)
    output = up.outputs["monitoring"]
    assert output["prometheus"]["url"] == "http://127.0.0.1:9090"
    assert output["grafana"]["tunnel"] == ("ssh -p 22 -L 3000:127.0.0.1:3000 aurora@10.240.1.11")
    assert set(output["imageDigests"]) == {
        "monitoring-prometheus",
        "monitoring-grafana",
        "monitoring-node-exporter-spark1",
        "monitoring-node-exporter-spark2",
    }


def test_grafana_is_given_files_it_reads(make_config: ConfigFactory) -> None:
    """Grafana's provisioning reads `.yaml`/`.yml` files only (pkg/services/provisioning/
    {datasources,dashboards}/config_reader.go): a `.json` there is skipped without a word."""
    plan, graph = graph_of(monitored(make_config(hosts=2, executor="mp")))
    step = graph.by_name["monitoring-files"].spec
    assert isinstance(step, StepSpec)
    provisioning = [p for p in written_files(step) if "/provisioning/" in p]
    assert len(provisioning) == 2 and all(p.endswith(".yaml") for p in provisioning)
    # Written afresh each time: a file of an earlier release is not left to be provisioned.
    assert step.create.startswith(f"rm -rf {plan.head.state_dir}/monitoring/grafana && ")


def test_the_exporter_runs_as_nobody_prometheus_and_grafana_as_root(
    make_config: ConfigFactory,
) -> None:
    _, graph = graph_of(monitored(make_config(hosts=2, executor="mp")))
    users = {
        name: spec.user
        for name in (
            "monitoring-prometheus",
            "monitoring-grafana",
            "monitoring-node-exporter-spark2",
        )
        if isinstance(spec := graph.by_name[name].spec, ContainerSpec)
    }
    assert users == {
        "monitoring-prometheus": "0:0",
        "monitoring-grafana": "0:0",
        "monitoring-node-exporter-spark2": "65534:65534",
    }


def test_the_exporter_starts_behind_the_firewalls_gate(make_config: ConfigFactory) -> None:
    """The one of them on a network: after a reboot it listens only once the guard holds this
    boot's rules (POSIX sh: its image has no bash), reading the guard's marker read-only; and
    the firewall step keeps the rules while it runs."""
    _, graph = graph_of(monitored(make_config(hosts=2, executor="mp")))
    spec = graph.by_name["monitoring-node-exporter-spark2"].spec
    assert isinstance(spec, ContainerSpec)
    assert spec.entrypoint[:2] == ("sh", "-c") and "exporter-gate" in spec.entrypoint
    gate = spec.entrypoint[spec.entrypoint.index("exporter-gate") + 1 :]
    assert gate == ("/spark-vllm/firewall/applied", "60", "120", "--", "node_exporter")
    firewall = [m for m in spec.mounts if m.target == "/spark-vllm/firewall"]
    assert len(firewall) == 1 and firewall[0].read_only
    assert dict(spec.labels)["spark-vllm.firewalled"].startswith("SPARK-VLLM-")
    config = monitored(make_config(hosts=2, executor="mp"))
    config["fabric"] = {"firewall": False}
    _, bare = graph_of(config)
    spec = bare.by_name["monitoring-node-exporter-spark2"].spec
    assert isinstance(spec, ContainerSpec) and spec.entrypoint == ("node_exporter",)


@pytest.mark.parametrize(("interval", "bound"), [(15, 180), (120, 300)])
def test_the_wait_outlasts_two_scrape_intervals(
    make_config: ConfigFactory, interval: int, bound: int
) -> None:
    config = monitored(make_config(hosts=2, executor="mp"))
    config["monitoring"]["prometheus"] = {"scrapeIntervalSeconds": interval}
    _, graph = graph_of(config)
    wait = graph.by_name["monitoring-ready"].spec
    assert isinstance(wait, StepSpec)
    assert f"--timeout-seconds {bound} " in wait.create
    assert wait.timeouts.create == bound // 60 + 2


def test_removing_the_directory_twice_or_after_a_hand_is_no_failure(
    make_config: ConfigFactory, host_tmp: Path
) -> None:
    """The files' and the data's deletes may run at once, each ending with the directory."""
    config = monitored(make_config(hosts=2, executor="mp"))
    config["hosts"][0]["stateDir"] = str(host_tmp / "state")
    plan, _ = graph_of(config)
    drop = monitoring._drop_monitoring_dir(plan)
    target = Path(monitoring.monitoring_dir(plan))
    assert target.is_relative_to(host_tmp), target
    target.mkdir(parents=True)
    (target / "prometheus").mkdir()
    assert subprocess.run(["bash", "-c", drop]).returncode == 0  # not empty: kept
    assert target.exists()
    (target / "prometheus").rmdir()
    assert subprocess.run(["bash", "-c", drop]).returncode == 0
    assert not target.exists(), drop
    assert subprocess.run(["bash", "-c", drop]).returncode == 0  # gone already


def test_rays_targets_are_the_nodes_whose_ray_exports_metrics(make_config: ConfigFactory) -> None:
    """Ray's job reads its targets from a file a step writes once Ray's nodes joined: only those
    that answer on ray.metricsExportPort (a minimal Ray exports nothing)."""
    config = fleet(make_config, 2, ("qwen", "coder"))
    config["models"][1]["executor"] = "ray"
    plan, graph = graph_of(monitored(config))
    scrape = json.loads(monitoring.prometheus_config(plan))["scrape_configs"]
    ray = next(job for job in scrape if job["job_name"] == "ray")
    assert ray["file_sd_configs"] == [
        {"files": ["/etc/spark-vllm/ray-targets.json"], "refresh_interval": "30s"}
    ]
    assert "static_configs" not in ray
    probe = graph.by_name["monitoring-ray-targets"]
    assert probe.after == ("monitoring-files", names.RAY_JOINED)
    assert probe.triggers == (names.RAY_JOINED,)  # a new cluster is probed again
    assert isinstance(probe.spec, StepSpec)
    assert "--targets 10.241.0.11:6385=spark1,10.241.0.12:6385=spark2" in probe.spec.create
    assert "monitoring-ray-targets" in graph.by_name["monitoring-ready"].after
    _, without = graph_of(monitored(fleet(make_config, 2, ("qwen", "coder"))))
    assert "monitoring-ray-targets" not in without.by_name


def test_a_new_ray_cluster_rewrites_rays_targets_after_the_old_file_is_deleted(
    make_config: ConfigFactory,
) -> None:
    """`ray-joined` replaced (a Ray container recreated after `up --refresh` found it gone)
    replaces the targets step. Created first, as the engine does by default, the old step's
    delete (`rm -f` of the same file) would run at the end of the run and leave Prometheus no
    Ray targets (step_generator.go: the replaced resource's delete is queued after the new
    create unless deleteBeforeReplace). So the step is delete-before-replace; no other step is."""
    config = fleet(make_config, 2, ("qwen", "coder"))
    config["models"][1]["executor"] = "ray"
    up = evaluate(monitored(config), SECRETS)
    registered = {r.name: r for r in up.registrations if r.typ == "command:remote:Command"}
    assert registered["monitoring-ray-targets"].delete_before_replace
    assert [name for name, r in registered.items() if r.delete_before_replace] == [
        "monitoring-ray-targets"
    ]


def test_grafanas_password_is_its_own_secret_output(make_config: ConfigFactory) -> None:
    """`admin`'s password is made on the head (not derived from the API key), and travels as a
    Pulumi secret: the step's stdout, never logged, and the stack output
    `grafanaAdminPassword`; a new password step makes a new Grafana (its database is in the
    container). Without Grafana, no step and no output."""
    ev = evaluate(monitored(make_config(hosts=2, executor="mp")), SECRETS)
    assert "grafanaAdminPassword" in ev.secret_outputs
    assert ev.outputs["grafanaAdminPassword"] == "Zk3fQ9xW2bLr7TnV0aYc5sHd8mJp1uEg"
    step = ev.named("monitoring-grafana-password")
    assert "grafana-password.sh write" in step.inputs["create"]
    assert "stdin" not in step.inputs or not step.inputs["stdin"]
    assert step.inputs["logging"] == "none"
    assert ev.depends_on("monitoring-grafana", "monitoring-grafana-password")
    grafana = ev.named("monitoring-grafana").inputs
    labels = {label["label"] for label in grafana["labels"]}
    assert monitoring.GRAFANA_PASSWORD_LABEL in labels
    assert "spark-vllm.api-key-sha256" not in labels  # the API key no longer restarts it
    off = evaluate(
        monitored(make_config(hosts=2, executor="mp"), grafana={"enabled": False}), SECRETS
    )
    assert "grafanaAdminPassword" not in off.outputs
    assert not any(r.name == "monitoring-grafana-password" for r in off.registrations)


def test_grafanas_password_is_made_once_private_and_random(tmp_path: Path) -> None:
    target = tmp_path / "grafana-secrets" / "admin-password"
    flags = ("--host", "h", "--file", str(target))
    first = run("grafana-password.sh", "write", *flags, check=True)
    password = target.read_text().strip()
    assert first.stdout == f"spark-vllm-grafana-password {password}\n"
    assert monitoring.parse_grafana_password(first.stdout) == password
    assert len(password) == 32 and oct(target.stat().st_mode & 0o777) == "0o600"
    assert oct(target.parent.stat().st_mode & 0o777) == "0o700"
    again = run("grafana-password.sh", "write", *flags, check=True)
    assert again.stdout == first.stdout  # kept: Grafana set it at its first start
    run("grafana-password.sh", "remove", *flags, check=True)
    assert not target.parent.exists()
    run("grafana-password.sh", "write", *flags, check=True)
    assert target.read_text().strip() != password  # each deployment its own
