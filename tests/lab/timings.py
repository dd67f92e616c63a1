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


def export() -> dict[str, list[list[object]]]:
    """Everything recorded in this process, as JSON-able lists (an xdist worker's hand-over)."""
    return {
        "timings": [list(row) for row in TIMINGS],
        "day_two": [list(row) for row in DAY_TWO],
        "figures": [list(row) for row in FIGURES],
    }


def merge(exported: dict[str, list[list[object]]]) -> None:
    """Add what another process recorded (export()) to this one's lists."""
    TIMINGS.extend((str(what), float(str(seconds))) for what, seconds in exported["timings"])
    DAY_TWO.extend(
        (str(s), str(c), float(str(t)), float(str(d))) for s, c, t, d in exported["day_two"]
    )
    FIGURES.extend((str(what), str(value)) for what, value in exported["figures"])
