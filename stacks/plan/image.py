"""The serving image, as pure specs (stacks/plan/steps.py): pulled and recorded on the head,
copied to each worker, checked on every node before a container starts from it, and each
node's compile caches."""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass

from stacks.config import ImageConfig
from stacks.fleet import ServedModel, ServerSlot
from stacks.nccl_versions import known_bad_rows, neutralised
from stacks.plan import names
from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.container_paths import CONTAINER_HOST_NCCL
from stacks.plan.fabric import head_to_worker, relay_flags
from stacks.plan.later import IMAGE_ID, PINNED_IMAGE, Later
from stacks.plan.nccl import own_known_bad
from stacks.plan.steps import Receipt, StepSpec, Timeouts, check, owned, script_call
from stacks.vllm_versions import default_block_size, removed_env

# Running the image once to list `vllm serve`'s flags imports vLLM (and torch): tens of seconds
# on a real image; bounded so a wedged run cannot hold the deployment.
IMAGE_FACTS_SECONDS = 300


@dataclass(frozen=True)
class ImageStream:
    """One serving image and its way to the nodes: pulled on the head, copied to the workers
    that run it, checked and kept there. image.ref's (`key` empty: every node, where the
    firewall's guard and the weights fetch run it too) keeps the names every stack had
    (`image-pull`...); an entry's own image is named after its ref (`image-i<8 hex of its
    sha256>-pull`...): models sharing one image share its copies, and adding or removing any
    model never renames another's image (a name taken from a slot would move when that slot's
    model goes, and replace the servers of the models left on it)."""

    key: str
    image: ImageConfig
    nodes: tuple[NodePlan, ...]  # the head (where it is pulled) and the hosts that run it
    models: tuple[ServedModel, ...]  # the servers that run it, in the fleet's order

    @property
    def workers(self) -> tuple[NodePlan, ...]:
        """The nodes it is copied to (all but the head)."""
        return tuple(n for n in self.nodes if not n.is_head)

    def named(self, base: str) -> str:
        return f"{base}-{self.key}" if self.key else base

    @property
    def component(self) -> str:
        """The component its resources are registered under."""
        return self.named(names.IMAGE)

    def later(self, value: Later) -> Later:
        if not self.key:
            return value
        component, _, field = value.name.partition(".")
        return Later(f"{component}-{self.key}.{field}")


def image_key(ref: str) -> str:
    """An entry's own image's key: `i` and 8 hex digits of its ref's sha256."""
    return "i" + hashlib.sha256(ref.encode()).hexdigest()[:8]


def image_streams(plan: ClusterPlan) -> tuple[ImageStream, ...]:
    """image.ref's stream, then each other image an entry names, in the order of the lowest slot
    that runs it. A stream's nodes: the head (it pulls) and the hosts of the models it serves."""
    base = plan.config.image
    by_ref: dict[str, list[ServerSlot]] = {}
    for slot in sorted(plan.servers, key=lambda s: s.index):
        if slot.model.image.ref != base.ref:
            by_ref.setdefault(slot.model.image.ref, []).append(slot)
    streams = [
        ImageStream(
            "",
            base,
            plan.nodes,
            tuple(s.model for s in plan.servers if s.model.image.ref == base.ref),
        )
    ]
    for ref, slots in by_ref.items():
        hosts = {h for slot in slots for h in slot.model.hosts}
        nodes = tuple(n for n in plan.nodes if n.is_head or n.name in hosts)
        models = tuple(s.model for s in plan.servers if s.model.image.ref == ref)
        streams.append(ImageStream(image_key(ref), slots[0].model.image, nodes, models))
    return tuple(streams)


@dataclass(frozen=True)
class ImagePull:
    """The head's Docker daemon pulls the image (pulumi-docker RemoteImage)."""

    ref: str
    platform: str | None
    keep_locally: bool
    timeout_minutes: int
    key: str = "image.ref"  # the setting that names it, for the unpinned warning
    output: str = "the imageDigest output"  # where the digest it pulled is published


def image_pull(plan: ClusterPlan, stream: ImageStream) -> ImagePull:
    image = stream.image
    return ImagePull(
        ref=image.ref,
        platform=image.platform,
        keep_locally=image.keep_on_destroy,
        timeout_minutes=plan.config.timeouts.image_transfer_minutes,
        key=f"{stream.models[0].model_key}.image.ref" if stream.key else "image.ref",
        output="the models output" if stream.key else "the imageDigest output",
    )


# A ref that names a digest (`repo:tag@sha256:...` or `repo@sha256:...`) is pinned: the head's
# Docker resolves it by the repository and the digest alone, the tag ignored (moby
# docker-v29.7.2 daemon/internal/refstore/store.go `Get`: "only lookup by digest as it takes
# precedence over tag"; the containerd store's daemon/containerd/image.go `resolveImage` matches
# `target.digest` and the repository name), so neither a later pull of the tag nor
# `pulumi up --refresh` can move it. Pin the digest the head pulled (an index digest for a
# multi-platform image resolves there after a pull by tag or by that digest). A bare tag is
# not: pulumi-docker pulls it only when the head lacks it, and a refresh reads it again by name
# (terraform-provider-docker v4.5.0 resource_docker_image_funcs.go resourceDockerImageRead:
# ImageInspect(name), then image_id and repo_digest set to what the name resolves to now), so a
# `docker pull` of the same tag on the head, then `pulumi up --refresh`, rolls the new image out
# to every node without a change in the stack.
DIGEST_MARK = "@sha256:"


def is_pinned(ref: str) -> bool:
    """Whether `ref` names its image by digest."""
    return DIGEST_MARK in ref


def unpinned_warning(pull: ImagePull, repo_digest: str) -> str | None:
    """What to tell a user whose image ref (`pull.key`: image.ref, front.image.ref, ...) is a
    bare tag, with the exact ref to pin (the tag kept for the reader, the digest pulled:
    `repo_digest`, `repo@sha256:...`); None when it is pinned. An image with no repo digest
    (built or loaded there, never pulled) cannot be pinned by digest."""
    ref, key = pull.ref, pull.key
    if is_pinned(ref):
        return None
    if not repo_digest or DIGEST_MARK not in repo_digest:
        return (
            f"{key} {ref} is a tag with no registry digest where it was pulled (built or "
            "loaded there, not pulled): a new image under the same tag is rolled out by the "
            "next `pulumi up --refresh`"
        )
    digest = repo_digest.split("@", 1)[1]
    return (
        f"{key} {ref} is a tag, not pinned: a `docker pull` of it there, then "
        "`pulumi up --refresh`, rolls a new image out without a change in the stack. Pin what "
        f"was pulled: {key}: {ref}@{digest} ({pull.output})"
    )


def front_image_pull(plan: ClusterPlan) -> ImagePull:
    """The front's image, pulled on the head and kept (small, and what a rollback needs)."""
    image = plan.config.front.image
    return ImagePull(
        ref=image.ref,
        platform=image.platform,
        keep_locally=True,
        timeout_minutes=15,
        key="front.image.ref",
        output="the frontImageDigest output",
    )


# Every container and step names the serving image by a tag made from the head's image ID, on
# every node: an ID names an image only on the store that made it. With the containerd image
# store (Docker 29's default) a worker's ID for the same image is the digest of the manifest it
# holds, so the head's ID does not resolve there (checked in the lab with Docker 26); a tag does,
# on every store. The head's record step and each worker's copy give the image this tag once it
# is verified there by content (image_layers.py identity). `.invalid` is a reserved domain
# (RFC 2606): should anything ever pull the name, it cannot fetch someone else's image.
# pulumi-docker keeps a container's `image` as given when it is not an ID
# (terraform-provider-docker v4.5.0 resource_docker_container_funcs.go:837-845), so a refresh
# does not turn it into a diff.
PINNED_REPOSITORY = "spark-vllm.invalid/image"


def pinned_image(image_id: str, key: str = "") -> str:
    """A serving image's name on every node (PINNED_REPOSITORY; an entry's own image in a
    repository of its stream's (ImageStream.key): two refs of one image keep a name each, so
    removing one stream never takes the other's name)."""
    repository = f"{PINNED_REPOSITORY}-{key}" if key else PINNED_REPOSITORY
    return f"{repository}:{image_id.replace(':', '-')}"


def image_id_file(plan: ClusterPlan, stream: ImageStream) -> str:
    return f"{plan.head.state_dir}/{stream.named('image-id')}"


def record_image(plan: ClusterPlan, stream: ImageStream) -> StepSpec:
    """The pulled image's ID, written on the head (what the waits compare workers with), and
    its pinned name there; the delete takes the name off again (image-record.sh)."""
    head = plan.head
    step = names.image_record_of(stream.component)
    record_file = image_id_file(plan, stream)
    pinned = stream.later(PINNED_IMAGE).text
    unpin = script_call(
        head,
        "image-record.sh",
        "remove",
        pinned=pinned,
        keep="yes" if stream.image.keep_on_destroy else "no",
    )
    return StepSpec(
        name=step,
        node=head,
        create=script_call(
            head,
            "image-record.sh",
            "record",
            state_dir=head.state_dir,
            image_id=stream.later(IMAGE_ID).text,
            ref=stream.image.ref,
            pinned=pinned,
            # An entry's own image keeps its own record: `image-id` is image.ref's, which the
            # weights fetch runs (image.ref's command stays as it was).
            **({"record_file": stream.named("image-id")} if stream.key else {}),
        ),
        receipts=(Receipt(step, head, (check("files", record_file), check("image", pinned))),),
        delete=f"{owned(plan, head, f'rm -f {shlex.quote(record_file)}')}; {unpin}",
    )


def sync_image(plan: ClusterPlan, worker: NodePlan, stream: ImageStream) -> StepSpec:
    """The head streams the image to `worker` over the fabric unless it has it already (by
    content, under its pinned name); the delete removes it there unless `image.keepOnDestroy`."""
    minutes = plan.config.timeouts.image_transfer_minutes
    pinned = stream.later(PINNED_IMAGE).text
    flags: dict[str, str | float] = {
        "image_id": stream.later(IMAGE_ID).text,
        "ref": stream.image.ref,
        "pinned": pinned,
        "worker_bin": worker.bin_dir,  # what a cut copy left is staged beside it
        "timeout_minutes": minutes,
        "compress": plan.config.fabric.compress,
        "progress_seconds": plan.config.timeouts.copy_progress_seconds,
        "stall_seconds": plan.config.timeouts.copy_stall_seconds,
        **relay_flags(plan, stream.workers, worker),
    }
    return head_to_worker(
        plan,
        names.image_sync_of(stream.component, worker.name),
        worker,
        "image-sync.sh",
        flags,
        check("image", pinned),
        minutes,
        removable=not stream.image.keep_on_destroy,
    )


IMAGE_FACTS_PREFIX = "spark-vllm-image-facts "


def image_facts(plan: ClusterPlan, node: NodePlan, stream: ImageStream) -> StepSpec:
    """The image run once on `node` before any container starts from it: its architecture
    against the host's, vllm and ray present (a Ray at least what vLLM requires), and on the
    head, the extraArgs of every model it serves against the image's own `vllm serve --help`
    (image-facts.sh). image.ref's serving none (every entry has its own) is checked as mp's."""
    fleet = stream.models
    extra_args = [arg for model in fleet for arg in model.settings.extra_args]
    kv_cache = any(model.settings.kv_cache for model in fleet)
    removed = removed_settings(fleet) if node.is_head else []
    # The known-bad NCCL rows travel in the scripts bundle; the neutralisers every model of
    # this image sets, and (vllm.hostNccl) the host library to load, only when there are any.
    neutralisers = neutralised(model.settings.env for model in fleet)
    own_nccl = known_bad_rows(own_known_bad(plan))  # preflight.knownBad's kind nccl, if any
    host_nccl = (
        {"host_nccl": node.host_nccl, "nccl_target": CONTAINER_HOST_NCCL} if node.host_nccl else {}
    )
    return StepSpec(
        name=names.image_facts_of(node.name, stream.component),
        node=node,
        create=script_call(
            node,
            "image-facts.sh",
            image=stream.later(PINNED_IMAGE).text,
            ref=stream.image.ref,
            # Every model's flags, checked once on the head: a worker's check does not depend
            # on (or re-run for) them.
            extra_args=json.dumps(extra_args if node.is_head else []),
            check_flags="yes" if node.is_head else "no",
            executor=",".join(dict.fromkeys(m.settings.executor for m in fleet)) or "mp",
            timeout_seconds=IMAGE_FACTS_SECONDS,
            enable_linger="yes" if plan.config.preflight.enable_linger else "no",
            # Only when set: a stack without it keeps the step's command as it was.
            **({"kv_cache": "yes"} if node.is_head and kv_cache else {}),
            **({"removed": json.dumps(removed)} if removed else {}),
            **({"nccl_env": json.dumps(neutralisers, sort_keys=True)} if neutralisers else {}),
            **({"known_bad_nccl": json.dumps(own_nccl)} if own_nccl else {}),
            **host_nccl,
        ),
        timeouts=Timeouts(create=IMAGE_FACTS_SECONDS // 60 + 5),
    )


def removed_settings(fleet: tuple[ServedModel, ...]) -> list[dict[str, str]]:
    """The variables the models set that some vLLM release removed (stacks/vllm_versions.py),
    keyed as the user wrote them: image_facts.py refuses those its image's vLLM no longer has.
    (Our own env sets none: tests/program/test_vllm_versions.py holds it to that.)"""
    rows = []
    for model in fleet:
        for key in model.settings.env:
            row = removed_env(key)
            if row is not None:
                rows.append(
                    {
                        "key": f"{model.settings_key}.env.{key}",
                        "version": row.version,
                        "what": row.what,
                        "fix": f"{row.fix}; remove it from {model.settings_key}.env",
                    }
                )
    return rows


def compile_cache(plan: ClusterPlan, node: NodePlan) -> StepSpec:
    """`node`'s compile caches (stacks/plan/arguments.py compile_cache_env), in a directory the
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
        image=PINNED_IMAGE.text,
        keep=keep,
    )
    return StepSpec(
        name=names.compile_cache_of(node.name),
        node=node,
        create=script_call(node, "compile-cache.sh", "report", dir=cache_dir),
        delete=owned(plan, node, remove),
        timeouts=Timeouts(create=3, update=3, delete=6),
    )


IMAGES_PREFIX = "spark-vllm-images "


def image_history_file(node: NodePlan, key: str = "") -> str:
    """The pinned names of the images `node` was given, oldest first (image_retain.py), one
    history per image stream (ImageStream.key)."""
    return f"{node.state_dir}/image-history" + (f"-{key}" if key else "")


def retain_images(plan: ClusterPlan, node: NodePlan, stream: ImageStream) -> StepSpec:
    """Once the image is on `node`: it joins the node's history, and images older than
    image.keepPrevious previous ones lose their pinned name (image_retain.py), so the disk holds
    a bounded number and a rollback to a kept one copies nothing. Re-runs when the image
    changes; nothing to undo (image.ref's history goes with the scripts' delete; an entry's own
    image's with this step, so adding one changes no scripts step)."""
    history = image_history_file(node, stream.key)
    forget = owned(plan, node, f"rm -f {shlex.quote(history)}") if stream.key else None
    return StepSpec(
        name=names.retained_on(node.name, stream.component),
        node=node,
        create=script_call(
            node,
            "image_retain.py",
            history=history,
            pinned=stream.later(PINNED_IMAGE).text,
            keep_previous=stream.image.keep_previous,
        ),
        delete=forget,
        # Each removal is bounded (4 min): an image in use is refused at once.
        timeouts=Timeouts(create=15),
    )


def parse_retained(stdout: str) -> list[str]:
    """image_retain.py's report: the pinned names the node keeps, newest first."""
    lines = [line for line in stdout.splitlines() if line.startswith(IMAGES_PREFIX)]
    if not lines:
        return []
    return [str(name) for name in json.loads(lines[-1].removeprefix(IMAGES_PREFIX))["kept"]]


def kv_block_size(stdout: str) -> str:
    """The KV cache's block size the image's vLLM uses by default, from its image facts (the
    memory check's whole blocks: kv_sizing.py)."""
    return str(default_block_size(parse_image_facts(stdout).get("vllm", "")))


def parse_image_facts(stdout: str) -> dict[str, str]:
    """image-facts.sh's last line: `vllm`, `ray`, `rayRequired`, `python`, `machine`."""
    lines = [line for line in stdout.splitlines() if line.startswith(IMAGE_FACTS_PREFIX)]
    if not lines:
        return {}
    facts = json.loads(lines[-1].removeprefix(IMAGE_FACTS_PREFIX))
    return {key: str(value) for key, value in facts.items() if value is not None}
