"""Every model a stack serves, as one typed list (the fleet), and what it asks of each node.

A stack names its models one of two ways: `model` + `vllm` (one model on every host, as every
release before), or `models` (a list). Both become the same ServedModel entries here, so the
plan reads one shape. Pure functions of the typed config: table-tested without Pulumi."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from stacks.schema import ImageConfig, ServerSettings, StackSchema

# What the fixed memory shares on one node may sum to (gpuMemoryUtilization's own bound: the
# operating system and the containers' own processes keep the rest of unified memory).
MAX_NODE_SHARE = 0.98
# The least share an `auto` model is left on a node beside the fixed ones (6.4 GB of a
# 128 GB Spark): below it no model's weights and KV cache fit.
MIN_AUTO_SHARE = 0.05
# What each server takes beside its fraction when several share a node (the CUDA context, NCCL
# buffers, CUDA graphs on vLLM 0.11: 5.4-6.7 GiB measured per server on a Spark,
# llamastash/llamastash#80/#81): vLLM counts it as used memory, not within its fraction
# (v1/worker/gpu_worker.py: the fraction is of the device's total).
SERVER_OVERHEAD_SHARE = 0.05
# vLLM's own ports on every node, with either executor: VLLM_PORT is where its message queues'
# ports start (vllm/utils/network_utils.py: from VLLM_PORT upwards, else random), set to the
# server's master port + 1 so that they stay inside a known range the firewall can cover. The
# next server's master port follows them.
MP_PORT_SPAN = 32


@dataclass(frozen=True)
class ServedModel:
    """One server of the fleet: which model, where, with what settings. `model_key` and
    `settings_key` are where the user wrote them (for keyed errors): `model`/`vllm`, or both
    `models[i]`."""

    model_key: str
    settings_key: str
    id: str
    revision: str
    served_name: str
    hosts: tuple[str, ...]
    settings: ServerSettings
    image: ImageConfig
    # The Hugging Face glob patterns of the files fetched and copied (none: every file).
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @property
    def tensor_parallel_size(self) -> int:
        # Both ways of naming a model require it (StackConfig's checks run before any use).
        assert self.settings.tensor_parallel_size is not None, self.settings_key
        return self.settings.tensor_parallel_size

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.settings.pipeline_parallel_size


def fleet_of(cfg: StackSchema) -> tuple[ServedModel, ...]:
    """The stack's models in the order written: `models`, or `model` + `vllm` on every host."""
    every_host = tuple(h.name for h in cfg.hosts)
    if cfg.models is None:
        model_id = cfg.model.id or ""  # required without `models` (StackConfig's checks)
        return (
            ServedModel(
                model_key="model",
                settings_key="vllm",
                id=model_id,
                revision=cfg.model.revision,
                include=tuple(cfg.model.include),
                exclude=tuple(cfg.model.exclude),
                served_name=cfg.model.served_name or model_id,
                hosts=every_host,
                settings=cfg.vllm,
                image=cfg.image,
            ),
        )
    return tuple(
        ServedModel(
            model_key=f"models[{index}]",
            settings_key=f"models[{index}]",
            id=entry.id,
            revision=entry.revision,
            include=tuple(entry.include),
            exclude=tuple(entry.exclude),
            served_name=entry.served_name or entry.id,
            hosts=tuple(entry.hosts) if entry.hosts else every_host,
            settings=entry,
            image=entry.image or cfg.image,
        )
        for index, entry in enumerate(cfg.models)
    )


def models_on(fleet: Iterable[ServedModel], host: str) -> list[ServedModel]:
    return [m for m in fleet if host in m.hosts]


def share_text(model: ServedModel) -> str:
    return f"{model.settings_key} ({model.served_name}) {model.settings.gpu_memory_utilization}"


def budget_problem(fleet: Sequence[ServedModel], hosts: Sequence[str]) -> str | None:
    """The first node whose models' memory shares cannot fit, as a keyed message (the key: the
    last model placed there), or None. The fixed fractions, MIN_AUTO_SHARE for each `auto`
    model (the memory check divides what the node has free among them when the servers start)
    and SERVER_OVERHEAD_SHARE for each server sum to at most MAX_NODE_SHARE."""
    for host in hosts:
        placed = models_on(fleet, host)
        if len(placed) < 2:
            continue  # one model: its own bounds (gpuMemoryUtilization <= 0.98) hold it
        fixed = sum(
            share for m in placed if isinstance(share := m.settings.gpu_memory_utilization, float)
        )
        autos = sum(1 for m in placed if m.settings.gpu_memory_utilization == "auto")
        needed = fixed + autos * MIN_AUTO_SHARE + len(placed) * SERVER_OVERHEAD_SHARE
        if needed <= MAX_NODE_SHARE + 1e-9:
            continue
        shares = " + ".join(share_text(m) for m in placed)
        auto_part = f" (each auto at least {MIN_AUTO_SHARE})" if autos else ""
        return (
            f"{placed[-1].settings_key}.gpuMemoryUtilization: on {host} the models' memory "
            f"shares do not fit: {shares}{auto_part}, and {SERVER_OVERHEAD_SHARE} beside "
            f"each server = {needed:.2f} of its memory, more than {MAX_NODE_SHARE}; lower a "
            "gpuMemoryUtilization, or place a model on other hosts (models[].hosts)"
        )
    return None


@dataclass(frozen=True)
class ServerSlot:
    """Where one model's server sits in the deployment: its slot names its resources, its
    containers and its ports. Slot 0 has the names and ports of a stack of one model
    (`vllm-container`, `vllm.serverPort`...): adding models to a stack plans nothing new for it.
    Slot k > 0: `<base>-s<k>`, `serverPort + k`, `masterPort + k * (MP_PORT_SPAN + 1)`."""

    index: int
    model: ServedModel
    record_key: str  # what the head records its slot under (slot_keys)

    def named(self, base: str) -> str:
        return base if self.index == 0 else f"{base}-s{self.index}"

    def server_port(self, base: int) -> int:
        return base + self.index

    def master_port(self, base: int) -> int:
        return base + self.index * (MP_PORT_SPAN + 1)


def slot_keys(fleet: Sequence[ServedModel]) -> list[str]:
    """What each model's slot is recorded under on the head: its served name; replicas (entries
    sharing one) add their hosts, sorted (hosts differ between replicas)."""
    counts = Counter(m.served_name for m in fleet)
    return [
        m.served_name
        if counts[m.served_name] == 1
        else f"{m.served_name}@{','.join(sorted(m.hosts))}"
        for m in fleet
    ]


def assign_slots(
    fleet: Sequence[ServedModel], recorded: Mapping[str, int]
) -> tuple[ServerSlot, ...]:
    """Each model's slot, in the fleet's order: the one recorded on the head for it (the front's
    routes, written with them); else a slot a model that left the fleet held, lowest first (a
    model switched in an entry takes the slot it frees: its fixed-name containers are then
    replaced, deleted first, so the old server's memory is free before the new one starts);
    else the lowest slot never used. Adding or removing a model never moves another one.
    Without a record (one model, or the first change to several) the models take slots in the
    order written."""
    keys = slot_keys(fleet)
    kept = {recorded[key] for key in keys if key in recorded}
    freed = sorted(set(recorded.values()) - kept)
    used = set(recorded.values())
    slots: list[ServerSlot] = []
    for model, key in zip(fleet, keys, strict=True):
        if key in recorded:
            index = recorded[key]
        elif freed:
            index = freed.pop(0)
        else:
            index = next(k for k in range(len(fleet) + len(used)) if k not in used)
        used.add(index)
        slots.append(ServerSlot(index, model, key))
    return tuple(slots)
