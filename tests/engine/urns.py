"""A resource's identity as the engine gives it: its URN, and the old URNs its aliases name.

The SDK's mock monitor makes URNs its own way (`sdk/python/lib/pulumi/runtime/mocks.py`
`make_urn`: the root stack's type kept in its children's, only the parent's last type segment
in a grandchild's), so a stand-in that keys state by them, or by type and name, would call
"same" what the engine sees as a new resource (a step moved under another parent, a component
type renamed) and miss the old one's delete. These follow pulumi/pulumi v3.259:

- `generate_urn`: `pkg/resource/deploy/deployment.go` `generateURN` (the parent's full
  qualified type, the root stack's skipped) and `sdk/go/common/resource/urn.go` `NewURN`;
- `alias_urns`: `pkg/resource/deploy/step_generator.go` `generateAliases`,
  `collapseAliasToUrn`, `inheritedChildAlias`, and `sdk/go/common/resource/alias.go`
  `CreateURN`. The engine looks a resource's old state up by its URN first, then by these
  (`getOldResource`), and a child inherits its parent's matched alias.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

ROOT_STACK_TYPE = "pulumi:pulumi:Stack"


def qualified_type(urn: str) -> str:
    """The type chain of a URN (`parentType$...$type`)."""
    return urn.split("::")[2]


def urn_name(urn: str) -> str:
    return urn.split("::", 3)[3]


def urn_type(urn: str) -> str:
    """The resource's own type: the chain's last member."""
    return qualified_type(urn).split("$")[-1]


def new_urn(stack: str, project: str, parent_type: str, typ: str, name: str) -> str:
    chain = f"{parent_type}${typ}" if parent_type else typ
    return f"urn:pulumi:{stack}::{project}::{chain}::{name}"


def generate_urn(stack: str, project: str, parent: str, typ: str, name: str) -> str:
    """A registered resource's URN (generateURN)."""
    parent_type = ""
    if parent and qualified_type(parent) != ROOT_STACK_TYPE:
        parent_type = qualified_type(parent)
    return new_urn(stack, project, parent_type, typ, name)


def create_urn(name: str, typ: str, parent: str, project: str, stack: str) -> str:
    """An alias's URN (CreateURN): under `parent` its whole prefix, else at the top."""
    if not parent:
        return f"urn:pulumi:{stack}::{project}::{typ}::{name}"
    return f"{parent[: parent.rindex('::')]}${typ}::{name}"


@dataclass(frozen=True)
class AliasSpec:
    """One alias as the SDK sends it (`pulumirpc.Alias`): a whole URN, or a spec whose empty
    fields default to the resource's own."""

    urn: str = ""
    name: str = ""
    type: str = ""
    stack: str = ""
    project: str = ""
    parent_urn: str = ""
    no_parent: bool = False

    @classmethod
    def from_request(cls, alias: Any) -> AliasSpec:
        """From a RegisterResourceRequest's `aliases` entry (a protobuf `Alias`)."""
        if alias.WhichOneof("alias") == "urn":
            return cls(urn=alias.urn)
        spec = alias.spec
        parent = spec.WhichOneof("parent")
        return cls(
            name=spec.name,
            type=spec.type,
            stack=spec.stack,
            project=spec.project,
            parent_urn=spec.parentUrn if parent == "parentUrn" else "",
            no_parent=parent == "noParent" and spec.noParent,
        )


def collapse_alias(
    alias: AliasSpec,
    name: str,
    typ: str,
    parent: str,
    stack: str,
    project: str,
    matched: Mapping[str, str],
) -> str:
    """collapseAliasToUrn. `matched`: resource URN -> the old URN it was found under."""
    if alias.urn:
        return alias.urn
    alias_parent = alias.parent_urn or parent
    if alias.parent_urn and alias.parent_urn in matched:
        alias_parent = matched[alias.parent_urn]
    if alias.no_parent or (alias_parent and qualified_type(alias_parent) == ROOT_STACK_TYPE):
        alias_parent = ""
    return create_urn(
        alias.name or name,
        alias.type or typ,
        alias_parent,
        alias.project or project,
        alias.stack or stack,
    )


def inherited_child_alias(
    child_type: str, child_name: str, parent_name: str, parent_alias: str, stack: str,
    project: str,
) -> str:  # fmt: skip
    """A child's old URN from its parent's (inheritedChildAlias): a name made from the
    parent's (`{parent}-part`) follows the parent's old name."""
    alias_name = child_name
    if child_name.startswith(parent_name):
        alias_name = urn_name(parent_alias) + child_name[len(parent_name) :]
    return new_urn(stack, project, qualified_type(parent_alias), child_type, alias_name)


def alias_urns(
    name: str,
    typ: str,
    parent: str,
    aliases: Iterable[AliasSpec],
    stack: str,
    project: str,
    matched: Mapping[str, str],
) -> list[str]:
    """Every old URN the resource may be found under, in the engine's order (generateAliases)."""
    found: list[str] = []

    def add(urn: str) -> None:
        if urn not in found:
            found.append(urn)

    own = list(aliases)
    for alias in own:
        add(collapse_alias(alias, name, typ, parent, stack, project, matched))
    if parent and parent in matched:
        parent_alias = matched[parent]
        add(inherited_child_alias(typ, name, urn_name(parent), parent_alias, stack, project))
        for alias in own:
            child = collapse_alias(alias, name, typ, parent, stack, project, matched)
            add(inherited_child_alias(urn_type(child), urn_name(child), urn_name(parent),
                                      parent_alias, stack, project))  # fmt: skip
    return found


class EngineUrns:
    """For a mock monitor: URNs as the engine makes them (generate_urn), not as the SDK's mock
    does, and the old URN each registration was found under (`matched`, for its children)."""

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        return generate_urn(pulumi.get_stack(), pulumi.get_project(), parent, type_, name)

    def old_urns(self, request: Any, urn: str, matched: Mapping[str, str]) -> list[str]:
        """`urn`, then every alias of `request`, in the order the engine looks them up."""
        aliases = [AliasSpec.from_request(a) for a in request.aliases]
        return [urn, *alias_urns(request.name, request.type, request.parent, aliases,
                                 pulumi.get_stack(), pulumi.get_project(), matched)]  # fmt: skip
