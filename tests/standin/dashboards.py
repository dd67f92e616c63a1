"""The shipped dashboards' queries, for the tests that run them."""

from __future__ import annotations

import json
from pathlib import Path

DASHBOARDS = Path(__file__).resolve().parents[2] / "components" / "dashboards"


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every shipped dashboard."""
    queries = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                title = f"{path.stem}: {panel['title']} ({target['refId']})"
                queries.append((title, target["expr"]))
    return queries
