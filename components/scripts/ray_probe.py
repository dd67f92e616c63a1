"""Runs inside the Ray head container: compare the alive Ray nodes with the configured ones.

Prints one line: `ready ...`, `stray <ips>` (a node joined with an unexpected IP) or `waiting ...`.
"""

import logging
import sys


def verdict(alive: dict[str, float], expected: set[str], gpus_needed: float) -> str:
    stray = sorted(set(alive) - expected)
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
    import ray  # only inside the Ray image; verdict() is testable without it

    # RAY_ADDRESS (set per node by spark-vllm) points at the head, so this joins, never starts Ray.
    ray.init(logging_level=logging.ERROR, log_to_driver=False)
    alive = {
        node["NodeManagerAddress"]: float(node["Resources"].get("GPU", 0.0))
        for node in ray.nodes()
        if node["Alive"]
    }
    print(verdict(alive, expected, gpus_needed))


if __name__ == "__main__":
    main()
