"""Durations the lab tests measured, printed at the end of the session by conftest.py.

A module of its own: pytest may import conftest.py under another name than the tests do.
"""

TIMINGS: list[tuple[str, float]] = []


def record_timing(what: str, seconds: float) -> None:
    TIMINGS.append((what, seconds))


# One row per day-two scenario: (scenario, plan counts, seconds of the run, seconds of downtime).
DAY_TWO: list[tuple[str, str, float, float]] = []


def record_day_two(scenario: str, counts: str, seconds: float, downtime: float) -> None:
    DAY_TWO.append((scenario, counts, seconds, downtime))


# Figures other than durations (bytes sent against bytes missing, ...): (what, value as text).
FIGURES: list[tuple[str, str]] = []


def record_figure(what: str, value: str) -> None:
    FIGURES.append((what, value))
