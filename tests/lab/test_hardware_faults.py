"""Hardware that must not be trusted, tried against the lab (issue 13): a slow fabric, an MTU that
differs between the ends, and a known-bad kernel (too little memory for the server:
test_memory_faults.py). Each is refused before the image or the weights go over the link, or
before anything starts, with its figures, and the next `up` succeeds once the fault is gone."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest

from lab import Lab
from lab.stack import PROJECT
from tests.lab.deploying import host_sh, lab_config
from tests.lab.faulting import (
    assert_no_container_started,
    failing_up,
    fault_runs,
    module_lab,
    successful_up,
)
from tests.lab.realmocks import RealMocks

pytestmark = pytest.mark.lab

WORKER = "spark2"


@pytest.fixture(scope="module")
def lab(lab_factory: Callable[..., Lab]) -> Iterator[Lab]:
    yield from module_lab(lab_factory, "hardware")


@pytest.fixture
def stack(lab: Lab) -> Iterator[list[RealMocks]]:
    yield from fault_runs(lab)


def assert_nothing_went_over_the_fabric(lab: Lab, runs: list[RealMocks]) -> None:
    """Refused by the link test: no copy to the worker ran, no container started."""
    ran = {entry.name for entry in runs[-1].journal}
    assert not {"image-spark2-sync", "weights-spark2-copy"} & ran, ran
    assert_no_container_started(lab)


def test_a_slow_fabric_is_refused_with_the_measured_figure(
    lab: Lab, stack: list[RealMocks]
) -> None:
    head_fabric = lab.spec.fabric_ifname(0)
    lab.exec("spark1", ["tc", "qdisc", "replace", "dev", head_fabric, "root", "tbf",
                        "rate", "200mbit", "burst", "256kb", "latency", "50ms"])  # fmt: skip
    try:
        error = failing_up(lab, stack)
    finally:
        lab.exec("spark1", ["tc", "qdisc", "del", "dev", head_fabric, "root"])
    found = re.search(
        r"spark1: fabric-link: the fabric from spark1 to spark2 measured ([\d.]+) Gbit/s "
        r"\(4 TCP streams, 3 s\), below fabric.minLinkGbps 1 \(negotiated speed: spark1 ",
        error,
    )
    assert found, error
    assert float(found.group(1)) < 0.25  # the shaped 200 Mbit/s, not the veth's rate
    assert "likely cause: a degraded cable or port" in error
    assert_nothing_went_over_the_fabric(lab, stack)
    outputs = successful_up(lab, stack)
    assert outputs["fabricLinks"][WORKER]["gbps"] > 1, outputs["fabricLinks"]


def test_a_different_mtu_on_one_end_is_refused_naming_it(lab: Lab, stack: list[RealMocks]) -> None:
    worker_fabric = lab.spec.fabric_ifname(1)
    mtu = host_sh(lab, WORKER, f"cat /sys/class/net/{worker_fabric}/mtu")
    lab.exec(WORKER, ["ip", "link", "set", "dev", worker_fabric, "mtu", "1400"])
    try:
        error = failing_up(lab, stack)
    finally:
        lab.exec(WORKER, ["ip", "link", "set", "dev", worker_fabric, "mtu", mtu])
    assert (
        f"spark1: fabric-link: the fabric's MTU differs between the ends: "
        f"spark1 {lab.spec.fabric_ifname(0)} has {mtu}, spark2 {worker_fabric} has 1400"
    ) in error, error
    assert "likely cause: an MTU mismatch" in error
    assert_nothing_went_over_the_fabric(lab, stack)


# The release users reported first: any 7.0-series kernel booted without kho=off is refused
# (components/scripts/host_rules.py); the lab's command line is this machine's, without it.
KNOWN_BAD_KERNEL = "7.0.0-1019-nvidia"


@pytest.fixture
def known_bad_kernel(lab: Lab) -> Iterator[str]:
    """The worker reports the known-bad kernel: a file bound over its osrelease, in the worker's
    own mount namespace (the lab's hosts share this machine's kernel)."""
    lab.sh(WORKER, f"echo {KNOWN_BAD_KERNEL} > /tmp/osrelease && "
                   "mount --bind /tmp/osrelease /proc/sys/kernel/osrelease")  # fmt: skip
    try:
        assert host_sh(lab, WORKER, "cat /proc/sys/kernel/osrelease") == KNOWN_BAD_KERNEL
        yield KNOWN_BAD_KERNEL
    finally:
        lab.sh(WORKER, "umount /proc/sys/kernel/osrelease; rm -f /tmp/osrelease")


def test_a_known_bad_kernel_is_refused_and_can_be_allowed(
    lab: Lab, stack: list[RealMocks], known_bad_kernel: str
) -> None:
    error = failing_up(lab, stack)
    assert (
        f"spark2: preflight: the kernel {known_bad_kernel} runs Kexec HandOver (booted without "
        "kho=off): NCCL fails at init with ibv_reg_mr_iova2 ENOMEM over RoCE"
    ) in error, error
    assert "add kho=off to GRUB_CMDLINE_LINUX_DEFAULT" in error
    assert "preflight.allowKnownBad: true deploys anyway" in error
    assert_no_container_started(lab)
    # Allowed: deployed, with a warning for the release and for the mixed kernels.
    config = lab_config(lab)
    config[f"{PROJECT}:preflight"] = {**config[f"{PROJECT}:preflight"], "allowKnownBad": True}
    successful_up(lab, stack, config)
    warnings = [line for line in stack[-1].program_log if line.startswith("WARNING")]
    assert any(
        f"spark2: the kernel {known_bad_kernel} runs Kexec HandOver" in w for w in warnings
    ), warnings
    assert any("the nodes run different kernels (spark1 " in w for w in warnings), warnings
