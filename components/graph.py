"""The walk of the deployment's graph (stacks/plan/graph.py): each entry becomes its resource,
under its component, its edges resolved by name among the resources registered before it.

One adapter per kind of spec: a host step (components/steps.py), a container
(components/containers.py), an image pull (pulumi-docker RemoteImage). A later value
(stacks/plan/later.py) is made once, from its source's output, and only when an entry consumes
it: a value nobody consumes is never derived (so never fails)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.containers import service_container
from components.steps import StepHost, host_step
from stacks.plan.cluster import ClusterPlan
from stacks.plan.containers import ContainerSpec, secret_label, with_daemon_ulimits
from stacks.plan.graph import DeploymentGraph, Planned, Source, later_sources
from stacks.plan.image import ImagePull, is_pinned, unpinned_warning
from stacks.plan.later import Later, consumed
from stacks.plan.steps import Stdin, StepSpec, create_consumes, delete_consumes


class WalkHost(StepHost, Protocol):
    """A host as the walk needs it: a step's connection and facts, and its Docker daemon."""

    provider: docker.Provider


class Walk:
    """The resources registered so far, by name, and the later values made from them."""

    def __init__(
        self,
        plan: ClusterPlan,
        graph: DeploymentGraph,
        stdin: Mapping[Stdin, pulumi.Input[str]],
        sources: Mapping[str, Source] | None = None,
    ) -> None:
        self.plan = plan
        self.graph = graph
        self.built: dict[str, pulumi.CustomResource] = {}
        self.hosts: dict[str, WalkHost] = {}
        self._stdin = stdin
        self._sources = sources if sources is not None else later_sources(plan)
        self._values: dict[str, pulumi.Output[str]] = {}
        self._warned: set[str] = set()

    def add_host(self, host: WalkHost) -> None:
        self.hosts[host.node.name] = host

    def build(self, component: str, parent: pulumi.Resource) -> None:
        """Every entry of `component`, in the graph's order (found after by name: `built`)."""
        for entry in self.graph.of(component):
            self._register(entry, parent)

    def step(self, name: str) -> remote.Command:
        command = self.built[name]
        assert isinstance(command, remote.Command), name
        return command

    def container(self, name: str) -> docker.Container:
        container = self.built[name]
        assert isinstance(container, docker.Container), name
        return container

    def pulled(self, name: str) -> docker.RemoteImage:
        pulled = self.built[name]
        assert isinstance(pulled, docker.RemoteImage), name
        return pulled

    def value(self, name: str) -> pulumi.Output[str]:
        """The later value `name`, made from its source once registered."""
        if name not in self._values:
            source = self._sources[name]
            resource = self.built[source.resource]
            output: pulumi.Output[str] = getattr(resource, source.output)
            self._values[name] = output.apply(source.derive)
        return self._values[name]

    def _values_for(self, names: Sequence[str]) -> dict[Later, pulumi.Input[str]]:
        return {Later(name): self.value(name) for name in names}

    def _register(self, entry: Planned, parent: pulumi.Resource) -> pulumi.CustomResource:
        spec = entry.spec
        if isinstance(spec, StepSpec):
            resource: pulumi.CustomResource = self._step(entry, spec, parent)
        elif isinstance(spec, ContainerSpec):
            resource = self._container(entry, spec, parent)
        else:
            resource = self._pull(entry, spec, parent)
        self.built[entry.name] = resource
        return resource

    def _after(self, entry: Planned) -> list[pulumi.Resource]:
        return [self.built[name] for name in entry.after]

    def _step(self, entry: Planned, spec: StepSpec, parent: pulumi.Resource) -> remote.Command:
        stdin: dict[Stdin, pulumi.Input[str]] = {}
        if spec.stdin is not None:
            stdin[spec.stdin] = (
                self.step(entry.stdout_stdin).stdout
                if entry.stdout_stdin is not None
                else self._stdin[spec.stdin]
            )
        return host_step(
            spec,
            self.hosts.values(),
            parent=parent,
            after=self._after(entry),
            stdin=stdin,
            values=self._values_for((*create_consumes(spec), *delete_consumes(spec))),
            triggers=self._triggers(entry),
            aliases=[
                pulumi.Alias(
                    name=moved.name,
                    parent=pulumi.create_urn(moved.parent_name, moved.parent_type),
                )
                for moved in entry.moved_from
            ],
        )

    def _triggers(self, entry: Planned) -> list[pulumi.Input[str]] | None:
        """What replaces (re-runs) a step when it changes: resources' IDs, secrets' hashes."""
        triggers: list[pulumi.Input[str]] = [self.built[name].id for name in entry.triggers]
        triggers += [
            pulumi.Output.from_input(self._stdin[secret]).apply(_hash)
            for secret in entry.secret_triggers
        ]
        return triggers or None

    def _container(
        self, entry: Planned, spec: ContainerSpec, parent: pulumi.Resource
    ) -> docker.Container:
        assert entry.image is not None, f"{entry.name}: a container names its image"
        id_labels: list[tuple[str, pulumi.Input[str]]] = [
            (label, self._ids(names)) for label, names in entry.id_labels
        ]
        host = self.hosts[entry.node]
        if entry.secret_labels and host.facts.key_labels_unread:
            # Without the running label an earlier release's would be replaced, and with it
            # the container (secret_label).
            raise pulumi.RunError(
                f"spark-vllm: {entry.node}: facts: cannot list the containers' key labels "
                f"({host.facts.key_labels_unread}), so {spec.name}'s could not be kept\n"
                f"  likely cause: Docker on {entry.node} did not answer, or the SSH user is not "
                "in the docker group; run pulumi again once `docker ps` answers there"
            )
        running = host.facts.key_labels.get(spec.name)
        deployment = self.plan.deployment_id
        id_labels += [
            (
                label,
                pulumi.Output.from_input(self._stdin[secret]).apply(
                    lambda value: secret_label(value, deployment, running)
                ),
            )
            for label, secret in entry.secret_labels
        ]
        # What the provider's read after the create will find: dockerd's defaults merged in.
        daemon_ulimits = with_daemon_ulimits(spec.ulimits, host.facts.daemon_ulimits)
        return service_container(
            entry.name,
            replace(spec, ulimits=daemon_ulimits),
            self.value(entry.image.name),
            provider=host.provider,
            parent=parent,
            after=self._after(entry),
            id_labels=id_labels,
            values=self._values_for(consumed(*spec.command)),
        )

    def _ids(self, names: Sequence[str]) -> pulumi.Input[str]:
        """The IDs of `names`: one as it is, several joined by commas, none as `none`."""
        ids = [self.built[name].id for name in names]
        if len(ids) == 1:
            return ids[0]
        return pulumi.Output.all(*ids).apply(
            lambda known: ",".join(str(i) for i in known) or "none"
        )

    def _pull(self, entry: Planned, pull: ImagePull, parent: pulumi.Resource) -> docker.RemoteImage:
        pulled = self._remote_image(entry, pull, parent)
        if pull.key not in self._warned and not is_pinned(pull.ref):
            # Once per setting (node_exporter is pulled on every node).
            self._warned.add(pull.key)
            pulled.repo_digest.apply(lambda digest: _warn_if_unpinned(pull, digest))
        return pulled

    def _remote_image(
        self, entry: Planned, pull: ImagePull, parent: pulumi.Resource
    ) -> docker.RemoteImage:
        return docker.RemoteImage(
            entry.name,
            name=pull.ref,
            platform=pull.platform,
            keep_locally=pull.keep_locally,
            opts=pulumi.ResourceOptions(
                parent=parent,
                provider=self.hosts[entry.node].provider,
                depends_on=self._after(entry),
                # Its delete removes the image (keepLocally false): a replacement created first
                # could be that very image (a tag moved to the same ID), so delete it first.
                delete_before_replace=not pull.keep_locally,
                custom_timeouts=pulumi.CustomTimeouts(create=f"{pull.timeout_minutes}m"),
            ),
        )


def _joined(ids: list[str]) -> str:
    return ",".join(str(i) for i in ids) or "none"


def _hash(value: str) -> str:
    """A secret's trigger: its hash, never the secret (marked secret in the state)."""
    return hashlib.sha256(value.encode()).hexdigest()[:16] if value else "none"


def _warn_if_unpinned(pull: ImagePull, repo_digest: str) -> None:
    """A bare tag: the exact digest to pin it to (stacks/plan/image.py)."""
    warning = unpinned_warning(pull, repo_digest)
    if warning is not None:
        pulumi.log.warn(warning)
