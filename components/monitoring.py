"""Monitoring on the head (monitoring.enabled): Prometheus scraping every server, the front,
Ray and each node's exporter; Grafana with the shipped dashboards; all on loopback (an `ssh -L`
tunnel reaches them), from images pulled where they run (stacks/plan/monitoring.py)."""

from __future__ import annotations

import pulumi

from components.graph import Walk
from stacks.plan.graph import monitoring_pulls
from stacks.plan.monitoring import parse_grafana_password, published_views
from stacks.plan.names import (
    GRAFANA,
    GRAFANA_PASSWORD,
    MONITORING,
    MONITORING_RAY_TARGETS,
    MONITORING_READY,
    PROMETHEUS,
    pull_of,
)


class Monitoring(pulumi.ComponentResource):
    summary: pulumi.Output[dict[str, object]]  # the `monitoring` output
    # Grafana's admin password (None without Grafana): a secret, as the step's output is.
    grafana_password: pulumi.Output[str] | None

    def __init__(self, walk: Walk, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:Monitoring", MONITORING, None, opts)
        plan = walk.plan
        walk.build(MONITORING, parent=self)
        ready = walk.step(MONITORING_READY).stdout
        probe = MONITORING_RAY_TARGETS
        if probe in walk.built:  # which of Ray's nodes export metrics, first
            ready = pulumi.Output.concat(walk.step(probe).stdout, "\n", ready)
        digests = {
            container: walk.pulled(pull_of(container)).repo_digest
            for container, _, _, _ in monitoring_pulls(plan)
        }
        self.grafana_password = None
        if GRAFANA_PASSWORD in walk.built:
            stdout = walk.step(GRAFANA_PASSWORD).stdout
            self.grafana_password = pulumi.Output.secret(stdout.apply(parse_grafana_password))
        views = published_views(plan)
        self.summary = pulumi.Output.all(ready, digests).apply(
            lambda done: {
                **views,
                "targets": [line.strip() for line in done[0].splitlines() if line.strip()],
                # Pin each image to what was pulled (`...@sha256:...`).
                "imageDigests": done[1],
            }
        )
        self.register_outputs(
            {"prometheus": walk.container(PROMETHEUS).id, "summary": self.summary}
            | ({"grafana": walk.container(GRAFANA).id} if GRAFANA in walk.built else {})
        )
