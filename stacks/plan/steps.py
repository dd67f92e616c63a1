"""Every command the program runs on a host, as a pure spec: where it runs, its command line, what
it leaves behind (its receipts), how it is undone, what it reads on stdin, and how long it may take.

The components turn these into pulumi-command resources through one helper
(components/steps.py) and add only the graph's edges: what a step runs after, and which
resource's output it reads on stdin. Nothing here performs I/O: the facts a command depends on
(the image ID, the model's manifest, the scripts bundle's digest, each receipt's token) come in
as arguments, so each spec is tested as a function, facts in and commands out
(tests/program/test_steps.py), the way pyinfra tests its operations.

One quoting rule: every word of every command line is `shlex.quote`d (`words`), and the scripts
quote what they send onward with lib.sh's `words`. A state or cache directory holding a space or
a quote stays one word.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from stacks.known_hosts import known_hosts_name
from stacks.plan.firewall import (
    FIREWALLED_LABEL,
    READY_WAIT_SECONDS,
    chain_name,
    firewall_dir,
    rules_digest,
)
from stacks.plan.front import FRONT_CONFIG_NAME, front_config
from stacks.plan.nodes import (
    CONTAINER_SCRIPTS_DIR,
    OWNER_FILE,
    DeploymentPlan,
    NodePlan,
    log_specs,
    node_check_specs,
    node_lines,
    preflight_flags,
)

# Which bundle `<stateDir>/bin` holds (its digest): the scripts' delete checks it.
BUNDLE_MARKER = ".bundle-digest"

# What a step reads on stdin; the component wires the resource (or secret) that provides it.
Stdin = Literal["scripts-bundle", "hf-token", "api-key", "head-public-key", "worker-host-keys"]


@dataclass(frozen=True)
class Timeouts:
    """Minutes the engine waits before it calls a step hung (pulumi.CustomTimeouts)."""

    create: int
    update: int | None = None
    delete: int | None = None


# Running the image once to list `vllm serve`'s flags imports vLLM (and torch): tens of seconds
# on a real image; bounded so a wedged run cannot hold the deployment.
IMAGE_FACTS_SECONDS = 300

# Steps that only edit a file or two on a host: anything slower is a hung connection.
QUICK = Timeouts(create=3, update=3, delete=3)


def words(command: Iterable[str]) -> str:
    """One command line for a POSIX shell, every word quoted: the one quoting rule."""
    return " ".join(shlex.quote(word) for word in command)


def script_call(node: NodePlan, script: str, *positional: str, **flags: str | float) -> str:
    """`bash <bin>/<script> [positional] --host <node> --flag value ...`.

    Command lines stay short (the script lives on the host), so a failure shows a readable one,
    and no secret is ever among the words: secrets travel on stdin.
    """
    command = ["bash", f"{node.bin_dir}/{script}", *positional, "--host", node.name]
    for key, value in flags.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    return words(command)


def check(kind: str, *args: str | int) -> str:
    """One receipt check (see receipt.sh), fields joined by `|`."""
    fields = [kind, *(str(a) for a in args)]
    bad = [f for f in fields if "|" in f or ";" in f or "\n" in f]
    if bad:
        raise ValueError(f"spark-vllm: cannot record a check on {bad[0]!r}: '|' or ';'")
    return "|".join(fields)


@dataclass(frozen=True)
class Receipt:
    """What a step leaves on `node`, as receipt.sh records it once the step succeeded: its token
    (from that node's facts) and the checks that must keep holding (components/facts.py)."""

    step: str
    node: NodePlan
    checks: tuple[str, ...]


@dataclass(frozen=True)
class StepSpec:
    name: str  # the resource's name, and its receipt's step
    node: NodePlan  # whose connection runs it
    create: str  # the command line, without its receipts
    receipts: tuple[Receipt, ...] = ()
    delete: str | None = None
    stdin: Stdin | None = None
    timeouts: Timeouts = QUICK
    quiet: Literal["stderr", "none"] | None = None  # what the engine may show; None: both
    prints: str | None = None  # echoed after the receipts: the step's output
    fabric: tuple[tuple[str, str], ...] = ()  # how the head reaches workers (receipts there)


TokenOf = Callable[[Receipt], str]


def create_command(spec: StepSpec, token_of: TokenOf) -> str:
    """The step's `create`: its command, then each receipt with the token the facts give it."""
    receipts = [_receipt_call(spec, receipt, token_of(receipt)) for receipt in spec.receipts]
    echo = [f"echo {shlex.quote(spec.prints)}"] if spec.prints is not None else []
    return " && ".join([spec.create, *receipts, *echo])


def _receipt_call(spec: StepSpec, receipt: Receipt, token: str) -> str:
    """receipt.sh run where the step ran; for a worker's receipt, written there over the fabric
    (the step ran on the head for it)."""
    target = receipt.node
    flags: dict[str, str] = {
        "state_dir": target.state_dir,
        "step": receipt.step,
        "token": token,
        "checks": ";".join(receipt.checks),
    }
    if target != spec.node:
        flags |= {
            "worker": target.name,
            "target": target.fabric_destination,
            "worker_bin": target.bin_dir,
            **dict(spec.fabric),
        }
    return script_call(spec.node, "receipt.sh", **flags)


def owned(plan: DeploymentPlan, node: NodePlan, command: str) -> str:
    """`command` (a delete inside `node`'s state leaf) run only while the leaf's owner file names
    this deployment: no delete reaches a directory the program did not make. A leaf that is gone
    (removed by hand) has nothing left to delete: the step succeeds, and says so."""
    owner = shlex.quote(node.owner_file)
    skipped = shlex.quote(
        f"spark-vllm: {node.name}: {node.state_dir} is not this deployment's "
        f"({plan.deployment_id}) or is gone: nothing deleted there"
    )
    return (
        f'if [ "$(cat {owner} 2>/dev/null)" = {shlex.quote(plan.deployment_id)} ]; '
        f"then {command}; else echo {skipped} >&2; fi"
    )


def _undoable(
    plan: DeploymentPlan,
    name: str,
    node: NodePlan,
    script: str,
    actions: tuple[str, str],
    flags: dict[str, str],
    checks: tuple[str, ...],
    *,
    create_flags: dict[str, str] | None = None,
    stdin: Stdin | None = None,
    quiet: Literal["stderr", "none"] | None = None,
    in_state_leaf: bool = True,
) -> StepSpec:
    """A quick step whose script both does (`actions[0]`) and undoes (`actions[1]`) its work on
    `node` with the same flags; its receipt is kept there. An undo that deletes inside the state
    leaf (`in_state_leaf`) runs only while the leaf is this deployment's (`owned`)."""
    do, undo = actions
    delete = script_call(node, script, undo, **flags)
    return StepSpec(
        name=name,
        node=node,
        create=script_call(node, script, do, **flags, **(create_flags or {})),
        receipts=(Receipt(name, node, checks),),
        delete=owned(plan, node, delete) if in_state_leaf else delete,
        stdin=stdin,
        quiet=quiet,
    )


# -- hosts -------------------------------------------------------------------------------------


def mounts_step(name: str) -> str:
    """The receipt of the host directories containers bind (a recreated one replaces them)."""
    return f"{name}-mounts"


def bound_dirs(plan: DeploymentPlan, node: NodePlan) -> tuple[str, ...]:
    own = (node.bin_dir, node.ray_dir, node.compile_cache_dir, firewall_dir(node))
    front = (front_dir(plan),) if node.is_head else ()
    return (*own, *front, plan.config.model.cache_dir)


def front_dir(plan: DeploymentPlan) -> str:
    return f"{plan.head.state_dir}/front"


def claim_state_leaf(plan: DeploymentPlan, node: NodePlan) -> str:
    """Make `node`'s state leaf and mark it this deployment's; refuse a leaf that holds files
    without the mark (not made by spark-vllm) or another deployment's mark."""
    leaf, owner = shlex.quote(node.state_dir), shlex.quote(node.owner_file)
    deployment = shlex.quote(plan.deployment_id)
    prefix = f"spark-vllm: {node.name}: scripts: {node.state_dir}"
    foreign = shlex.quote(f"{prefix} holds files spark-vllm did not make: not using it")
    other = shlex.quote(f"{prefix} belongs to deployment ")
    fix = shlex.quote(
        "  likely cause: hosts[].stateDir names a directory in use; choose another base directory"
    )
    return (
        f"mkdir -p -m 700 {leaf} && "
        f'owner="$(cat {owner} 2>/dev/null || true)" && '
        f'if [ -z "$owner" ] && [ -n "$(ls -A {leaf})" ]; then '
        f"echo {foreign} >&2; echo {fix} >&2; exit 1; fi && "
        f'if [ -n "$owner" ] && [ "$owner" != {deployment} ]; then '
        f'echo {other}"$owner" >&2; echo {fix} >&2; exit 1; fi && '
        f"echo {deployment} > {owner}"
    )


def install_scripts(
    plan: DeploymentPlan, name: str, node: NodePlan, scripts_digest: str
) -> StepSpec:
    """Unpack the step scripts (a tarball on stdin) into `<stateDir>/bin`.

    A changed bundle is an update (pulumi-command replaces only on `triggers`), which runs this
    create again over the installed files. The delete removes `bin` only while it holds this
    bundle, so the delete of an older bundle never removes a newer one. (A forced `pulumi up
    --replace` of this resource with the same bundle would still lose `bin` to the old half's
    delete: the delete cannot tell two installs of one bundle apart.) The receipts go with the
    scripts: every other step of this host ran before this delete.
    """
    bound = bound_dirs(plan, node)
    digest = shlex.quote(scripts_digest)  # hex: the same word quoted or not
    bin_dir = shlex.quote(node.bin_dir)
    marker = shlex.quote(f"{node.bin_dir}/{BUNDLE_MARKER}")
    marks = words(f"{d}/.spark-vllm-mark.{mounts_step(name)}" for d in bound)
    # What the deployment made inside its leaf: gone with the scripts, the last step on the host.
    made = words(
        [node.bin_dir, f"{node.state_dir}/receipts", node.ray_dir, firewall_dir(node)]
        + [f"{node.state_dir}/image-stage"]  # what a cut image copy left (image-sync.sh)
        + ([front_dir(plan)] if node.is_head else [])
    )
    leaf, owner = shlex.quote(node.state_dir), shlex.quote(node.owner_file)
    return StepSpec(
        name=f"{name}-scripts",
        node=node,
        create=(
            f"umask 077 && {claim_state_leaf(plan, node)} && mkdir -p {words(bound)} && "
            f"chmod 755 {bin_dir} && base64 -d | tar -xzf - -C {bin_dir} && "
            f"echo {digest} > {marker}"
        ),
        receipts=(
            Receipt(f"{name}-scripts", node, (check("sha256sums", node.bin_dir),)),
            Receipt(mounts_step(name), node, tuple(check("mark", d) for d in bound)),
        ),
        delete=owned(
            plan,
            node,
            f'if [ "$(cat {marker} 2>/dev/null)" = {digest} ]; then '
            f"rm -rf {made} && rm -f {marks} && "
            f'if [ "$(ls -A {leaf})" = {shlex.quote(OWNER_FILE)} ]; then '
            f"rm -f {owner} && rmdir {leaf}; fi; fi",
        ),
        stdin="scripts-bundle",
        timeouts=Timeouts(create=2),
        quiet="stderr",
        prints=scripts_digest,
    )


def preflight(plan: DeploymentPlan, name: str, node: NodePlan) -> StepSpec:
    """Fails early and clearly: ports, memory, disk, GPUs, the fabric interface (preflight.sh)."""
    return StepSpec(
        name=f"{name}-preflight",
        node=node,
        create=script_call(node, "preflight.sh", **preflight_flags(plan, node)),
        timeouts=Timeouts(create=5),
    )


def firewall(plan: DeploymentPlan, name: str, node: NodePlan) -> StepSpec | None:
    """The guard container holds this node's rules (stacks/plan/firewall.py): the step waits,
    bounded, for its first marker, and its delete takes the rules down unless a container
    behind the gate still runs (components/scripts/firewall-step.sh)."""
    if not plan.config.fabric.firewall:
        return None
    flags: dict[str, str | float] = {
        "container": plan.container_name("firewall"),
        "dir": firewall_dir(node),
    }
    return StepSpec(
        name=f"{name}-{node.name}",
        node=node,
        create=script_call(
            node,
            "firewall-step.sh",
            "wait",
            **flags,
            digest=rules_digest(plan, node),
            timeout_seconds=READY_WAIT_SECONDS,
        ),
        delete=script_call(
            node,
            "firewall-step.sh",
            "remove",
            **flags,
            chain=chain_name(plan),
            label=FIREWALLED_LABEL,
        ),
    )


def write_front_config(plan: DeploymentPlan, name: str) -> StepSpec:
    """The front's haproxy.cfg on the head, whole on the command line: it holds no secret, so
    `pulumi preview` shows what a change does to it."""
    head, path = plan.head, f"{front_dir(plan)}/{FRONT_CONFIG_NAME}"
    target, partial = shlex.quote(path), shlex.quote(f"{path}.tmp")
    step = f"{name}-config"
    return StepSpec(
        name=step,
        node=head,
        create=(
            f"mkdir -p {shlex.quote(front_dir(plan))} && "
            f"printf '%s' {shlex.quote(front_config(plan))} > {partial} && "
            f"chmod 644 {partial} && mv {partial} {target}"
        ),
        receipts=(Receipt(step, head, (check("files", path),)),),
        delete=owned(plan, head, f"rm -f {target}"),
    )


# -- fabric trust ------------------------------------------------------------------------------


def fabric_trust_managed(plan: DeploymentPlan) -> bool:
    """The program makes the head's fabric key and authorizes it (`fabric.trust: managed`)."""
    return plan.config.fabric.trust != "existing" and bool(plan.workers)


def fabric_key_file(plan: DeploymentPlan) -> str:
    return f"{plan.head.state_dir}/fabric_ed25519"


def fabric_known_hosts(plan: DeploymentPlan) -> str:
    return f"{plan.head.state_dir}/fabric_known_hosts"


def fabric_flags(plan: DeploymentPlan) -> dict[str, str]:
    """What a head-side step needs to reach workers: flags for lib.sh's fabric_ssh."""
    if not fabric_trust_managed(plan):
        return {}
    return {"fabric_key": fabric_key_file(plan), "fabric_known_hosts": fabric_known_hosts(plan)}


def fabric_marker(plan: DeploymentPlan) -> str:
    """The comment that names this deployment's head key in a worker's authorized_keys."""
    return f"spark-vllm-fabric:{plan.deployment_id}:{plan.head.name}"


def head_fabric_key(plan: DeploymentPlan, name: str) -> StepSpec:
    head = plan.head
    flags = {"state_dir": head.state_dir, "comment": fabric_marker(plan)}
    key_file = fabric_key_file(plan)
    checks = (check("files", key_file, f"{key_file}.pub"),)
    return _undoable(
        plan, f"{name}-head-key", head, "fabric-key.sh", ("ensure", "remove"), flags, checks
    )


def authorize_head_key(plan: DeploymentPlan, name: str, worker: NodePlan) -> StepSpec:
    """The head's public key (stdin) authorized on `worker`, over the worker's own connection;
    it prints the worker's host keys, which the head then pins."""
    marker = fabric_marker(plan)
    return _undoable(
        plan,
        f"{name}-{worker.name}-authorize",
        worker,
        "authorize-key.sh",
        ("add", "remove"),
        {"marker": marker},
        (check("authorized", marker),),
        stdin="head-public-key",
        # ~/.ssh/authorized_keys, edited by the exact comment: a revocation must happen even
        # when the state leaf is gone.
        in_state_leaf=False,
    )


def pin_worker_key(plan: DeploymentPlan, name: str, worker: NodePlan) -> StepSpec:
    """`worker`'s host key pinned on the head under its fabric address. The configured pin wins;
    otherwise the keys the worker printed over its own authenticated connection (stdin), never a
    trust-on-first-use scan over the fabric."""
    head = plan.head
    address = known_hosts_name(worker.fabric_ip, worker.ssh.port)
    flags: dict[str, str] = {"state_dir": head.state_dir, "address": address}
    pinned = worker.ssh.host_key
    return _undoable(
        plan,
        f"{name}-{worker.name}-pin",
        head,
        "pin-host-key.sh",
        ("add", "remove"),
        flags,
        (check("known-host", fabric_known_hosts(plan), address),),
        create_flags={"key": pinned} if pinned else None,
        stdin=None if pinned else "worker-host-keys",
    )


def relay_leader(plan: DeploymentPlan) -> NodePlan | None:
    """The worker whose image and weights steps relay to every worker (relay.sh: one stream
    passed from worker to worker, so the head's link carries one copy, not one per worker):
    the first, when there are two or more and the program manages the fabric key it forwards.
    With `fabric.trust: existing` each worker's step copies on its own."""
    if len(plan.workers) < 2 or not fabric_trust_managed(plan):
        return None
    return plan.workers[0]


def relay_flags(plan: DeploymentPlan, worker: NodePlan) -> dict[str, str]:
    """`--relay` (every worker, in order) for the leader's copies; nothing for the others."""
    leader = relay_leader(plan)
    if leader is None or worker.name != leader.name:
        return {}
    return {"relay": node_lines(plan.workers)}


# -- image -------------------------------------------------------------------------------------


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
        **relay_flags(plan, worker),
    }
    return _head_to_worker(
        plan,
        f"{name}-{worker.name}-sync",
        worker,
        "image-sync.sh",
        flags,
        check("image", image_id),
        minutes,
        removable=not plan.config.image.keep_on_destroy,
    )


def _head_to_worker(
    plan: DeploymentPlan,
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


FABRIC_TRANSPORT_PREFIX = "fabric transport: "


def parse_fabric_transport(readiness: str) -> str:
    """vllm-ready.sh's `fabric transport:` line: `ib <devices>`, `socket <interfaces>`, another
    NCCL network, `unknown`, or `not checked (...)`."""
    lines = [line for line in readiness.splitlines() if line.startswith(FABRIC_TRANSPORT_PREFIX)]
    return lines[-1].removeprefix(FABRIC_TRANSPORT_PREFIX).strip() if lines else "unknown"


# -- model weights -----------------------------------------------------------------------------


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
        **relay_flags(plan, worker),
    }
    done = check("snapshot", model.cache_dir, model.id, commit)
    return _head_to_worker(
        plan, f"{name}-{worker.name}-copy", worker, "weights-sync.sh", flags, done, minutes
    )


# -- Ray and the server: the waits -------------------------------------------------------------


def ray_wait(plan: DeploymentPlan, name: str, image_id: str) -> StepSpec:
    """Every node joined Ray over its fabric IP with its GPUs, within the join timeout."""
    seconds = plan.config.timeouts.ray_join_seconds
    awaited: dict[str, str | float] = {
        "expect_ips": ",".join(n.fabric_ip for n in plan.nodes),
        "gpus": plan.total_gpus,
        "timeout_seconds": seconds,
    }
    return _wait(plan, f"{name}-joined", "ray-wait.sh", "ray-head", awaited, image_id, seconds)


def _wait(
    plan: DeploymentPlan,
    step: str,
    script: str,
    container: Literal["ray-head", "vllm"],
    awaited: dict[str, str | float],
    image_id: str,
    seconds: int,
    model: dict[str, str] | None = None,
    stdin: Stdin | None = None,
) -> StepSpec:
    """A bounded wait on the head for `container`; on a timeout, its diagnostics: every node's
    log (the server's too once it runs) and its image, weights and memory checks."""
    flags: dict[str, str | float] = {
        "container": plan.container_name(container),
        "container_scripts": CONTAINER_SCRIPTS_DIR,
        **awaited,
        "nodes": log_specs(plan, include_vllm=container == "vllm"),
        "node_checks": node_check_specs(plan),
        "image_id": image_id,
        **(model or {}),
        **fabric_flags(plan),
    }
    return StepSpec(
        name=step,
        node=plan.head,
        create=script_call(plan.head, script, **flags),
        stdin=stdin,
        timeouts=Timeouts(create=seconds // 60 + 5),
    )


def api_key_file(plan: DeploymentPlan, name: str) -> StepSpec:
    """The API key (stdin) written to the file the server's launcher reads; nothing is logged."""
    return _undoable(
        plan,
        f"{name}-api-key",
        plan.head,
        "api-key-file.sh",
        ("write", "remove"),
        {"file": plan.api_key_file},
        (check("files", plan.api_key_file),),
        stdin="api-key",
        quiet="none",
    )


def vllm_ready(plan: DeploymentPlan, name: str, image_id: str) -> StepSpec:
    """The served model answers a real completion (the API key on stdin), within the timeout."""
    cfg = plan.config
    seconds = cfg.timeouts.vllm_ready_seconds
    awaited: dict[str, str | float] = {
        "port": cfg.vllm.port,
        **({} if cfg.vllm.listen == "all" else {"probe_host": plan.probe_address}),
        "served_name": cfg.model.served_model_name,
        "timeout_seconds": seconds,
        "progress_seconds": cfg.timeouts.vllm_progress_seconds,
        "measure_completions": cfg.vllm.measure_completions,
        # With HCAs, NCCL should run over RoCE: the wait reads which transport it chose.
        "expect_transport": "ib" if plan.expects_rdma else "none",
        "executor": cfg.vllm.executor,
        # mp: where the nodes meet; the diagnostics check each node's way there.
        **({} if plan.uses_ray else {"rendezvous": plan.rendezvous}),
    }
    model = cfg.model
    snapshot = {"model": model.id, "revision": model.revision, "cache_dir": model.cache_dir}
    step, script = f"{name}-ready", "vllm-ready.sh"
    return _wait(plan, step, script, "vllm", awaited, image_id, seconds, snapshot, "api-key")
