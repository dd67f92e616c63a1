"""On the head, once Ray's nodes joined (monitoring.enabled with a Ray model): which of Ray's
nodes export metrics (ray.metricsExportPort answers /metrics), written as Prometheus's file
service discovery for its `ray` job; one line per node.

Ray exports metrics from its dashboard agent, which a minimal Ray install (`pip install ray`,
and vLLM's images, without `ray[default]`) does not run: such a node is left out, said once,
rather than kept as a target that is always down.

    python3 monitoring_ray_targets.py --host H --file PATH --targets IP:PORT=NODE,...
        --timeout-seconds N
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

from hostlib import require, run_step

# No proxy, whatever the environment says (the image's, vllm.env's or the SSH session's
# http_proxy): these requests go to this cluster's own addresses, some with the API key.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

POLL_SECONDS = 2


def answers(address: str) -> str | None:
    """None when http://address/metrics answers 200; else why not."""
    try:
        with DIRECT.open(f"http://{address}/metrics", timeout=5) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (OSError, urllib.error.URLError) as error:
        return str(getattr(error, "reason", error))


def write_targets(flags: dict[str, str]) -> None:
    require(flags, "host", "file", "targets", "timeout-seconds")
    targets = dict(pair.split("=", 1) for pair in flags["targets"].split(","))
    deadline = time.monotonic() + float(flags["timeout_seconds"])
    why: dict[str, str | None] = {}
    # The agent may start a little after the node joined: each node is given the whole bound.
    while True:
        why = {address: answers(address) for address in targets}
        if all(reason is None for reason in why.values()) or time.monotonic() > deadline:
            break
        time.sleep(POLL_SECONDS)
    found = [
        {"targets": [address], "labels": {"node": node}}
        for address, node in targets.items()
        if why[address] is None
    ]
    partial = f"{flags['file']}.tmp"
    with open(partial, "w") as out:
        json.dump(found, out)
    os.chmod(partial, 0o644)
    os.replace(partial, flags["file"])
    for address, node in targets.items():
        if why[address] is None:
            print(f"monitoring: ray: {node} ({address}) exports metrics: scraped")
        else:
            print(
                f"monitoring: ray: {node} ({address}) exports no metrics ({why[address]}): "
                "not scraped; Ray exports them only with its dashboard agent (ray[default] "
                "in the image)"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(run_step("monitoring-ray-targets", sys.argv[1:], write_targets))
