"""Each host's own steps, as pure specs (stacks/plan/steps.py): its state leaf claimed, the
scripts installed, preflight, the firewall's wait, the front's configuration."""

from __future__ import annotations

import shlex

from stacks.plan import names
from stacks.plan.cluster import OWNER_FILE, ClusterPlan, NodePlan, keeps_slot_record
from stacks.plan.containers import filter_volume
from stacks.plan.firewall import (
    FIREWALLED_LABEL,
    READY_WAIT_SECONDS,
    chain_name,
    firewall_dir,
    guard_digest,
    guarded_ports,
)
from stacks.plan.front import (
    CONTAINER_FRONT_DIR,
    FRONT_CONFIG_NAME,
    KEYS_MAP_NAME,
    TLS_CERT_NAME,
    front_config,
    front_config_digest,
    front_files,
)
from stacks.plan.hardware import (
    GIB,
    memory_shares,
    shares_file,
    shm_need_bytes,
    shm_use_bytes,
)
from stacks.plan.image import image_history_file
from stacks.plan.instance import claim_host, claim_leaf, release_host
from stacks.plan.known_bad import known_bad_flag
from stacks.plan.server_plan import (
    cluster_listen_ports,
    own_container_names,
    per_server,
    servers_on,
)
from stacks.plan.steps import (
    BUNDLE_MARKER,
    Receipt,
    StepSpec,
    Timeouts,
    check,
    owned,
    script_call,
    words,
)

SLOTS_FILE_NAME = "slots"  # in the head's <state>/front


def bound_dirs(plan: ClusterPlan, node: NodePlan) -> tuple[str, ...]:
    own = (node.bin_dir, node.ray_dir, node.compile_cache_dir, firewall_dir(node))
    front = (front_dir(plan),) if node.is_head else ()
    return (*own, *front, plan.config.model.cache_dir)


def front_dir(plan: ClusterPlan) -> str:
    return f"{plan.head.state_dir}/front"


def claim_state_leaf(plan: ClusterPlan, node: NodePlan) -> str:
    """Make `node`'s state leaf and mark it this deployment's and this stack instance's, and
    claim the host's Docker for the instance; refuse a leaf that holds files without the mark
    (not made by spark-vllm), another deployment's mark, or another instance's claim
    (stacks/plan/instance.py)."""
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
        f"{claim_leaf(plan, node)} && echo {deployment} > {owner} && {claim_host(plan, node)}"
    )


def install_scripts(plan: ClusterPlan, node: NodePlan, scripts_digest: str) -> StepSpec:
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
    marks = words(f"{d}/.spark-vllm-mark.{names.mounts_of(node.name)}" for d in bound)
    # What the deployment made inside its leaf: gone with the scripts, the last step on the host.
    made = words(
        [node.bin_dir, f"{node.state_dir}/receipts", node.ray_dir, firewall_dir(node)]
        + [f"{node.state_dir}/image-stage"]  # what a cut image copy left (image-sync.sh)
        + [f"{node.state_dir}/image-index"]  # the head's index of a saved image (copy_image.py)
        + [image_history_file(node)]  # the images it was given (image_retain.py)
        + [f"{node.state_dir}/weights-pins"]  # the commits branches resolved to (weights-fetch)
        + [node.instance_file]  # the instance's claim of the leaf (stacks/plan/instance.py)
        + ([front_dir(plan)] if node.is_head else [])
    )
    leaf, owner = shlex.quote(node.state_dir), shlex.quote(node.owner_file)
    # The Docker volume the filter's socket lived in (its containers are gone by now).
    socket = shlex.quote(filter_volume(plan))
    volumes = f"{{ timeout 20 docker volume rm {socket} >/dev/null 2>&1 || true; }}"
    return StepSpec(
        name=names.scripts_of(node.name),
        node=node,
        create=(
            f"umask 077 && {claim_state_leaf(plan, node)} && mkdir -p {words(bound)} && "
            # The guard's markers (a boot ID and a digest) read by node_exporter's gate as
            # `nobody`: the directory can be passed through, not listed.
            f"chmod 755 {bin_dir} && chmod 711 {shlex.quote(firewall_dir(node))} && "
            f"base64 -d | tar -xzf - -C {bin_dir} && "
            f"echo {digest} > {marker}"
        ),
        receipts=(
            Receipt(names.scripts_of(node.name), node, (check("sha256sums", node.bin_dir),)),
            Receipt(names.mounts_of(node.name), node, tuple(check("mark", d) for d in bound)),
        ),
        delete=owned(
            plan,
            node,
            f'if [ "$(cat {marker} 2>/dev/null)" = {digest} ]; then '
            f"rm -rf {made} && rm -f {marks} && {release_host(plan)} && {volumes} && "
            f'if [ "$(ls -A {leaf})" = {shlex.quote(OWNER_FILE)} ]; then '
            f"rm -f {owner} && rmdir {leaf}; fi; fi",
        ),
        stdin="scripts-bundle",
        timeouts=Timeouts(create=2),
        quiet="stderr",
        prints=scripts_digest,
    )


def preflight_flags(plan: ClusterPlan, node: NodePlan) -> dict[str, str | float]:
    """preflight.sh's flags for `node`: the ports, ranges and container names it must find
    free, the memory, disk and GPUs it must find, and what SSH may not be."""
    cfg = plan.config
    servers = servers_on(plan, node)
    # What this stack listens on (its executor's ports and ranges): free, or its own.
    listened = [port for server in servers for port in cluster_listen_ports(server, node)]
    served = [str(s.server_port) for s in per_server(plan) if s.runs_server(node)]
    front = [str(cfg.vllm.port), str(cfg.front.metrics_port)] if node.is_head else []
    ports = list(dict.fromkeys([*front, *served, *listened]))
    containers = own_container_names(plan, node)
    # With several servers on a node each one's memory check runs once the ones before it
    # started (graph.py): then it sees what they took. Preflight checks only the floor.
    fraction = plan.servers[0].model.settings.gpu_memory_utilization
    guarded = guarded_ports(plan, node) if cfg.fabric.firewall else []
    return {
        "role": node.role,
        "fabric_interface": node.fabric_interface,
        "fabric_ip": node.fabric_ip,
        "head_fabric_ip": plan.head.fabric_ip,
        "ports": ",".join(ports),
        # What the firewall will drop off the management network: nothing else may hold it,
        # and SSH never (preflight.sh).
        "guarded": ",".join(guarded),
        "cluster_fabric_ips": ",".join(n.fabric_ip for n in plan.nodes),
        "shared_fabric": "yes" if cfg.fabric.shared_with_management else "no",
        "min_free_memory_bytes": int(cfg.preflight.min_free_memory_gib * GIB),
        # With `auto` the memory check derives the fraction later; preflight checks the floor.
        "memory_fraction": (
            fraction
            if cfg.preflight.unified_memory and fraction != "auto" and len(plan.servers) == 1
            else 0
        ),
        "min_free_disk_bytes": int(cfg.preflight.min_free_disk_gib * GIB),
        "disk_paths": cfg.model.cache_dir,
        "require_gpus": node.gpus if cfg.docker.request_gpus else 0,
        "require_nvidia_runtime": "yes" if cfg.preflight.require_nvidia_runtime else "no",
        "container_names": ",".join(containers),
        "deployment": plan.deployment_id,
        "rdma_hcas": ",".join(node.rdma_hcas),
        "known_bad": known_bad_flag(cfg),
        "allow_known_bad": "yes" if cfg.preflight.allow_known_bad else "no",
        "min_shm_bytes": shm_need_bytes(plan, node),
        "shm_use_bytes": shm_use_bytes(plan, node),
    }


def preflight(plan: ClusterPlan, node: NodePlan) -> StepSpec:
    """Fails early and clearly: ports, memory, disk, GPUs, the fabric interface (preflight.sh)."""
    return StepSpec(
        name=names.preflight_of(node.name),
        node=node,
        create=script_call(node, "preflight.sh", **preflight_flags(plan, node)),
        timeouts=Timeouts(create=5),
    )


def firewall(plan: ClusterPlan, node: NodePlan) -> StepSpec | None:
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
        name=names.rules_of(node.name),
        node=node,
        create=script_call(
            node,
            "firewall-step.sh",
            "wait",
            **flags,
            digest=guard_digest(plan, node),
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


def reload_front(plan: ClusterPlan) -> StepSpec:
    """After a changed configuration, the running front re-reads it without dropping requests in
    flight (front-reload.sh: HAProxy's master-worker reload). Its command names the
    configuration's digest: a new configuration is an update, which runs it again."""
    head = plan.head
    return StepSpec(
        name=names.FRONT_RELOAD,
        node=head,
        create=script_call(
            head,
            "front-reload.sh",
            container=plan.container_name("front"),
            file=f"{front_dir(plan)}/{FRONT_CONFIG_NAME}",
            config=f"{CONTAINER_FRONT_DIR}/{FRONT_CONFIG_NAME}",
            digest=front_config_digest(plan),
            # The named keys' map, written apart (a new value changes no configuration).
            **({"keys_map": keys_map_file(plan)} if plan.config.keys else {}),
            # front.tls: the certificate, written apart too (a new one changes no configuration).
            **({"tls_file": tls_file(plan)} if plan.config.front.tls.enabled else {}),
        ),
        timeouts=Timeouts(create=3),
    )


def tls_file(plan: ClusterPlan) -> str:
    """The front's certificate and key on the head, in the front's secrets (front-tls-file.sh)."""
    return f"{plan.front_secrets_dir}/{TLS_CERT_NAME}"


def keys_map_file(plan: ClusterPlan) -> str:
    """The named keys' map on the head, in the front's secrets (front-keys-file.sh)."""
    return f"{plan.front_secrets_dir}/{KEYS_MAP_NAME}"


def write_front_config(plan: ClusterPlan) -> StepSpec:
    """The front's haproxy.cfg on the head, whole on the command line: it holds no secret, so
    `pulumi preview` shows what a change does to it."""
    head, path = plan.head, f"{front_dir(plan)}/{FRONT_CONFIG_NAME}"
    # What the configuration reads (/v1/models, the keys' metrics) first: read when it loads.
    files = [(f"{front_dir(plan)}/{name}", text) for name, text in front_files(plan)]
    files.append((path, front_config(plan)))
    if keeps_slot_record(plan):
        # Each server's slot, read back as a fact on every run, so a model keeps its slot
        # while others come and go.
        files.insert(0, (slots_file(head), slots_record(plan)))
    step = names.FRONT_CONFIG
    return StepSpec(
        name=step,
        node=head,
        create=" && ".join(
            [
                f"mkdir -p {shlex.quote(front_dir(plan))}",
                *(written(f, text) for f, text in files),
            ]
        ),
        receipts=(Receipt(step, head, tuple(check("files", f) for f, _ in files)),),
        delete=owned(plan, head, "rm -f " + " ".join(shlex.quote(f) for f, _ in files)),
    )


def write_memory_shares(plan: ClusterPlan) -> StepSpec | None:
    """The fleet's memory shares on the head, read by each server's memory check (none with
    one server). A step of its own, whole on the command line: a model added, removed or
    resized updates it, and no check's command."""
    if len(plan.servers) < 2:
        return None
    head, path = plan.head, shares_file(plan)
    step = names.shares_of(head.name)
    return StepSpec(
        name=step,
        node=head,
        create=f"mkdir -p {shlex.quote(front_dir(plan))} && {written(path, memory_shares(plan))}",
        receipts=(Receipt(step, head, (check("files", path),)),),
        delete=owned(plan, head, f"rm -f {shlex.quote(path)}"),
    )


def written(path: str, text: str) -> str:
    """`text` into `path` whole (a reader never sees half of it), readable by the containers
    that read it (the front, Prometheus, Grafana)."""
    target, partial = shlex.quote(path), shlex.quote(f"{path}.tmp")
    return (
        f"printf '%s' {shlex.quote(text)} > {partial} && chmod 644 {partial} && "
        f"mv {partial} {target}"
    )


def slots_file(head: NodePlan) -> str:
    """The head's record of each server's slot (stacks/fleet.py assign_slots)."""
    return f"{head.state_dir}/front/{SLOTS_FILE_NAME}"


def slots_record(plan: ClusterPlan) -> str:
    """One `SLOT KEY` line per server (components/facts.py reads it back)."""
    return "".join(f"{s.index} {s.record_key}\n" for s in plan.servers)
