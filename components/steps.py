"""A step spec (stacks/plan/steps.py) as a pulumi-command remote Command: the one helper every
component registers its host steps through."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import pulumi
from pulumi_command import remote

from components.facts import HostFacts
from stacks.plan.cluster import NodePlan
from stacks.plan.later import Later, resolve
from stacks.plan.steps import (
    Receipt,
    Stdin,
    StepSpec,
    Timeouts,
    create_command,
    create_consumes,
    create_deadline,
    delete_consumes,
    delete_deadline,
    resolve_create,
    with_deadline,
)

_LOGGING = {"stderr": remote.Logging.STDERR, "none": remote.Logging.NONE}


class StepHost(Protocol):
    """What a step needs of a host: its node, its connection, its facts (components/host.py)."""

    node: NodePlan
    connection: remote.ConnectionArgs
    facts: HostFacts


def host_step(
    spec: StepSpec,
    hosts: Iterable[StepHost],
    *,
    parent: pulumi.Resource,
    after: Sequence[pulumi.Input[pulumi.Resource]] = (),
    stdin: Mapping[Stdin, pulumi.Input[str]] | None = None,
    values: Mapping[Later, pulumi.Input[str]] | None = None,
    triggers: Sequence[pulumi.Input[str]] | None = None,
    aliases: Sequence[pulumi.Alias] = (),
) -> remote.Command:
    """`spec` run over its node's connection; each receipt gets its token from its node's facts.
    `values`: the later values its command lines consume (stacks/plan/later.py), resolved once
    known. `aliases`: where the step was before a release moved it (the engine then updates it
    in place instead of creating it anew and running the old one's delete afterwards)."""
    hosts = list(hosts)
    create, delete = _commands(spec, _tokens(hosts), values or {})
    return _command(
        spec,
        _by_name(hosts)[spec.node.name],
        create=create,
        delete=delete,
        parent=parent,
        after=after,
        stdin=stdin,
        triggers=triggers,
        aliases=aliases,
    )


def _commands(
    spec: StepSpec, token_of: Callable[[Receipt], str], values: Mapping[Later, pulumi.Input[str]]
) -> tuple[pulumi.Input[str], pulumi.Input[str] | None]:
    """The step's create and delete; each one that consumes later values resolves once they are
    known, and one that does not stays a plain string (known in preview)."""
    given = {later.name: value for later, value in values.items()}
    create_needs, delete_needs = create_consumes(spec), delete_consumes(spec)
    missing = [name for name in (*create_needs, *delete_needs) if name not in given]
    if missing:
        raise AssertionError(f"{spec.name}: consumes {missing}, which are not given")
    node, name = spec.node, spec.name
    drains = spec.stdin is not None  # the provider writes it for the delete too

    def bounded_create(step: StepSpec) -> str:
        return with_deadline(
            create_command(step, token_of), node, name, create_deadline(spec), drain_stdin=drains
        )

    def bounded_delete(text: str) -> str:
        return with_deadline(
            text, node, f"{name} (delete)", delete_deadline(spec), drain_stdin=drains
        )

    create: pulumi.Input[str] = bounded_create(spec)
    if create_needs:
        create = pulumi.Output.all(**{name: given[name] for name in create_needs}).apply(
            lambda known: bounded_create(resolve_create(spec, known))
        )
    delete: pulumi.Input[str] | None = None
    if spec.delete is not None:
        text = spec.delete
        delete = bounded_delete(text)
        if delete_needs:
            delete = pulumi.Output.all(**{name: given[name] for name in delete_needs}).apply(
                lambda known: bounded_delete(resolve(text, known))
            )
    return create, delete


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
            # Only when set: every other step's options stay as they were.
            delete_before_replace=spec.delete_first or None,
            additional_secret_outputs=["stdout"] if spec.secret_stdout else None,
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
