"""The step the engine plans for each resource a program registers on a deployed stack, and what
it deletes before and after, from pulumi/pulumi v3.259 `pkg/resource/deploy/step_generator.go`
(SG below). The model's `up` (tests/lab/engine.py) and its preview (tests/engine/preview.py)
both plan through `StepGenerator`, one per run:

- No old state: a create.
- Recreating (SG `continueStepsFromRefresh`: `_, recreating := sg.deletes[urn]`, then
  `continueStepsFromImport` "Case 1: recreating", `if recreating`): a resource this run already
  deleted as a dependent of a delete-before-replace is replaced, whatever its inputs: a
  ReplaceStep and a CreateReplacementStep, no diff, no second delete, nothing left to delete at
  the end of the run.
- Pending replacement (SG `continueStepsFromDiff`: `if diff.Changes == plugin.DiffSome ||
  old.PendingReplacement { if diff.Replace() || triggerReplace || old.PendingReplacement`, and
  `if !old.PendingReplacement { ... NewDeleteReplacementStep(... old ...) }`): a resource whose
  delete-before-replace delete ran in an earlier run (`step.go` DeleteStep.Apply sets
  `PendingReplacement` once the delete succeeded) and whose create did not is replaced; its own
  delete does not run again. One the program no longer declares leaves the state with no delete
  (SG `GenerateDeletes`: `NewRemovePendingReplaceStep`).
- Init errors (SG `continueStepsFromDiff`: "If resource was unchanged, but there were
  initialization errors, generate an empty update step to attempt to 'continue' awaiting
  initialization"): no change, but the state holds init errors: an update.
- Otherwise the diff decides (tests/engine/diff.py). A delete-before-replace replacement first
  deletes its dependents (tests/engine/cascade.py), newest first, skipping those this run
  deleted already (SG: `if sg.pendingDeletes[dependentResource] { continue }`), marks each as
  deleted (`sg.deletes[dependentResource.URN] = true`: what makes it "recreating" when the
  program registers it), then deletes itself. A create-before-delete replacement leaves the old
  resource to delete after the program (SG `GenerateDeletes`, `res.Delete`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tests.engine.cascade import OldResource, dependents_to_replace
from tests.engine.diff import deletes_first, diff

Op = Literal["create", "same", "update", "replace"]


@dataclass(frozen=True)
class Planned:
    op: Op
    changed: tuple[str, ...] = ()
    delete_now: tuple[str, ...] = ()  # URNs deleted before the create, in this order
    delete_old_at_end: bool = False  # create-before-delete: the old one goes after the program


class StepGenerator:
    """One run's step generator over the old state `state` (oldest first, as the snapshot
    orders it; the cascade walks it in that order)."""

    def __init__(self, state: Sequence[OldResource]) -> None:
        self.state = list(state)
        self.by_urn = {r.urn: r for r in self.state}
        self.deleted: set[str] = set()  # sg.deletes: deleted this run, not yet re-created
        self.recreated: set[str] = set()

    def step(
        self,
        old_urn: str | None,
        typ: str,
        inputs: Mapping[str, Any],
        replace_on_changes: Sequence[str] = (),
        delete_before_replace: bool = False,
        registered: Collection[str] = (),
    ) -> Planned:
        """The step for a registration whose old state is found under `old_urn` (None: not in
        the state). `registered`: the URNs this run has registered so far, besides this one
        (not dependents: SG `calculateDependentReplacements` skips what already has a step)."""
        old = self.by_urn.get(old_urn) if old_urn else None
        if old is None:
            return Planned("create")
        if old.urn in self.deleted:  # Case 1: recreating
            self.deleted.discard(old.urn)
            self.recreated.add(old.urn)
            return Planned("replace")
        planned = diff(typ, old.inputs, inputs, replace_on_changes, delete_before_replace)
        if old.pending_replacement:
            return self._replace(old, planned.changed, deletes_first(typ, delete_before_replace),
                                 registered)  # fmt: skip
        if planned.step == "replace":
            return self._replace(old, planned.changed, planned.delete_before_replace, registered)
        if planned.step == "same" and old.init_errors:
            return Planned("update")
        return Planned(planned.step, planned.changed)

    def _replace(
        self,
        old: OldResource,
        changed: tuple[str, ...],
        delete_first: bool,
        registered: Collection[str],
    ) -> Planned:
        if not delete_first:
            return Planned("replace", changed, delete_old_at_end=True)
        doomed = dependents_to_replace(self.state, old.urn, registered)
        now = [r.urn for r in reversed(doomed) if r.urn not in self.deleted]
        self.deleted.update(now)
        if not old.pending_replacement:
            now.append(old.urn)
        return Planned("replace", changed, tuple(now))

    def gone(self, registered: Collection[str]) -> tuple[list[str], list[str]]:
        """After the program: the old resources it no longer declares that are deleted (not
        deleted already this run), and those dropped from the state with no delete (pending
        replacements)."""
        deleted: list[str] = []
        dropped: list[str] = []
        for resource in self.state:
            urn = resource.urn
            if urn in registered or urn in self.deleted or urn in self.recreated:
                continue
            (dropped if resource.pending_replacement else deleted).append(urn)
        return deleted, dropped
