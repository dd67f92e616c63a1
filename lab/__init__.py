"""Simulated DGX Spark hosts (and a bastion) on one Linux machine, for tests and GPU-less users.

from lab import Lab, LabSpec
info = Lab(LabSpec(hosts=2)).up()      # LabInfo
Lab(LabSpec(hosts=2)).ssh("spark2", "docker info")
Lab(LabSpec(hosts=2)).down()
"""

from lab.core import Lab, lab_cgroups, lab_mounts, leftovers, missing_prerequisites
from lab.proc import LabError
from lab.spec import (
    DEFAULT_CACHE_DIR,
    DEFAULT_STATE_DIR,
    HF_MODEL,
    HF_MORE_MODELS,
    HF_REVISION,
    IMAGE_NAME,
    BastionInfo,
    HostInfo,
    LabInfo,
    LabSpec,
    SpecError,
)

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_STATE_DIR",
    "HF_MODEL",
    "HF_MORE_MODELS",
    "HF_REVISION",
    "IMAGE_NAME",
    "BastionInfo",
    "HostInfo",
    "Lab",
    "LabError",
    "LabInfo",
    "LabSpec",
    "SpecError",
    "lab_cgroups",
    "lab_mounts",
    "leftovers",
    "missing_prerequisites",
]
