"""Which resources a delete-before-replace takes down with it, as the engine decides
(pulumi/pulumi v3.259 `pkg/resource/deploy/step_generator.go` `calculateDependentReplacements`,
`pkg/resource/graph/dependency_graph.go` `DependingOn`):

- The candidates are every resource of the old state, after the base, that depends on it
  directly or transitively, through its `dependencies`, its property dependencies or its
  provider (not its parent: `includeChildren` is false), skipping resources this run has
  registered already.
- A candidate is replaced (so deleted first) when it is a custom resource and either its
  provider is being replaced, or one of its inputs depends (property dependency) on a resource
  being replaced and the provider's diff, with each such input unknown, plans a replacement
  (tests/engine/diff.py: `replaceOnChanges` included). A `dependsOn` edge alone never does.
- The set grows as it goes: a replaced candidate's own dependents are judged against it.
- The engine deletes them newest first, then the base (`DeleteReplacement` steps), each once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pulumi.runtime.rpc import UNKNOWN

from tests.engine.diff import diff


@dataclass(frozen=True)
class OldResource:
    """A resource as the last snapshot holds it (what the walk needs)."""

    urn: str
    type: str
    inputs: Mapping[str, Any] = field(repr=False)
    dependencies: tuple[str, ...] = ()
    property_dependencies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    provider_urn: str = ""
    custom: bool = True
    replace_on_changes: tuple[str, ...] = ()
    # What an earlier, failed run left (tests/engine/steps.py): deleted by a delete-before-replace
    # whose create did not happen; created with initialization errors (the bridge's
    # `initializationError` in `pkg/tfbridge/provider.go` Create).
    pending_replacement: bool = False
    init_errors: tuple[str, ...] = ()


def dependents_to_replace(
    state: Sequence[OldResource], root: str, registered: Collection[str] = ()
) -> list[OldResource]:
    """The dependents of `root` that its delete-before-replace replaces, in dependency order
    (the engine deletes them in reverse)."""
    urns = [r.urn for r in state]
    index = urns.index(root)
    depending = {root}
    replacing = {root}
    chosen: list[OldResource] = []
    for candidate in state[index + 1 :]:
        if candidate.urn in registered or not _depends_on(candidate, depending):
            continue
        depending.add(candidate.urn)
        if _requires_replacement(candidate, replacing):
            replacing.add(candidate.urn)
            chosen.append(candidate)
    return chosen


def _depends_on(candidate: OldResource, urns: Collection[str]) -> bool:
    edges = {*candidate.dependencies, candidate.provider_urn}
    edges |= {urn for deps in candidate.property_dependencies.values() for urn in deps}
    return bool(edges & set(urns))


def _requires_replacement(candidate: OldResource, replacing: Collection[str]) -> bool:
    if not candidate.custom:
        return False  # components and external resources are never replaced this way
    if candidate.provider_urn in replacing:
        return True
    unknown = {
        key
        for key, deps in candidate.property_dependencies.items()
        if key in candidate.inputs and set(deps) & set(replacing)
    }
    if not unknown:
        return False
    inputs = {
        key: (UNKNOWN if key in unknown else value) for key, value in candidate.inputs.items()
    }
    planned = diff(candidate.type, candidate.inputs, inputs, candidate.replace_on_changes)
    return planned.step == "replace"
