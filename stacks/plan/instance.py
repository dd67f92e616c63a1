"""One stack instance per deployment on a host.

A deployment's name (`project/stack`) is not its own: two colleagues who each run
`pulumi stack init dev` on the same hosts have two stacks of one name, which would share every
directory, label, chain and marker made after it. So each stack instance draws a random token
once, on its first `up`, and keeps it in its state (a pulumi-command local Command that never
runs again: components/instance.py). Before anything else on a host, the scripts step claims
the host for that token twice: its state leaf (the instance file beside the owner file, for the
same SSH user) and a Docker volume named after the deployment (for any user of that Docker
daemon). A host claimed by another token is refused, naming both, before the stack touches it.

A deployment made before the token existed has an owner file and no instance file, and no
volume: its next `up` claims both (what that `up` plans: the token's create and an update of
each host's scripts step, docs/upgrading.md).
"""

from __future__ import annotations

import hashlib
import re
import shlex

from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.later import Later

INSTANCE_ID = Later("deployment.instance")
# The token's command. It runs once, on the first `up`, on the machine that runs pulumi; its
# stdout is kept in the state. Its text never changes: a changed create would make
# pulumi-command run it again, and a new token would lock the stack out of its own hosts
# (the resource also ignores changes to it: components/instance.py).
INSTANCE_CREATE = "od -An -N16 -tx1 /dev/urandom | tr -d ' \\n'"
INSTANCE_LABEL = "spark-vllm.instance"
_TOKEN = re.compile(r"[0-9a-f]{32}")


def instance_token(stdout: str) -> str:
    """The token as the create printed it: 32 hex digits."""
    token = stdout.strip()
    if not _TOKEN.fullmatch(token):
        raise ValueError(
            f"spark-vllm: the stack's instance token is {token!r}, not 32 hex digits: "
            "od or tr on this machine printed something else"
        )
    return token


def claim_volume(plan: ClusterPlan) -> str:
    """The Docker volume that marks a host as one instance's (any SSH user's): named after the
    deployment, labelled with the instance that made it."""
    digest = hashlib.sha256(plan.deployment_id.encode()).hexdigest()[:12]
    return f"spark-vllm-claim-{digest}"


def _another_instance(plan: ClusterPlan, node: NodePlan, where: str, fix: str) -> str:
    """The refusal's two lines, the other instance's token in `$held` (and `$by`)."""
    said = (
        f"spark-vllm: {node.name}: scripts: {where} is held by another stack instance of "
        f"deployment {plan.deployment_id}: instance "
    )
    ours = f", this stack's is {INSTANCE_ID.text}"
    cause = (
        f"  likely cause: another stack named {plan.deployment_id} (another user's, or in "
        "another backend) deploys to this host; give this stack another name (pulumi stack "
        f"rename), or, if that stack is gone for good, {fix} and run again"
    )
    return (
        f'echo {shlex.quote(said)}"$held$by"{shlex.quote(ours)} >&2; '
        f"echo {shlex.quote(cause)} >&2; exit 1"
    )


def claim_leaf(plan: ClusterPlan, node: NodePlan) -> str:
    """Write this instance's token into `node`'s state leaf, unless another's is there. An
    owner file without an instance file is a deployment from before the token: claimed."""
    instance = shlex.quote(node.instance_file)
    refuse = _another_instance(plan, node, node.state_dir, f"remove {node.instance_file}")
    return (
        f'held=$(cat {instance} 2>/dev/null || true) by="" && '
        f'if [ -n "$held" ] && [ "$held" != {INSTANCE_ID.text} ]; then {refuse}; fi && '
        f"echo {INSTANCE_ID.text} > {instance}"
    )


def _volume_label(volume: str, label: str) -> str:
    template = shlex.quote(f'{{{{index .Labels "{label}"}}}}')
    return f"timeout 20 docker volume inspect --format {template} {volume}"


def claim_host(plan: ClusterPlan, node: NodePlan) -> str:
    """Claim the host's Docker daemon for this instance (the volume, made if none is), unless
    another instance holds it. Without a Docker that answers, nothing to claim yet: preflight
    names what is wrong with Docker."""
    volume = shlex.quote(claim_volume(plan))
    labels = {
        "spark-vllm.deployment": plan.deployment_id,
        INSTANCE_LABEL: INSTANCE_ID.text,
    }
    label_flags = " ".join(f"--label {shlex.quote(f'{k}={v}')}" for k, v in labels.items())
    # Whose leaf it is, for the other instance's refusal: user@host:leaf.
    where = f'--label "spark-vllm.leaf=$(id -un)@$(hostname):"{shlex.quote(node.state_dir)}'
    refuse = _another_instance(
        plan, node, f"Docker (volume {claim_volume(plan)})", f"docker volume rm {volume}"
    )
    unmade = shlex.quote(
        f"spark-vllm: {node.name}: scripts: Docker did not make the volume {claim_volume(plan)} "
        "that marks this host as this stack's"
    )
    return (
        "if command -v docker >/dev/null 2>&1 && timeout 20 docker version >/dev/null 2>&1; "
        f"then {{ timeout 20 docker volume inspect {volume} >/dev/null 2>&1 || "
        f"timeout 20 docker volume create {label_flags} {where} {volume} >/dev/null; }} "
        f"|| {{ echo {unmade} >&2; exit 1; }}; "
        # Unquoted command substitutions: an assignment does not split them, and the shell
        # parsers our tests read these lines with (shlex) keep their quotes apart.
        f"held=$({_volume_label(volume, INSTANCE_LABEL)} 2>/dev/null || true); "
        f'if [ "$held" != {INSTANCE_ID.text} ]; then '
        f"by=$({_volume_label(volume, 'spark-vllm.leaf')} 2>/dev/null || true); "
        f'by=" ($by)"; {refuse}; fi; fi'
    )


def release_host(plan: ClusterPlan) -> str:
    """Remove the host's claim if it is this instance's (the last delete on a host)."""
    volume = shlex.quote(claim_volume(plan))
    return (
        f"held=$({_volume_label(volume, INSTANCE_LABEL)} 2>/dev/null || true); "
        f'if [ "$held" = {INSTANCE_ID.text} ]; '
        f"then timeout 20 docker volume rm {volume} >/dev/null || true; fi"
    )
