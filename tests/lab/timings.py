"""Durations the lab tests measured, printed at the end of the session by conftest.py.

A module of its own: pytest may import conftest.py under another name than the tests do.
"""

TIMINGS: list[tuple[str, float]] = []


def record_timing(what: str, seconds: float) -> None:
    TIMINGS.append((what, seconds))
