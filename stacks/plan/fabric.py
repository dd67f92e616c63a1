"""The fabric between the head and its workers, as pure specs (stacks/plan/steps.py): the head's
key authorized and each worker's host key pinned (fabric.trust managed), the flags every
head-side step needs to reach a worker, and the shape of a head-to-worker transfer (its
receipt kept on the worker), shared by the image and the weights."""

from __future__ import annotations

from stacks.known_hosts import known_hosts_name
from stacks.plan import names
from stacks.plan.cluster import ClusterPlan, NodePlan, node_lines
from stacks.plan.steps import Receipt, StepSpec, Timeouts, check, script_call, undoable


def fabric_trust_managed(plan: ClusterPlan) -> bool:
    """The program makes the head's fabric key and authorizes it (`fabric.trust: managed`)."""
    return plan.config.fabric.trust != "existing" and bool(plan.workers)


def fabric_key_file(plan: ClusterPlan) -> str:
    return f"{plan.head.state_dir}/fabric_ed25519"


def fabric_known_hosts(plan: ClusterPlan) -> str:
    return f"{plan.head.state_dir}/fabric_known_hosts"


def fabric_flags(plan: ClusterPlan) -> dict[str, str]:
    """What a head-side step needs to reach workers: flags for lib.sh's fabric_ssh."""
    if not fabric_trust_managed(plan):
        return {}
    return {"fabric_key": fabric_key_file(plan), "fabric_known_hosts": fabric_known_hosts(plan)}


def fabric_marker(plan: ClusterPlan) -> str:
    """The comment that names this deployment's head key in a worker's authorized_keys."""
    return f"spark-vllm-fabric:{plan.deployment_id}:{plan.head.name}"


def head_fabric_key(plan: ClusterPlan) -> StepSpec:
    head = plan.head
    flags = {"state_dir": head.state_dir, "comment": fabric_marker(plan)}
    key_file = fabric_key_file(plan)
    checks = (check("files", key_file, f"{key_file}.pub"),)
    return undoable(
        plan, names.FABRIC_HEAD_KEY, head, "fabric-key.sh", ("ensure", "remove"), flags, checks
    )


def fabric_sources(plan: ClusterPlan, worker: NodePlan) -> tuple[str, ...]:
    """The addresses the head's fabric key signs in to `worker` from (its `from=` in
    authorized_keys): the head's fabric IP and, where copies relay from worker to worker
    (relay_leader), every other worker's, since any of them may be the hop before `worker` in
    a chain (a model's workers, in their order)."""
    relaying = relay_leader(plan, plan.workers) is not None
    others = [w.fabric_ip for w in plan.workers if relaying and w.name != worker.name]
    return (plan.head.fabric_ip, *others)


def authorize_head_key(plan: ClusterPlan, worker: NodePlan) -> StepSpec:
    """The head's public key (stdin) authorized on `worker` from the fabric addresses that use
    it alone, over the worker's own connection; it prints the worker's host keys, which the
    head then pins."""
    marker = fabric_marker(plan)
    sources = ",".join(fabric_sources(plan, worker))
    return undoable(
        plan,
        names.authorize_of(worker.name),
        worker,
        "authorize-key.sh",
        ("add", "remove"),
        {"marker": marker},
        (check("authorized", marker, sources),),
        create_flags={"from": sources},
        stdin="head-public-key",
        # ~/.ssh/authorized_keys, edited by the exact comment: a revocation must happen even
        # when the state leaf is gone.
        in_state_leaf=False,
    )


def pin_worker_key(plan: ClusterPlan, worker: NodePlan) -> StepSpec:
    """`worker`'s host key pinned on the head under its fabric address. The configured pin wins;
    otherwise the keys the worker printed over its own authenticated connection (stdin), never a
    trust-on-first-use scan over the fabric."""
    head = plan.head
    address = known_hosts_name(worker.fabric_ip, worker.ssh.port)
    flags: dict[str, str] = {"state_dir": head.state_dir, "address": address}
    pinned = worker.ssh.host_key
    return undoable(
        plan,
        names.pin_of(worker.name),
        head,
        "pin-host-key.sh",
        ("add", "remove"),
        flags,
        (check("known-host", fabric_known_hosts(plan), address),),
        create_flags={"key": pinned} if pinned else None,
        stdin=None if pinned else "worker-host-keys",
    )


def relay_leader(plan: ClusterPlan, workers: tuple[NodePlan, ...]) -> NodePlan | None:
    """The worker whose image and weights steps relay to every worker (relay.sh: one stream
    passed from worker to worker, so the head's link carries one copy, not one per worker):
    the first, when there are two or more and the program manages the fabric key it forwards.
    With `fabric.trust: existing` each worker's step copies on its own."""
    if len(workers) < 2 or not fabric_trust_managed(plan):
        return None
    return workers[0]


def relay_flags(
    plan: ClusterPlan, workers: tuple[NodePlan, ...], worker: NodePlan
) -> dict[str, str]:
    """`--relay` (every one of `workers`, in order) for the leader's copies; nothing for the
    others."""
    leader = relay_leader(plan, workers)
    if leader is None or worker.name != leader.name:
        return {}
    return {"relay": node_lines(workers)}


def head_to_worker(
    plan: ClusterPlan,
    step: str,
    worker: NodePlan,
    script: str,
    flags: dict[str, str | float],
    done: str,
    minutes: int,
    removable: bool = False,
) -> StepSpec:
    """A transfer the head runs for `worker` over the fabric; its receipt (the check `done`) is
    kept on the worker. With `removable`, the delete runs the script again with `--remove yes`."""
    head, fabric = plan.head, fabric_flags(plan)
    flags = {"worker": worker.name, "target": worker.fabric_destination, **flags, **fabric}
    return StepSpec(
        name=step,
        node=head,
        create=script_call(head, script, **flags),
        receipts=(Receipt(step, worker, (done,)),),
        delete=(
            # The worker's stage is deleted only while its leaf is this deployment's.
            script_call(head, script, **flags, remove="yes", owner=plan.deployment_id)
            if removable
            else None
        ),
        timeouts=Timeouts(create=minutes + 5),
        fabric=tuple(fabric.items()),
    )
