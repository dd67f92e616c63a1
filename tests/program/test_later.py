"""Later values (stacks/plan/later.py): a spec built once, before any resource, holds a
placeholder where a value known only later goes; resolving it gives the command line `words`
would have made from the value itself."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacks.plan import hardware
from stacks.plan.later import (
    IMAGE_ID,
    PINNED_IMAGE,
    Later,
    consumed,
    resolve,
)
from stacks.plan.server_plan import per_server
from stacks.plan.steps import (
    Receipt,
    StepSpec,
    create_consumes,
    delete_consumes,
    resolve_spec,
    words,
)
from tests.program.conftest import ConfigFactory
from tests.program.planning import every_step, known, plan_of

SAFE = st.text(
    alphabet=st.sampled_from("abcXYZ019@%+=:,./-_"),
    min_size=1,
    max_size=20,
)
AROUND = st.text(alphabet=st.sampled_from("ab /'\"$|;"), max_size=6)


@given(value=SAFE, before=AROUND, after=AROUND, other=st.lists(AROUND, max_size=3))
def test_a_resolved_word_quotes_as_the_value_would_have(
    value: str, before: str, after: str, other: list[str]
) -> None:
    """Wherever the placeholder sits in a word, and whatever the word's other characters make
    `shlex.quote` do, resolving gives the same command line as quoting the value itself."""
    later = Later("x.value")
    template = words(["cmd", *other, before + later.text + after])
    assert resolve(template, {"x.value": value}) == words(["cmd", *other, before + value + after])


@pytest.mark.parametrize("value", ["", "a b", "it's", "$(id)", "a\nb", "ä"])
def test_a_value_that_would_need_quoting_is_refused_with_its_name(value: str) -> None:
    with pytest.raises(ValueError, match=r"image\.id"):
        resolve(words(["x", IMAGE_ID.text]), {"image.id": value})


def test_a_value_not_given_is_named() -> None:
    with pytest.raises(KeyError, match=r"image\.pinned"):
        resolve(PINNED_IMAGE.text, {"image.id": "sha256:1"})


@pytest.mark.parametrize("name", ["", "Image", "a b", "image@id", "1x"])
def test_a_later_value_has_a_plain_name(name: str) -> None:
    with pytest.raises(ValueError):
        Later(name)


def test_consumes_names_each_value_once_in_order_and_apart_for_create_and_delete(
    make_config: ConfigFactory,
) -> None:
    head = plan_of(make_config(hosts=2)).head
    spec = StepSpec(
        name="s",
        node=head,
        create=f"a {IMAGE_ID.text} {PINNED_IMAGE.text} {IMAGE_ID.text}",
        receipts=(Receipt("s", head, (f"image|{PINNED_IMAGE.text}",)),),
        delete=f"rm {PINNED_IMAGE.text}",
    )
    assert consumed(spec.create, None) == ("image.id", "image.pinned")
    assert create_consumes(spec) == ("image.id", "image.pinned")
    assert delete_consumes(spec) == ("image.pinned",)
    known = resolve_spec(spec, {"image.id": "sha256:1", "image.pinned": "r:sha256-1"})
    assert known.create == "a sha256:1 r:sha256-1 sha256:1"
    assert known.receipts[0].checks == ("image|r:sha256-1",)
    assert known.delete == "rm r:sha256-1"


def test_every_step_resolves_to_a_command_without_placeholders(
    make_config: ConfigFactory,
) -> None:
    config = make_config(hosts=3)
    config["vllm"] = {**config["vllm"], "kvCache": "auto"}
    plan = plan_of(config)
    for spec in [*every_step(plan), known(hardware.memory_check(per_server(plan)[0]))]:
        assert "@@" not in spec.create + (spec.delete or ""), spec.name
        assert all("@@" not in c for r in spec.receipts for c in r.checks), spec.name
    memory = hardware.memory_check(per_server(plan)[0])
    assert create_consumes(memory) == ("image.pinned", "weights.commit", "image.kv-block-size")
