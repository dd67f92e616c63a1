"""The head's SSH access to each worker over the fabric, for image and weights transfer.

A key made on the head is authorized on each worker through that worker's own (pinned) connection,
and the worker's host key is pinned on the head under its fabric IP. Destroy removes all three.
"""

from __future__ import annotations

import pulumi
from pulumi_command import remote

from components.graph import Walk
from stacks.plan.names import FABRIC, FABRIC_HEAD_KEY, link_of


class FabricTrust(pulumi.ComponentResource):
    links: dict[str, remote.Command]  # by worker: fabric-link.sh's figures on stdout

    def __init__(self, walk: Walk, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:FabricTrust", FABRIC, None, opts)
        walk.build(FABRIC, parent=self)
        self.links = {w.name: walk.step(link_of(w.name)) for w in walk.plan.workers}
        outputs: dict[str, pulumi.Input[object]] = {"managed": FABRIC_HEAD_KEY in walk.built}
        if FABRIC_HEAD_KEY in walk.built:
            outputs["headPublicKey"] = walk.step(FABRIC_HEAD_KEY).stdout
        self.register_outputs({**outputs, "links": [c.stdout for c in self.links.values()]})
