"""Runs inside the Ray head container: compare the alive Ray nodes with the configured ones.

    ray_probe.py EXPECTED_IPS GPUS [observe]

Prints one line: `ready ...`, `stray <ips>` (a node joined with an unexpected IP while a
configured one is missing: a wrong NIC), `leaving <ips>` (every configured node is there, and
these are hosts removed from the stack, whose Ray this probe has just stopped, unless told only
to `observe`, as the server's launcher does) or `waiting ...`.

A removed host's resources are deleted only after the whole `pulumi up` (the engine deletes
what left the program last), so its Ray worker would still be in the cluster, and could be
given a vLLM rank, when the new cluster is awaited. Stopping its raylet (`ray stop`, a graceful
SIGTERM that `ray start --block` does not treat as a failure, so Docker does not restart it)
takes it out of the cluster now; its container goes at the end of the run.
"""

import logging
import sys


def verdict(alive: dict[str, float], expected: set[str], gpus_needed: float) -> str:
    stray = sorted(set(alive) - expected)
    if stray and expected <= set(alive):
        return "leaving " + ",".join(stray)
    if stray:
        return "stray " + ",".join(stray)
    gpus = sum(alive.values())
    if set(alive) == expected and gpus >= gpus_needed:
        return f"ready nodes={','.join(sorted(alive))} gpus={gpus:g}"
    missing = ",".join(sorted(expected - set(alive))) or "none"
    return f"waiting missing={missing} gpus={gpus:g}/{gpus_needed:g}"


def main() -> None:
    expected = set(sys.argv[1].split(","))
    gpus_needed = float(sys.argv[2])
    observe_only = sys.argv[3:] == ["observe"]
    import ray  # only inside the Ray image; verdict() is testable without it

    # RAY_ADDRESS (set per node by spark-vllm) points at the head, so this joins, never starts Ray.
    ray.init(logging_level=logging.ERROR, log_to_driver=False)
    nodes = [node for node in ray.nodes() if node["Alive"]]
    alive = {node["NodeManagerAddress"]: float(node["Resources"].get("GPU", 0.0)) for node in nodes}
    answer = verdict(alive, expected, gpus_needed)
    if answer.startswith("leaving") and not observe_only:
        stop_ray_on(ray, [n["NodeID"] for n in nodes if n["NodeManagerAddress"] not in expected])
    print(answer)


def stop_ray_on(ray, node_ids: list) -> None:  # type: ignore[no-untyped-def]
    """`ray stop` on each node, run there by a task pinned to it (the head cannot reach a
    removed host otherwise). The task ends with its node, so it is not waited for long."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def stop_ray_here() -> None:
        import subprocess

        subprocess.Popen(["ray", "stop"], start_new_session=True)

    refs = [
        stop_ray_here.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        ).remote()
        for node_id in node_ids
    ]
    ray.wait(refs, num_returns=len(refs), timeout=20)


if __name__ == "__main__":
    main()
