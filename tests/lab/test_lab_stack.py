"""The committed Pulumi.lab.yaml is exactly what the lab's defaults need (no root required)."""

from __future__ import annotations

from pathlib import Path

import yaml

from lab import LabSpec
from lab.stack import stack_config

REPO = Path(__file__).resolve().parents[2]


def test_committed_lab_stack_matches_the_default_lab() -> None:
    committed = yaml.safe_load((REPO / "Pulumi.lab.yaml").read_text())["config"]
    assert committed == stack_config(LabSpec())


def test_jump_topology_reaches_workers_through_the_head() -> None:
    config = stack_config(LabSpec(hosts=3, topology="jump"))
    hosts = config["spark-vllm:hosts"]
    assert "spark-vllm:bastion" not in config
    assert hosts[0]["address"] == LabSpec().outside_far_ip and "via" not in hosts[0]
    assert [h["via"] for h in hosts[1:]] == ["spark1", "spark1"]
    assert [h["address"] for h in hosts[1:]] == [h["fabricIp"] for h in hosts[1:]]
    assert config["spark-vllm:vllm"]["tensorParallelSize"] == 3


def test_a_shaped_lab_fabric_lowers_the_link_floor_to_half_its_rate() -> None:
    """`python -m lab up --fabric-rate R`: the link test must not refuse the lab's own shaping."""
    floors = {
        rate: stack_config(LabSpec(fabric_rate=rate))["spark-vllm:fabric"]["minLinkGbps"]
        for rate in (None, "1gbit", "200mbit", "125mbps", "500kbit")
    }
    assert floors == {None: 1, "1gbit": 0.5, "200mbit": 0.1, "125mbps": 0.5, "500kbit": 0.00025}
