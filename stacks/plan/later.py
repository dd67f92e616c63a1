"""Values a spec needs that are known only once another resource exists (the image's ID, the
model's manifest, what the memory check chose), by name.

A spec is built once, before any resource: where such a value goes, its command lines hold the
value's placeholder (`Later.text`). The component that registers the spec gives each named value
as an output, and the command lines are resolved once those are known (components/steps.py,
components/containers.py). A spec's shape (its name, node, stdin, receipts' steps, timeouts)
never depends on a later value, and what a command consumes is read off the command itself
(`consumed`), so the plan states it once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Only characters shlex.quote leaves bare: a placeholder that is a whole word stays one word, so
# resolving it quotes the value exactly as `words` would have quoted it.
_PLACEHOLDER = re.compile(r"@@([a-z][a-z0-9.-]*)@@")
_SAFE = re.compile(r"[\w@%+=:,./-]+", re.ASCII)  # shlex.quote's bare characters


@dataclass(frozen=True)
class Later:
    """A value by name, e.g. `image.id`."""

    name: str

    def __post_init__(self) -> None:
        if not _PLACEHOLDER.fullmatch(f"@@{self.name}@@"):
            raise ValueError(f"spark-vllm: {self.name!r} cannot name a later value")

    @property
    def text(self) -> str:
        """What stands for the value in a command line until it is known."""
        return f"@@{self.name}@@"

    def of_slot(self, index: int) -> Later:
        """Server slot `index`'s own value of this name (`weights-s1.commit`, from its own
        fetch); slot 0's is this one (a stack of one server's)."""
        if index == 0:
            return self
        component, _, field = self.name.partition(".")
        return Later(f"{component}-s{index}.{field}")


def consumed(*texts: str | None) -> tuple[str, ...]:
    """The later values `texts` need, by name, each once, in order of appearance."""
    names: dict[str, None] = {}
    for text in texts:
        for match in _PLACEHOLDER.finditer(text or ""):
            names[match.group(1)] = None
    return tuple(names)


def resolve(text: str, values: Mapping[str, str]) -> str:
    """`text` (a command line, or one word of one) with every placeholder replaced by its value.

    A placeholder holds only characters `shlex.quote` leaves bare, and so must a value (`_value`):
    then a word quotes the same with either, and the command line is the one `words` would have
    made from the value itself, whatever quoting surrounds the word."""
    return _PLACEHOLDER.sub(lambda match: _value(values, match.group(1)), text)


def resolve_argv(argv: Iterable[str], values: Mapping[str, str]) -> list[str]:
    return [resolve(word, values) for word in argv]


def _value(values: Mapping[str, str], name: str) -> str:
    if name not in values:
        raise KeyError(f"spark-vllm: the later value {name!r} was not given")
    value = values[name]
    if not _SAFE.fullmatch(value):
        raise ValueError(
            f"spark-vllm: the later value {name} is {value!r}: only letters, digits and "
            "@%+=:,./-_ can go into a command line unquoted, and it must not be empty"
        )
    return value


# Every value a spec may wait for, and the resource that gives it.
IMAGE_ID = Later("image.id")  # the head's pull (docker.RemoteImage imageId)
PINNED_IMAGE = Later("image.pinned")  # its name on every node (stacks/plan/image.py)
# The KV cache's default block size of the image's vLLM, from the head's image facts.
KV_BLOCK_SIZE = Later("image.kv-block-size")
FRONT_IMAGE_ID = Later("front.image-id")  # the front's pull
# The head's fetch prints its snapshot's manifest, "commit files bytes".
WEIGHTS_COMMIT = Later("weights.commit")
WEIGHTS_FILES = Later("weights.files")
WEIGHTS_BYTES = Later("weights.bytes")
GPU_MEMORY_UTILIZATION = Later("memory.utilization")  # the memory check's, with `auto`
KV_CACHE_BYTES = Later("memory.kv-cache-bytes")  # the memory check's, with vllm.kvCache auto
