"""The firewall on every host: a guard container that holds the cluster's rules (and puts them
back at boot), then a step that waits until they hold (stacks/plan/firewall.py)."""

from __future__ import annotations

import pulumi

from components.graph import Walk
from stacks.plan.names import FIREWALL


class Firewall(pulumi.ComponentResource):
    """Every Ray and vLLM container of a node starts after the step that waits for its rules
    (and, at each start, through the gate)."""

    def __init__(self, walk: Walk, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:Firewall", FIREWALL, None, opts)
        walk.build(FIREWALL, parent=self)
        self.register_outputs({})
