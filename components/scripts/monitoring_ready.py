"""On the head, once monitoring's containers run: wait (bounded) until Prometheus answers, has
scraped each of its jobs' targets once and finds every one up, and Grafana answers; print one
line per job. A target still down at the deadline fails the step, naming it and Prometheus's
own error for it.

    python3 monitoring_ready.py --host H --prometheus 127.0.0.1:9090 --jobs vllm,front,...
        --timeout-seconds N [--grafana 127.0.0.1:3000]
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from hostlib import StepFailed, require, run_step

# No proxy, whatever the environment says (the image's, vllm.env's or the SSH session's
# http_proxy): these requests go to this cluster's own addresses, some with the API key.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

POLL_SECONDS = 2


def get(url: str) -> tuple[int, bytes]:
    try:
        with DIRECT.open(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


def targets(prometheus: str) -> list[dict[str, Any]] | None:
    """Prometheus's active targets; None while it does not answer. (Its scrape manager takes
    its targets a few seconds after it starts: an empty list until then.)"""
    status, body = get(f"http://{prometheus}/api/v1/targets?state=active")
    if status != 200:
        return None
    active: list[dict[str, Any]] = json.loads(body)["data"]["activeTargets"]
    return active


def summary(active: list[dict[str, Any]], jobs: list[str], optional: set[str]) -> list[str]:
    """A line per job; an optional job with no target (Ray's nodes exporting none) says
    nothing here (its own step said why)."""
    lines = []
    for job in jobs:
        mine = [t for t in active if t["labels"].get("job") == job]
        if job in optional and not mine:
            continue
        up = sum(1 for t in mine if t["health"] == "up")
        lines.append(f"monitoring: {job}: {up} of {len(mine)} targets up")
    return lines


def ready(flags: dict[str, str]) -> None:
    require(flags, "host", "prometheus", "jobs", "timeout-seconds")
    prometheus, grafana = flags["prometheus"], flags.get("grafana")
    timeout_seconds = float(flags["timeout_seconds"])
    jobs = flags["jobs"].split(",")
    optional = set(filter(None, flags.get("optional_jobs", "").split(",")))
    required = [job for job in jobs if job not in optional]
    deadline = time.monotonic() + timeout_seconds
    active: list[dict[str, Any]] = []
    answered = False
    while time.monotonic() < deadline:
        now = targets(prometheus)
        answered = answered or now is not None
        active = now or []
        found = {t["labels"].get("job") for t in active}
        scraped = active and all(t["health"] != "unknown" for t in active)
        needed = [t for t in active if t["labels"].get("job") not in optional]
        if scraped and set(required) <= found and all(t["health"] == "up" for t in needed):
            break
        time.sleep(POLL_SECONDS)
    else:
        if not answered:
            raise StepFailed(
                f"Prometheus at {prometheus} did not answer within {timeout_seconds:.0f} s",
                "its container is not running or another program holds the port "
                "(docker logs of the prometheus container; monitoring.prometheus.port)",
            )
        down = [
            f"{t['labels'].get('job')} {t['scrapeUrl']}: {t.get('lastError') or t['health']}"
            for t in active
            if t["health"] != "up" and t["labels"].get("job") not in optional
        ]
        missing = sorted(set(required) - {t["labels"].get("job") for t in active})
        down += [f"job {job} has no target" for job in missing]
        raise StepFailed(
            f"targets not up after {timeout_seconds:.0f} s: {'; '.join(down)}",
            "the exporter is not running on that node, or a firewall outside spark-vllm drops "
            "its port on the fabric",
        )
    for line in summary(active, jobs, optional):
        print(line)
    for target in active:
        if target["labels"].get("job") in optional and target["health"] != "up":
            # Ray exports metrics from its dashboard agent, which a minimal Ray (`pip install
            # ray`, without `ray[default]`) does not run: reported, not a failure.
            print(
                f"monitoring: {target['labels'].get('job')} {target['scrapeUrl']} is down "
                f"({target.get('lastError') or target['health']}): not required; Ray exports "
                "metrics only with its dashboard agent (ray[default] in the image)"
            )
    if grafana:
        # Its own few seconds at least: Prometheus may have taken the whole bound.
        deadline = max(deadline, time.monotonic() + 30)
        while time.monotonic() < deadline:
            status, _ = get(f"http://{grafana}/api/health")
            if status == 200:
                print(f"monitoring: grafana answers at http://{grafana}")
                return
            time.sleep(POLL_SECONDS)
        raise StepFailed(
            f"Grafana at {grafana} did not answer within {timeout_seconds:.0f} s",
            "its container is not running or another program holds the port "
            "(docker logs of the grafana container; monitoring.grafana.port)",
        )


if __name__ == "__main__":
    sys.exit(run_step("monitoring-ready", sys.argv[1:], ready))
