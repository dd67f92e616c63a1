"""Running commands with bounded time, and waiting with a deadline."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"


class LabError(RuntimeError):
    """A lab step failed; the message names the host and the step."""


def run(
    argv: Sequence[str],
    *,
    timeout: float = 60,
    check: bool = True,
    input: bytes | None = None,
    what: str = "",
) -> subprocess.CompletedProcess[bytes]:
    """Run argv, capture output, never hang past timeout; on failure say what was attempted."""
    label = what or " ".join(argv)
    try:
        result = subprocess.run(
            list(argv), input=input, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{label}: timed out after {timeout:.0f}s") from exc
    if check and result.returncode != 0:
        raise LabError(
            f"{label}: exit {result.returncode}\n"
            f"stdout: {result.stdout.decode(errors='replace')[-2000:]}\n"
            f"stderr: {result.stderr.decode(errors='replace')[-2000:]}"
        )
    return result


def ok(argv: Sequence[str], *, timeout: float = 30) -> bool:
    """True when argv exits 0 in time (used for probes and idempotent deletes)."""
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll predicate until true; raise LabError naming the step (and detail, e.g. a log tail)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            extra = f"\n{detail()}" if detail else ""
            raise LabError(f"{what}: not done after {timeout:.0f}s{extra}")
        time.sleep(interval)


def tail(path: Path, lines: int = 20) -> str:
    """Last lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path}: unreadable)"
    return f"--- last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])


def ensure_ed25519_key(path: Path, comment: str, what: str) -> None:
    """An ed25519 key pair at path (and path.pub), made once and kept."""
    if not path.exists():
        run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            timeout=20,
            what=what,
        )
