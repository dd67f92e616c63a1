"""A step spec (stacks/plan/steps.py) as a pulumi-command remote Command: the one helper every
component registers its host steps through."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import pulumi
from pulumi_command import remote

from components.facts import HostFacts
from stacks.plan.nodes import NodePlan
from stacks.plan.steps import Receipt, Stdin, StepSpec, Timeouts, create_command

# Stands in for a value another resource gives only once it exists (an image ID, a manifest)
# when a spec's shape (name, node, stdin, timeouts) is read: none of those depend on it, and a
# delete that does not either stays a plain string (known in preview).
PENDING = "<pending>"

_LOGGING = {"stderr": remote.Logging.STDERR, "none": remote.Logging.NONE}


class StepHost(Protocol):
    """What a step needs of a host: its node, its connection, its facts (components/host.py)."""

    node: NodePlan
    connection: remote.ConnectionArgs
    facts: HostFacts


@dataclass(frozen=True)
class Pending:
    """A step whose command lines need `value`, known once another resource exists (the image
    ID, the model's manifest): `spec_for(value)` is the step."""

    value: pulumi.Output[str]
    spec_for: Callable[[str], StepSpec]


WorkerHost = TypeVar("WorkerHost", bound=StepHost)


def host_step(
    spec: StepSpec | Pending,
    hosts: Iterable[StepHost],
    *,
    parent: pulumi.Resource,
    after: Sequence[pulumi.Input[pulumi.Resource]] = (),
    stdin: Mapping[Stdin, pulumi.Input[str]] | None = None,
    triggers: Sequence[pulumi.Input[str]] | None = None,
    aliases: Sequence[pulumi.Alias] = (),
) -> remote.Command:
    """`spec` run over its node's connection; each receipt gets its token from its node's facts.
    `aliases`: where the step was before a release moved it (the engine then updates it in place
    instead of creating it anew and running the old one's delete afterwards)."""
    hosts = list(hosts)
    token_of = _tokens(hosts)
    if isinstance(spec, StepSpec):
        shape: StepSpec = spec
        create: pulumi.Input[str] = create_command(spec, token_of)
        delete: pulumi.Input[str] | None = spec.delete
    else:
        shape, create, delete = _pending_commands(spec, token_of)
    return _command(
        shape,
        _by_name(hosts)[shape.node.name],
        create=create,
        delete=delete,
        parent=parent,
        after=after,
        stdin=stdin,
        triggers=triggers,
        aliases=aliases,
    )


def head_to_workers(
    value: pulumi.Output[str],
    spec_for: Callable[[NodePlan, str], StepSpec],
    head: StepHost,
    workers: Iterable[WorkerHost],
    *,
    parent: pulumi.Resource,
    after: Callable[[WorkerHost], Sequence[pulumi.Resource]],
    relay_leader: NodePlan | None = None,
) -> dict[str, remote.Command]:
    """`spec_for(worker, value)` for each worker: run on the head, its receipt kept on that
    worker. What a worker gets from the head over the fabric (the image, the weights).

    With `relay_leader`, that worker's step relays to every worker (stacks/plan/fabric.py
    relay_leader): it runs once every worker is ready for it (each one's `after`), and the other
    workers' steps run after it, to find what it brought (or copy what its chain could not)."""
    workers = list(workers)

    def step(worker: WorkerHost, extra: Sequence[pulumi.Resource]) -> remote.Command:
        return host_step(
            Pending(value, functools.partial(spec_for, worker.node)),
            [head, worker],
            parent=parent,
            after=[*after(worker), *extra],
        )

    leader = next((w for w in workers if relay_leader and w.node.name == relay_leader.name), None)
    if leader is None:
        return {worker.node.name: step(worker, []) for worker in workers}
    others = [worker for worker in workers if worker is not leader]
    relayed = step(leader, [ready for worker in others for ready in after(worker)])
    return {
        worker.node.name: relayed if worker is leader else step(worker, [relayed])
        for worker in workers
    }


def _pending_commands(
    pending: Pending, token_of: Callable[[Receipt], str]
) -> tuple[StepSpec, pulumi.Output[str], pulumi.Input[str] | None]:
    """The spec's shape now; its create (and a delete that needs the value) once it is known."""
    shape = pending.spec_for(PENDING)

    def resolved(value: str) -> StepSpec:
        spec = pending.spec_for(value)
        same = replace(spec, create=shape.create, delete=shape.delete, receipts=shape.receipts)
        assert same == shape, f"{shape.name}: only its command lines may depend on the value"
        return spec

    create = pending.value.apply(lambda v: create_command(resolved(v), token_of))
    delete: pulumi.Input[str] | None = shape.delete
    if shape.delete is not None and pending.spec_for(PENDING + "'").delete != shape.delete:
        delete = pending.value.apply(lambda v: resolved(v).delete or "")
    return shape, create, delete


def _command(
    spec: StepSpec,
    runner: StepHost,
    *,
    create: pulumi.Input[str],
    delete: pulumi.Input[str] | None,
    parent: pulumi.Resource,
    after: Sequence[pulumi.Input[pulumi.Resource]],
    stdin: Mapping[Stdin, pulumi.Input[str]] | None,
    triggers: Sequence[pulumi.Input[str]] | None,
    aliases: Sequence[pulumi.Alias] = (),
) -> remote.Command:
    sources = stdin or {}
    if spec.stdin is not None and spec.stdin not in sources:
        raise AssertionError(f"{spec.name}: reads {spec.stdin} on stdin, which is not wired")
    return remote.Command(
        spec.name,
        connection=runner.connection,
        create=create,
        delete=delete,
        stdin=sources[spec.stdin] if spec.stdin is not None else None,
        add_previous_output_in_env=False,
        triggers=list(triggers) if triggers is not None else None,
        logging=_LOGGING[spec.quiet] if spec.quiet is not None else None,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(after),
            custom_timeouts=_custom_timeouts(spec.timeouts),
            aliases=list(aliases) or None,
        ),
    )


def _custom_timeouts(timeouts: Timeouts) -> pulumi.CustomTimeouts:
    def minutes(value: int | None) -> str | None:
        return f"{value}m" if value is not None else None

    return pulumi.CustomTimeouts(
        create=minutes(timeouts.create),
        update=minutes(timeouts.update),
        delete=minutes(timeouts.delete),
    )


def _by_name(hosts: Iterable[StepHost]) -> dict[str, StepHost]:
    return {host.node.name: host for host in hosts}


def _tokens(hosts: Iterable[StepHost]) -> Callable[[Receipt], str]:
    facts = {host.node.name: host.facts for host in hosts}
    return lambda receipt: facts[receipt.node.name].token(receipt.step)
