"""The model snapshot, as pure specs (stacks/plan/steps.py): fetched on the head with the
serving image's HF client, copied to each worker over the fabric."""

from __future__ import annotations

import json
import re

from stacks.fleet import ServedModel
from stacks.plan import names
from stacks.plan.cluster import NodePlan
from stacks.plan.fabric import head_to_worker, relay_flags
from stacks.plan.later import WEIGHTS_BYTES, WEIGHTS_COMMIT, WEIGHTS_FILES
from stacks.plan.server_plan import ServerPlan
from stacks.plan.steps import Receipt, StepSpec, Timeouts, check, script_call


def filter_flags(served: ServedModel) -> dict[str, str]:
    """The model's include/exclude patterns as the weights scripts' flags (JSON lists, one word
    each); none without patterns, so a stack without them plans the steps it planned before."""
    flags = {"include": served.include, "exclude": served.exclude}
    return {key: json.dumps(list(value)) for key, value in flags.items() if value}


def snapshot_check(cache_dir: str, served: ServedModel, revision: str) -> str:
    """The receipt's check of the snapshot (receipt.sh `snapshot`): with the model's patterns,
    of the files they keep, so a re-check (facts.sh, `up --refresh`) counts what was copied."""
    if not (served.include or served.exclude):
        return check("snapshot", cache_dir, served.id, revision)
    patterns = (json.dumps(list(served.include)), json.dumps(list(served.exclude)))
    return check("snapshot", cache_dir, served.id, revision, *patterns)


def fetch_weights(plan: ServerPlan) -> StepSpec:
    """The snapshot fetched on the head with the serving image's HF client; the token on stdin is
    read by the script and never printed (errors mask it), so its diagnostics can be shown."""
    head, served, cache_dir = plan.head, plan.served, plan.config.model.cache_dir
    minutes = plan.config.timeouts.weights_transfer_minutes
    step = names.fetch_of(names.weights_of(plan.slot))
    return StepSpec(
        name=step,
        node=head,
        create=script_call(
            head,
            "weights-fetch.sh",
            state_dir=head.state_dir,
            cache_dir=cache_dir,
            model=served.id,
            revision=served.revision,
            timeout_minutes=minutes,
            **filter_flags(served),
        ),
        receipts=(Receipt(step, head, (snapshot_check(cache_dir, served, served.revision),)),),
        stdin="hf-token",
        timeouts=Timeouts(create=minutes + 5),
    )


MANIFEST_FIELDS = (WEIGHTS_COMMIT, WEIGHTS_FILES, WEIGHTS_BYTES)


def manifest_values(manifest: str) -> dict[str, str]:
    """The head's snapshot manifest (hf-manifest.sh: "commit files bytes") as the later values
    the copies and the memory check consume."""
    fields = manifest.split()
    if len(fields) != len(MANIFEST_FIELDS):
        raise ValueError(
            f"spark-vllm: the weights fetch printed {manifest!r} where the snapshot's manifest "
            "(commit files bytes) belongs"
        )
    return {later.name: field for later, field in zip(MANIFEST_FIELDS, fields, strict=True)}


COMMIT = re.compile(r"[0-9a-f]{40}")


# A branch or tag is resolved once, at the first fetch: the head records the commit
# (weights-fetch.sh, in its state dir) and points the cache's ref at it, and every later fetch of
# the same model and revision (an update re-runs `create`: a new image, a failed receipt) fetches
# that commit (hf_fetch.py revision_to_fetch). Another head, or a new stack, would resolve the
# branch anew: the commit belongs in the stack.
def unpinned_revision_warning(served: ServedModel, manifest: str) -> str | None:
    """What to tell a user whose `revision` (`served.model_key`: model, models[i]) is a branch or
    tag, with the commit to pin (the manifest's, what the head fetched); None when it is a
    commit."""
    if COMMIT.fullmatch(served.revision):
        return None
    commit = manifest.split()[0]
    return (
        f"{served.model_key}.revision {served.revision} of {served.id} is a branch or tag: the "
        f"head fetched {commit} and keeps fetching that commit, but another head or a new stack "
        f"would resolve {served.revision} again. Pin what was fetched: "
        f"{served.model_key}.revision: {commit}"
    )


def copy_weights(plan: ServerPlan, worker: NodePlan) -> StepSpec:
    """The head's snapshot (`commit files bytes`) copied to `worker` over the fabric, verified."""
    served, cache_dir = plan.served, plan.config.model.cache_dir
    minutes = plan.config.timeouts.weights_transfer_minutes
    flags: dict[str, str | float] = {
        "worker_bin": worker.bin_dir,
        "cache_dir": cache_dir,
        "model": served.id,
        "manifest": " ".join(plan.later(later).text for later in MANIFEST_FIELDS),
        **filter_flags(served),
        "compress": plan.config.fabric.compress,
        "timeout_minutes": minutes,
        "progress_seconds": plan.config.timeouts.copy_progress_seconds,
        "stall_seconds": plan.config.timeouts.copy_stall_seconds,
        **relay_flags(plan.cluster, plan.workers, worker),
    }
    done = snapshot_check(cache_dir, served, plan.later(WEIGHTS_COMMIT).text)
    return head_to_worker(
        plan.cluster,
        names.weights_copy_of(names.weights_of(plan.slot), worker.name),
        worker,
        "weights-sync.sh",
        flags,
        done,
        minutes,
    )
