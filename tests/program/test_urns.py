"""A resource's identity is its URN (tests/engine/urns.py, from the engine's source): the
program's URNs are the engine's, an alias finds a step where the last release left it, and a
step moved without one is a new resource whose old self is deleted."""

from __future__ import annotations

from dataclasses import replace

from tests.engine.urns import AliasSpec, alias_urns, create_urn, generate_urn
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate

STACK_URN = "urn:pulumi:dev::proj::pulumi:pulumi:Stack::proj-dev"
COMPONENT = "urn:pulumi:dev::proj::my:index:Server::vllm"
COMMAND = "command:remote:Command"


def test_urns_skip_the_root_stack_and_carry_the_whole_parent_chain() -> None:
    """deployment.go generateURN: the SDK's mock would write `pulumi:pulumi:Stack$my:...` for
    the component and only `Server$...` for a grandchild's chain."""
    assert generate_urn("dev", "proj", STACK_URN, "my:index:Server", "vllm") == COMPONENT
    child = generate_urn("dev", "proj", COMPONENT, "my:index:Part", "vllm-part")
    assert child == "urn:pulumi:dev::proj::my:index:Server$my:index:Part::vllm-part"
    grandchild = generate_urn("dev", "proj", child, COMMAND, "vllm-step")
    assert grandchild == (
        "urn:pulumi:dev::proj::my:index:Server$my:index:Part$command:remote:Command::vllm-step"
    )
    assert generate_urn("dev", "proj", "", "pulumi:pulumi:Stack", "proj-dev") == STACK_URN


def test_an_alias_spec_names_the_old_urn_its_empty_fields_the_resources_own() -> None:
    """step_generator.go collapseAliasToUrn and alias.go CreateURN."""
    front = generate_urn("dev", "proj", STACK_URN, "my:index:Front", "front")
    old_parent = create_urn("vllm", "my:index:Server", "", "proj", "dev")
    assert old_parent == COMPONENT
    moved = AliasSpec(name="vllm-api-key", parent_urn=old_parent)
    found = alias_urns("front-api-key", COMMAND, front, [moved], "dev", "proj", {})
    assert found == [f"urn:pulumi:dev::proj::my:index:Server${COMMAND}::vllm-api-key"]
    # No parent at all, and a whole URN, taken as they are.
    top = alias_urns("x", COMMAND, front, [AliasSpec(no_parent=True)], "dev", "proj", {})
    assert top == [f"urn:pulumi:dev::proj::{COMMAND}::x"]
    assert alias_urns("x", COMMAND, front, [AliasSpec(urn="urn:a")], "dev", "proj", {}) == ["urn:a"]


def test_a_child_inherits_its_parents_matched_alias() -> None:
    """step_generator.go inheritedChildAlias: a component found under its old name takes its
    children with it, a child named from it (`{name}-part`) renamed alike."""
    new_parent = generate_urn("dev", "proj", STACK_URN, "my:index:Server", "server")
    matched = {new_parent: COMPONENT}  # found under its old URN, named "vllm"
    found = alias_urns("server-ready", COMMAND, new_parent, [], "dev", "proj", matched)
    assert found == [f"urn:pulumi:dev::proj::my:index:Server${COMMAND}::vllm-ready"]


def test_the_front_key_step_is_found_where_the_last_release_left_it(
    make_config: ConfigFactory,
) -> None:
    """The API key's step moved from the server's component to the front's with an alias
    (components/front.py): the engine finds it under its old URN, plans no create, and does
    not delete it after the program (its delete would remove the key just written)."""
    config = make_config(hosts=2)
    up = evaluate(config, SECRETS)
    now = up.urn("front-api-key")
    old = f"urn:pulumi:dev::spark-vllm::spark-vllm:index:VllmServer${COMMAND}::vllm-api-key"
    state = dict(up.state)
    state[old] = replace(state.pop(now), urn=old, name="vllm-api-key")
    preview = evaluate(config, SECRETS, preview=True, prior=replace(up, state=state))
    assert preview.steps["front-api-key"] == "same"
    assert preview.deletes == []


def test_a_step_moved_without_an_alias_is_created_anew_and_its_old_self_deleted(
    make_config: ConfigFactory,
) -> None:
    """What a release that moves a step under another component, and forgets the alias, does
    on a deployed stack: a create, and the old one's delete (its `delete` command) at the end."""
    config = make_config(hosts=2)
    up = evaluate(config, SECRETS)
    now = up.urn("memory-check")
    old = f"urn:pulumi:dev::spark-vllm::spark-vllm:index:Elsewhere${COMMAND}::memory-check"
    state = dict(up.state)
    state[old] = replace(state.pop(now), urn=old)
    preview = evaluate(config, SECRETS, preview=True, prior=replace(up, state=state))
    assert preview.steps["memory-check"] == "create"
    assert preview.deletes == ["memory-check"]
