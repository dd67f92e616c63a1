"""The serving image, as pure specs (stacks/plan/steps.py): pulled and recorded on the head,
copied to each worker, checked on every node before a container starts from it, and each
node's compile caches."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from stacks.plan.fabric import head_to_worker, relay_flags
from stacks.plan.nodes import DeploymentPlan, NodePlan
from stacks.plan.steps import Receipt, StepSpec, Timeouts, check, owned, script_call

# Running the image once to list `vllm serve`'s flags imports vLLM (and torch): tens of seconds
# on a real image; bounded so a wedged run cannot hold the deployment.
IMAGE_FACTS_SECONDS = 300


@dataclass(frozen=True)
class ImagePull:
    """The head's Docker daemon pulls the image (pulumi-docker RemoteImage)."""

    ref: str
    platform: str | None
    keep_locally: bool
    timeout_minutes: int


def image_pull(plan: DeploymentPlan) -> ImagePull:
    image = plan.config.image
    return ImagePull(
        ref=image.ref,
        platform=image.platform,
        keep_locally=image.keep_on_destroy,
        timeout_minutes=plan.config.timeouts.image_transfer_minutes,
    )


def front_image_pull(plan: DeploymentPlan) -> ImagePull:
    """The front's image, pulled on the head and kept (small, and what a rollback needs)."""
    image = plan.config.front.image
    return ImagePull(ref=image.ref, platform=image.platform, keep_locally=True, timeout_minutes=15)


def image_id_file(plan: DeploymentPlan) -> str:
    return f"{plan.head.state_dir}/image-id"


def record_image(plan: DeploymentPlan, name: str, image_id: str) -> StepSpec:
    """The pulled image's ID, written on the head (what the waits compare workers with)."""
    head = plan.head
    step = f"{name}-head-record"
    record_file = image_id_file(plan)
    return StepSpec(
        name=step,
        node=head,
        create=script_call(
            head,
            "image-record.sh",
            state_dir=head.state_dir,
            image_id=image_id,
            ref=plan.config.image.ref,
        ),
        receipts=(Receipt(step, head, (check("files", record_file), check("image", image_id))),),
        delete=owned(plan, head, f"rm -f {shlex.quote(record_file)}"),
    )


def sync_image(plan: DeploymentPlan, name: str, worker: NodePlan, image_id: str) -> StepSpec:
    """The head streams the image to `worker` over the fabric unless it has that ID already;
    the delete removes it there unless `image.keepOnDestroy`."""
    minutes = plan.config.timeouts.image_transfer_minutes
    flags: dict[str, str | float] = {
        "image_id": image_id,
        "ref": plan.config.image.ref,
        "worker_bin": worker.bin_dir,  # what a cut copy left is staged beside it
        "timeout_minutes": minutes,
        "compress": "zstd",
        "progress_seconds": plan.config.timeouts.copy_progress_seconds,
        "stall_seconds": plan.config.timeouts.copy_stall_seconds,
        **relay_flags(plan, worker),
    }
    return head_to_worker(
        plan,
        f"{name}-{worker.name}-sync",
        worker,
        "image-sync.sh",
        flags,
        check("image", image_id),
        minutes,
        removable=not plan.config.image.keep_on_destroy,
    )


IMAGE_FACTS_PREFIX = "spark-vllm-image-facts "


def image_facts(plan: DeploymentPlan, name: str, node: NodePlan, image_id: str) -> StepSpec:
    """The image run once on `node` before any container starts from it: its architecture
    against the host's, vllm and ray present (a Ray at least what vLLM requires), and on the
    head, vllm.extraArgs against the image's own `vllm serve --help` (image-facts.sh)."""
    return StepSpec(
        name=f"{name}-{node.name}-facts",
        node=node,
        create=script_call(
            node,
            "image-facts.sh",
            image_id=image_id,
            ref=plan.config.image.ref,
            # Only the head serves: a worker's check does not depend on (or re-run for) them.
            extra_args=json.dumps(list(plan.config.vllm.extra_args) if node.is_head else []),
            check_flags="yes" if node.is_head else "no",
            executor=plan.config.vllm.executor,
            timeout_seconds=IMAGE_FACTS_SECONDS,
            # Only when set: a stack without it keeps the step's command as it was.
            **({"kv_cache": "yes"} if node.is_head and plan.config.vllm.kv_cache else {}),
        ),
        timeouts=Timeouts(create=IMAGE_FACTS_SECONDS // 60 + 5),
    )


def compile_cache(plan: DeploymentPlan, name: str, node: NodePlan, image_id: str) -> StepSpec:
    """`node`'s compile caches (stacks/plan/nodes.py compile_cache_env), in a directory the
    scripts step made: the step reports its size, and its delete empties it with the serving
    image (its files are the containers' user's) unless vllm.compileCache.keepOnDestroy. The
    delete also empties Ray's session directory, the other one the containers write as root, so
    that the scripts step's delete (as the SSH user) can remove it.
    Runs after the image is on `node`, so a destroy deletes it before the image; a new image is
    an update (only the delete's image changes), which keeps the cache. (A forced `pulumi up
    --replace` of this step would run the old one's delete last and empty a cache the running
    containers bind; the next `up` sees the directory's mark gone and replaces them.)"""
    cache_dir = node.compile_cache_dir
    keep = "yes" if plan.config.vllm.compile_cache.keep_on_destroy else "no"
    remove = script_call(
        node,
        "compile-cache.sh",
        "remove",
        dir=cache_dir,
        ray_dir=node.ray_dir,
        image=image_id,
        keep=keep,
    )
    return StepSpec(
        name=f"{name}-{node.name}",
        node=node,
        create=script_call(node, "compile-cache.sh", "report", dir=cache_dir),
        delete=owned(plan, node, remove),
        timeouts=Timeouts(create=3, update=3, delete=6),
    )


def parse_image_facts(stdout: str) -> dict[str, str]:
    """image-facts.sh's last line: `vllm`, `ray`, `rayRequired`, `python`, `machine`."""
    lines = [line for line in stdout.splitlines() if line.startswith(IMAGE_FACTS_PREFIX)]
    if not lines:
        return {}
    facts = json.loads(lines[-1].removeprefix(IMAGE_FACTS_PREFIX))
    return {key: str(value) for key, value in facts.items() if value is not None}
