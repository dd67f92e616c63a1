"""What `pulumi preview` plans after an `up`, for tests: each step that is not "same", and
what it deletes."""

from __future__ import annotations

from typing import Any

from tests.program.conftest import SECRETS
from tests.program.harness import Evaluation, evaluate


def plan(before: dict[str, Any], after: dict[str, Any], **secrets: str) -> dict[str, str]:
    """The resources whose step is not "same", with their step."""
    up = evaluate(before, SECRETS)
    preview = evaluate(after, {**SECRETS, **secrets}, preview=True, prior=up)
    return changes(preview)


def changes(preview: Evaluation) -> dict[str, str]:
    return {name: step for name, step in preview.steps.items() if step != "same"}


def up_then_preview(before: dict, after: dict) -> tuple[dict[str, str], list[str]]:
    up = evaluate(before, SECRETS)
    preview = evaluate(after, SECRETS, preview=True, prior=up)
    return changes(preview), [urn.rsplit("::", 1)[-1] for urn in preview.deletes]
