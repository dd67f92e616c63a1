"""The next `pulumi up` on a deployed stack, planned and carried out the way the engine does.

`RealMocks` performs a first `up` (every resource a create). `NextUp` starts from the state a
previous run left (its journal: per resource the type, inputs, outputs, ID, URN, dependencies
and options) and, as the program registers each resource, plans one step for it with the
providers' own rules (tests/engine/diff.py, each rule cited there):

- same: nothing runs; the old ID and outputs are returned.
- update: a Command runs `update`, or `create` again, with the new inputs over the new
  connection (pulumi-command `commandController.go` `Update`); a Container gets `docker update`
  of its restart policy and, when `mustRun` went from false to true, `docker start`
  (terraform-provider-docker v4.5.0 `resourceDockerContainerUpdate`); anything else only
  changes the state.
- replace, delete-before-replace (containers, and resources that ask for it): the dependents
  that will be replaced with it are deleted first, newest first, then the old resource, then
  the new one is created (pulumi/pulumi `tests/integration/steps`: DeleteReplacement of the
  dependents, DeleteReplacement of the base, CreateReplacement of the base, then the
  dependents). Each dependent is created again when the program registers it, whatever its
  diff, and never deleted twice (tests/engine/steps.py, which plans every step).
- After a failed run, what a delete-before-replace deleted and did not create again stays in
  the state as pending replacement: the next run replaces it without deleting it again, and
  its refresh does not read it (pulumi/pulumi step.go `RefreshStep.Apply`). A container created
  but not started keeps its ID and its initialization error; the next `up` plans an update
  (a no-op for Docker), `up --refresh` reads it stopped, and the update starts it.
- replace, create-before-delete (the default): the new resource is created now; the old one is
  deleted after the program's last step (DeleteReplaced comes last: `steps/step3`).
- create: as RealMocks.
Resources in the state that the program no longer declares are deleted at the end too; these
deletes run in reverse of the order the resources were created (reverse dependency order).

`refresh=True` is `pulumi up --refresh`: before the program runs, each container and image is
read as pulumi-docker 5 reads it (`resourceDockerContainerRead`: a container that is gone leaves
the state, one that is not running gets `mustRun` false, so the diff plans an update that starts
it; `network_mode`, and `pid_mode` when set, are stored as Docker reports them, which for
`container:<name>` is `container:<ID>`; so is every attribute whose read-back value can differ
from the program's, tests/engine/container_read.py; `resourceDockerImageRead`: an image that is
gone leaves the state, one that is there is read again by name, its image ID and repo digest
rewritten to what the name resolves to now). Commands have no Read.

Each run keeps its plan (`plan`, `preview_lines()`) and counts (`counts()`), as `pulumi preview`
and the summary of `pulumi up` show them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import pulumi

from tests.engine.cascade import OldResource
from tests.engine.images import repo_digest
from tests.engine.steps import StepGenerator
from tests.engine.urns import alias_urns
from tests.lab.realmocks import (
    TYPE_COMMAND,
    TYPE_CONTAINER,
    TYPE_DOCKER_PROVIDER,
    TYPE_REMOTE_IMAGE,
    DockerHost,
    JournalEntry,
    RealMocks,
    RegistrationOptions,
    connection_from_inputs,
    delete_order,
    docker_host_from_provider_inputs,
    inspect_image,
    read_container_back,
    refuse_previous_output_in_env,
    teardown_entry,
    unwrap_secrets,
    update_container,
)

log = logging.getLogger(__name__)

SYMBOLS = {"create": "+", "update": "~", "replace": "+-", "delete": "-", "same": " "}


@dataclass(frozen=True)
class PlannedStep:
    op: str  # create, same, update, replace, delete
    type: str
    name: str
    changed: tuple[str, ...] = ()


class NextUp(RealMocks):
    """The next `pulumi up` (`refresh=True`: `pulumi up --refresh`) on `previous`'s state."""

    def __init__(self, previous: RealMocks, refresh: bool = False, **options: Any) -> None:
        super().__init__(**options)
        state = previous.state_entries()
        # What a failed run left marked for deletion shares its URN with what replaced it: not
        # the resource's state, deleted at this run's end (step_generator.go GenerateDeletes).
        self._state_order = [e for e in state if not e.pending_delete]
        # Keyed by URN, as the engine keys its state (tests/engine/urns.py).
        self.prior: dict[str, JournalEntry] = {identity(e): e for e in self._state_order}
        self._found: dict[str, str] = {}  # URN -> the old URN an alias found it under
        self._docker_hosts.update(previous._docker_hosts)
        self.plan: list[PlannedStep] = []
        self.commands_run = 0
        self._deleted_early: set[str] = set()
        self._delete_at_end: list[JournalEntry] = [e for e in state if e.pending_delete]
        self._finished = False
        if refresh:
            self._refresh()
        # The engine's step generator over the state as the refresh left it.
        self.steps = StepGenerator(
            [old_resource(self.prior[identity(e)]) for e in self._state_order
             if identity(e) in self.prior]
        )  # fmt: skip

    # -- the refresh -----------------------------------------------------------------------

    def _refresh(self) -> None:
        for key, entry in list(self.prior.items()):
            # step.go RefreshStep.Apply: "Component, provider, and pending-replace resources
            # never change with a refresh".
            if entry.docker_host is None or entry.pending_replacement:
                continue
            if entry.type == TYPE_CONTAINER:
                inputs = read_container_back(entry.docker_host, entry.resource_id, entry.inputs)
                if inputs is None:
                    del self.prior[key]
                    continue
                # A read that succeeds clears the state's init errors (step.go RefreshStep.Apply
                # keeps only those the read itself returns; the bridge's Read returns none).
                self.prior[key] = replace(entry, inputs=inputs, init_errors=())
            elif entry.type == TYPE_REMOTE_IMAGE:
                name = str(entry.outputs["name"])
                image = inspect_image(entry.docker_host, name)
                if image is None:
                    del self.prior[key]
                    continue
                # resourceDockerImageRead looks the image up by its name and writes back what
                # the name resolves to now (v4.5.0 resource_docker_image_funcs.go 103-131): a
                # tag pulled again on the head moves every dependent at this refresh.
                read = {
                    "imageId": image["Id"],
                    "repoDigest": repo_digest(name, list(image.get("RepoDigests") or [])),
                }
                self.prior[key] = replace(
                    entry,
                    outputs={**entry.outputs, **read},
                    resource_id=f"{image['Id']}{name}",  # the provider's ID: image ID + name
                )

    # -- planning each registration --------------------------------------------------------

    def perform(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        options = self.registrations.get((args.typ, args.name))
        key, prior = self._old_state(args, options)
        if not args.custom or prior is None:
            if args.custom:
                self._planned("create", args)
                if args.typ == TYPE_COMMAND:
                    self._count_command()
            return super().perform(args)
        with self._lock:
            # A snapshot: the monitor's threads add registrations meanwhile (list() of a
            # dict's values is one step under the GIL; iterating the view is not).
            registered = {o.urn for o in list(self.registrations.values())} - {key}
            planned = self.steps.step(
                key,
                args.typ,
                args.inputs,
                options.replace_on_changes if options else (),
                options.delete_before_replace if options else False,
                registered,
            )
        self._planned(planned.op, args, planned.changed)
        if planned.op == "same":
            self._record(prior)
            return prior.resource_id, prior.outputs
        if planned.op == "update":
            return self._update(prior, args)
        for urn in planned.delete_now:  # the dependents, newest first, then the resource
            self._delete(self._state_entry(urn))
        if args.typ == TYPE_COMMAND:
            self._count_command()
        created = super().perform(args)
        if planned.delete_old_at_end:
            # Create-before-delete: the old half is marked for deletion once the new one
            # exists; while its create fails, the old one stays the resource's state.
            with self._lock:
                self._delete_at_end.append(prior)
        return created

    def _state_entry(self, urn: str) -> JournalEntry:
        """The old state's entry of `urn`, as the refresh left it."""
        entry = next(e for e in self._state_order if identity(e) == urn)
        return self.prior.get(urn, entry)

    def _old_state(
        self, args: pulumi.runtime.MockResourceArgs, options: RegistrationOptions | None
    ) -> tuple[str, JournalEntry | None]:
        """The resource's old state, looked up as the engine's getOldResource does: by its URN,
        then by each of its aliases (pulumi/pulumi step_generator.go; tests/engine/urns.py)."""
        if options is None:
            return f"{args.typ}::{args.name}", None
        candidates = [options.urn, *alias_urns(
            args.name, args.typ, options.parent, options.aliases, options.stack,
            options.project, self._found,
        )]  # fmt: skip
        for urn in candidates:
            if urn in self.prior:
                if urn != options.urn:
                    with self._lock:
                        self._found[options.urn] = urn
                return urn, self.prior[urn]
        return options.urn, None

    def _planned(self, op: str, args: pulumi.runtime.MockResourceArgs, changed: Any = ()) -> None:
        with self._lock:
            self.plan.append(PlannedStep(op, args.typ, args.name, tuple(changed)))

    def _update(
        self, prior: JournalEntry, args: pulumi.runtime.MockResourceArgs
    ) -> tuple[str, dict]:
        what = f"{args.typ} {args.name!r}"
        outputs = {**prior.outputs, **args.inputs}
        if args.typ == TYPE_COMMAND:
            refuse_previous_output_in_env(args.inputs, what)  # an update runs with it too
            command = unwrap_secrets(args.inputs.get("update") or args.inputs.get("create"))
            if command:
                self._count_command()
                connection = connection_from_inputs(args.inputs.get("connection"), what)
                result = self._run_command(
                    connection,
                    str(command),
                    unwrap_secrets(args.inputs.get("stdin")),
                    what,
                    unwrap_secrets(args.inputs.get("logging")),
                )
                outputs.update(
                    stdout=result.stdout.removesuffix("\n"),
                    stderr=result.stderr.removesuffix("\n"),
                )
        elif args.typ == TYPE_CONTAINER and prior.docker_host is not None:
            self._update_container(prior, unwrap_secrets(dict(args.inputs)), prior.docker_host)
        elif args.typ == TYPE_DOCKER_PROVIDER:
            self._update_provider(
                prior.resource_id, docker_host_from_provider_inputs(args.inputs, what)
            )
        # A successful update clears the init errors (step.go UpdateStep.Apply keeps only those
        # the provider's Update returns).
        self._record(replace(prior, inputs=dict(args.inputs), outputs=outputs, init_errors=()))
        return prior.resource_id, outputs

    def _update_provider(self, provider_id: str, docker_host: DockerHost) -> None:
        """Every resource of this provider is read, updated and deleted through its new settings
        from now on (the state keeps one provider configuration, the latest)."""
        with self._lock:
            old = self._docker_hosts.get(provider_id)
            self._docker_hosts[provider_id] = docker_host
            for entry in [*self._state_order, *self.prior.values(), *self.journal]:
                if old is not None and entry.docker_host == old:
                    entry.docker_host = docker_host

    def _update_container(
        self, prior: JournalEntry, inputs: dict[str, Any], docker_host: DockerHost
    ) -> None:
        update_container(docker_host, prior.resource_id, unwrap_secrets(prior.inputs), inputs)

    # -- deletes ---------------------------------------------------------------------------

    def _delete(self, entry: JournalEntry) -> None:
        key = identity(entry)
        if key in self._deleted_early:
            return
        teardown_entry(entry, self.command_timeout_s)
        with self._lock:
            self._deleted_early.add(key)
        self._count_delete(entry)

    def _count_delete(self, entry: JournalEntry) -> None:
        if entry.type == TYPE_COMMAND and entry.inputs.get("delete"):
            self._count_command()

    def _count_command(self) -> None:
        with self._lock:
            self.commands_run += 1

    def finish(self) -> None:
        """After the program's last step: the old halves of create-before-delete replacements
        and the resources gone from the program, in reverse of their creation order."""
        registered = {identity(e) for e in self.journal} | set(self._found.values())
        deleted, _dropped = self.steps.gone(registered)  # pending replacements: no delete
        gone = [e for e in self._state_order if identity(e) in deleted]
        for entry in gone:
            self.plan.append(PlannedStep("delete", entry.type, entry.name))
        order = {id(e): i for i, e in enumerate(self._state_order)}
        doomed = sorted([*self._delete_at_end, *gone], key=lambda e: order.get(id(e), -1))
        for entry in delete_order(doomed):
            teardown_entry(entry, self.command_timeout_s)
            self._count_delete(entry)
        self._finished = True

    def state_entries(self) -> list[JournalEntry]:
        """After a failed run the state still holds what this run did not reach, and the old
        halves of replacements whose delete had not run yet (the engine keeps them as
        pending deletes)."""
        with self._lock:
            journal = list(self.journal)
            if self._finished:
                return journal
            reached = {identity(e) for e in journal} | set(self._found.values())
            untouched = [e for e in self._state_order if identity(e) not in reached]
            # Deleted by a delete-before-replace and not created again: kept, pending
            # replacement (step.go DeleteStep.Apply sets PendingReplacement once the delete
            # succeeded; the snapshot keeps the resource until its CreateReplacement).
            kept = [
                replace(self.prior.get(identity(e), e), pending_replacement=True)
                if identity(e) in self._deleted_early
                else e
                for e in untouched
            ]
            for entry in self._delete_at_end:
                entry.pending_delete = True
            return [*kept, *self._delete_at_end, *journal]

    def forget(self, entries: list[JournalEntry]) -> None:
        done = {id(e) for e in entries}
        with self._lock:
            self._state_order = [e for e in self._state_order if id(e) not in done]
            self._delete_at_end = [e for e in self._delete_at_end if id(e) not in done]
            self._finished = True

    # -- what the run shows ----------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        tally = {op: 0 for op in SYMBOLS}
        for step in self.plan:
            tally[step.op] += 1
        return tally

    def summary(self) -> str:
        """What changed, as counts ("2 update, 1 replace"), or "no change"."""
        counts = [f"{n} {op}" for op, n in self.counts().items() if n and op != "same"]
        return ", ".join(counts) or "no change"

    def changed(self) -> dict[str, str]:
        """name -> step, for every resource whose step is not "same"."""
        return {s.name: s.op for s in self.plan if s.op != "same"}

    def preview_lines(self) -> list[str]:
        """One line per resource, as `pulumi preview` prints them (no line for "same")."""
        return [
            f"{SYMBOLS[s.op]:>2} {s.op:<8} {s.type.split(':')[-1]:<12} {s.name}"
            + (f"  [{', '.join(s.changed)}]" if s.changed else "")
            for s in self.plan
            if s.op != "same"
        ]


def log_plan(title: str, run: NextUp) -> None:
    """The run's plan in the test log, as `pulumi preview` would list it."""
    counts = ", ".join(f"{n} {op}" for op, n in run.counts().items() if n)
    text = "\n".join(
        [f"{title}: {counts}; {run.commands_run} command(s) run", *run.preview_lines()]
    )
    log.info(text)
    print(text)


def identity(entry: JournalEntry) -> str:
    """A state entry's identity: its URN as the engine made it (type and name for an entry
    recorded without a registration)."""
    return entry.options.urn if entry.options else f"{entry.type}::{entry.name}"


def old_resource(entry: JournalEntry) -> OldResource:
    """A state entry as the engine's cascade walk reads it."""
    options = entry.options
    return OldResource(
        urn=identity(entry),
        type=entry.type,
        inputs=entry.inputs,
        dependencies=options.dependencies if options else (),
        property_dependencies=dict(options.property_dependencies) if options else {},
        provider_urn=options.provider_urn if options else "",
        replace_on_changes=options.replace_on_changes if options else (),
        pending_replacement=entry.pending_replacement,
        init_errors=entry.init_errors,
    )
