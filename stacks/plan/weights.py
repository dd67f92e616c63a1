"""The model snapshot, as pure specs (stacks/plan/steps.py): fetched on the head with the
serving image's HF client, copied to each worker over the fabric."""

from __future__ import annotations

from stacks.plan.fabric import head_to_worker, relay_flags
from stacks.plan.nodes import DeploymentPlan, NodePlan
from stacks.plan.steps import Receipt, StepSpec, Timeouts, check, script_call


def fetch_weights(plan: DeploymentPlan, name: str) -> StepSpec:
    """The snapshot fetched on the head with the serving image's HF client; the token on stdin is
    read by the script and never printed (errors mask it), so its diagnostics can be shown."""
    head, model = plan.head, plan.config.model
    minutes = plan.config.timeouts.weights_transfer_minutes
    step = f"{name}-fetch"
    return StepSpec(
        name=step,
        node=head,
        create=script_call(
            head,
            "weights-fetch.sh",
            state_dir=head.state_dir,
            cache_dir=model.cache_dir,
            model=model.id,
            revision=model.revision,
            timeout_minutes=minutes,
        ),
        receipts=(
            Receipt(step, head, (check("snapshot", model.cache_dir, model.id, model.revision),)),
        ),
        stdin="hf-token",
        timeouts=Timeouts(create=minutes + 5),
    )


def copy_weights(plan: DeploymentPlan, name: str, worker: NodePlan, manifest: str) -> StepSpec:
    """The head's snapshot (`commit files bytes`) copied to `worker` over the fabric, verified."""
    model, minutes = plan.config.model, plan.config.timeouts.weights_transfer_minutes
    commit = manifest.split()[0] if manifest.split() else manifest
    flags: dict[str, str | float] = {
        "worker_bin": worker.bin_dir,
        "cache_dir": model.cache_dir,
        "model": model.id,
        "manifest": manifest,
        "timeout_minutes": minutes,
        "progress_seconds": plan.config.timeouts.copy_progress_seconds,
        "stall_seconds": plan.config.timeouts.copy_stall_seconds,
        **relay_flags(plan, worker),
    }
    done = check("snapshot", model.cache_dir, model.id, commit)
    return head_to_worker(
        plan, f"{name}-{worker.name}-copy", worker, "weights-sync.sh", flags, done, minutes
    )
