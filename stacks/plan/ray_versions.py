"""The Ray releases the Ray executor's layout is known to work with (docs/design.md, "Ray where
it works"), as one pure check of the image's Ray version.

The server (Ray's driver) runs in its own container beside the Ray head's, with the host's
network, the host's PID namespace and the head's /tmp/ray (stacks/plan/containers.py,
HOST_PID_ROLES). How `ray.init()` in a driver finds the node to attach to (the ray wheels'
`ray/_private/services.py` and `node.py`):

- up to 2.53: the node's IP from `<session>/node_ip_address.json` (Node
  `_wait_and_get_for_node_address`): the shared /tmp/ray is enough;
- 2.54 (ray PR #59229): `get_node_to_connect_for_driver` scans the processes it can see for a
  raylet's `--node_id` (`find_node_ids`) and asks the GCS for those nodes;
- 2.55 on (ray PR #61029): the same, retried for `RAY_gcs_server_request_timeout_seconds` (60 s)
  while no raylet is visible, then `RuntimeError: No node info found matching attributes: ''`
  (ray issue #63923, open: drivers in their own PID namespace broke). 2.60 is unchanged.

With the host's PID namespace the head's raylet is visible, so every release up to 2.60 works;
the lab runs 2.60 and shows the failure without it (tests/lab/test_e2e.py). A newer Ray may
change the lookup again: the check warns, naming what to do if the server cannot find its node.
"""

from __future__ import annotations

import re

NEWEST_CHECKED = (2, 60)
NODE_LOOKUP_ERROR = "No node info found matching attributes"


def release(version: str) -> tuple[int, int] | None:
    """`2.60.0` -> (2, 60); None for what is not a release number."""
    match = re.match(r"(\d+)\.(\d+)", version.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def ray_layout_warning(version: str) -> str | None:
    """A warning when the image's Ray is newer than the newest release whose driver lookup was
    checked against the layout, or not a release number; None when it is known to work."""
    checked = ".".join(map(str, NEWEST_CHECKED))
    numbers = release(version)
    if numbers is not None and numbers <= NEWEST_CHECKED:
        return None
    lead = f"is newer than {checked}" if numbers is not None else "is not a release number"
    return (
        f"image.ref: ray {version} {lead}; {checked} is the newest release whose driver lookup "
        "spark-vllm checked: the server finds its node's raylet among the host's processes "
        "(ray PRs #59229, #61029). If the server fails to connect to the Ray cluster, caused by "
        f'"{NODE_LOOKUP_ERROR}", use vllm.executor mp (no Ray), or an image with Ray '
        f"{checked} or older"
    )
