"""The documentation holds together: every relative link of README.md, docs/ and lab/README.md
names a file that exists and, with `#anchor`, a heading of that file; README.md stays short; and
every topic it once held in full is one link away from it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "lab" / "README.md", *(REPO / "docs").glob("*.md")])
README_MAX_LINES = 250

# The second-level headings of the README when it was the manual: each topic is now a heading of
# README.md or of a page that README.md links to, anchor and all.
TOPICS = [
    "Quick start on real hosts",
    "Day two",
    "Several models",
    "Executors: vLLM's own (`mp`, the default) or Ray",
    "Reboot",
    "Outputs, and using them from another project",
    "Security",
    "Failures: what you see",
    "Serving speed, as users compare it",
    "Monitoring: what you see while it serves",
    "Performance: getting the image and the weights to the workers",
    "Try it without GPUs: the lab",
    "Tests",
]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> Iterator[str]:
    """The lines outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: its text lowercased, punctuation but `-` and `_` dropped,
    spaces as `-`. Formatting goes first: a link keeps its text, emphasis and code their content."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list[str]:
    return [m.group(2) for line in prose_lines(page.read_text()) if (m := HEADING.match(line))]


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub gives the page's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(page):
        slug = anchor(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    """The page's link targets, outside code (fenced blocks and inline spans); a link's text may
    run over a line break."""
    prose = "\n".join(prose_lines(page.read_text()))
    return LINK.findall(re.sub(r"`[^`]*`", "", prose))


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("<")


def resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, fragment = target.partition("#")
    return ((page.parent / path).resolve() if path else page), fragment


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_names_a_file_and_a_heading_of_it(page: Path) -> None:
    broken = []
    for target in filter(relative, links(page)):
        path, fragment = resolve(page, target)
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: no heading #{fragment} in {path.relative_to(REPO)}")
    assert broken == []


def test_the_readme_is_read_in_five_minutes() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) < README_MAX_LINES


@pytest.mark.parametrize("topic", TOPICS)
def test_every_topic_is_one_link_from_the_readme(topic: str) -> None:
    readme = REPO / "README.md"
    if topic in headings(readme):
        return
    linked = [resolve(readme, t) for t in filter(relative, links(readme))]
    assert any(
        path.suffix == ".md" and fragment == anchor(topic) and topic in headings(path)
        for path, fragment in linked
    ), f"README.md links to no page whose heading is {topic!r}"


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        (
            "Executors: vLLM's own (`mp`, the default) or Ray",
            "executors-vllms-own-mp-the-default-or-ray",
        ),
        ("What `pulumi up` converges", "what-pulumi-up-converges"),
        ("Real vLLM: `--vllm real`", "real-vllm---vllm-real"),
        ("See it serve: `python -m lab monitor`", "see-it-serve-python--m-lab-monitor"),
        ("The KV cache in bytes (`vllm.kvCache`)", "the-kv-cache-in-bytes-vllmkvcache"),
        (
            "What `up` writes (state dir, default `/var/lib/spark-vllm-lab`)",
            "what-up-writes-state-dir-default-varlibspark-vllm-lab",
        ),
    ],
)
def test_anchors_follow_githubs_rule(heading: str, expected: str) -> None:
    assert anchor(heading) == expected
