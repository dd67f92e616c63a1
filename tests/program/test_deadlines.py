"""Every host step is bounded on the host itself: pulumi-command's customTimeouts bound only its
dial retries, so a hung remote command would hang `pulumi up` (and Ctrl-C would not end it).
The wrapper (stacks/plan/steps.py with_deadline) run for real with bash, and every Command of
the committed stacks wrapped with its own minutes."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from stacks.plan.steps import DEADLINE_START, DRAIN_SECONDS, deadline_wrapper
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate, step_command


def run(command: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    # As pulumi-command runs it: the login shell's `-c`, stdin streamed.
    return subprocess.run(
        ["sh", "-c", command], input=stdin, capture_output=True, text=True, timeout=60
    )


def test_a_step_past_its_deadline_is_stopped_with_one_line_naming_it() -> None:
    started = time.monotonic()
    done = run(deadline_wrapper("echo started; sleep 30; echo never", 1, "spark1: x: stopped"))
    assert time.monotonic() - started < 10
    assert done.returncode == 124
    assert done.stdout == "started\n" and done.stderr == "spark1: x: stopped\n"


def test_a_step_that_ignores_term_is_killed_after_the_grace() -> None:
    command = deadline_wrapper("trap '' TERM; sleep 60", 1, "stopped").replace("-k 30", "-k 1")
    done = run(command)
    # The login shell may add its own "Killed" line; ours comes last.
    assert done.returncode == 137 and done.stderr.endswith("stopped\n"), done


def test_within_its_deadline_a_step_keeps_its_exit_status_output_and_stdin() -> None:
    done = run(deadline_wrapper("cat; echo \"quoted 'words'\"; exit 3", 60, "stopped"), "in\n")
    assert (done.returncode, done.stdout, done.stderr) == (3, "in\nquoted 'words'\n", "")
    assert run(deadline_wrapper("true", 60, "stopped")).returncode == 0


def test_every_command_of_a_stack_is_bounded_by_its_own_minutes(
    make_config: ConfigFactory,
) -> None:
    ev = evaluate(make_config(hosts=2), SECRETS)
    commands = ev.by_type("command:remote:Command")
    assert commands
    for step in commands:
        create = step.registered["create"]
        assert create.startswith(DEADLINE_START + "timeout -k 30 "), step.name
        minutes = int(create.removeprefix(DEADLINE_START).split()[3]) // 60
        assert step_command(create) == step.inputs["create"], step.name
        assert f"{step.name}: still running after {minutes} min" in create, step.name
        # customTimeouts say the same minutes (the engine's own limit, for the dial).
        assert step.custom_timeouts["create"] == f"{minutes}m", (step.name, step.custom_timeouts)
        delete = step.registered.get("delete")
        if delete:
            assert delete.startswith(DEADLINE_START + "timeout -k 30 "), step.name
            assert f"{step.name} (delete): still running after" in delete, step.name
        # A step given stdin reads what it left of it, create and delete alike (the provider
        # writes it for both); one given none has nothing to wait for.
        given = step.registered.get("stdin") is not None
        for command in (create, delete or ""):
            assert (f"rc=$?; timeout {DRAIN_SECONDS} cat" in command) == (given and bool(command))


def test_a_step_killed_before_its_deadline_is_not_reported_as_one() -> None:
    """137 is also the OOM killer's: only once the time is up is it the deadline's KILL."""
    done = run(deadline_wrapper("kill -KILL $$", 60, "stopped"))
    assert done.returncode == 137 and "stopped" not in done.stderr


def test_a_step_that_succeeds_without_reading_its_stdin_still_takes_all_of_it() -> None:
    """The provider writes the whole stdin (the scripts' bundle is 130 KB, for the delete too)
    and, when the command exited 0 before reading it, fails the step with the write's EOF
    (x/crypto/ssh Session.Wait). Here the writer is this test, with more than a pipe holds:
    without the drain its write breaks; with it, it completes and the status stays 0."""
    payload = b"x" * (4 * 1024 * 1024)
    for drain in (True, False):
        shell = subprocess.Popen(
            ["sh", "-c", deadline_wrapper("exit 0", 60, "stopped", drain_stdin=drain)],
            stdin=subprocess.PIPE,
        )
        assert shell.stdin is not None
        try:
            shell.stdin.write(payload)
            shell.stdin.close()
            written = True
        except BrokenPipeError:
            written = False
        assert shell.wait(timeout=60) == 0
        assert written == drain


def run_bytes(
    command: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", command], capture_output=True, timeout=60, env=env)


def test_a_step_that_prints_invalid_utf8_gives_the_provider_valid_utf8_on_both_streams() -> None:
    """pulumi-command returns stdout and stderr as proto3 strings: one invalid byte fails the
    create's response after the command ran (the step is then never recorded). A Latin-1 word,
    a stray 0xff, a multi-byte character cut by a read's boundary: replaced, never dropped, the
    rest kept as it is and the exit status kept."""
    step = (
        r"printf 'caf\351 \377ok \342\202\254\n'; printf 'r\351sum\351\n' >&2; "
        # A valid character split across two writes stays whole.
        r"printf '\342\202'; sleep 0.2; printf '\254 end\n'; exit 5"
    )
    raw = run_bytes(step)
    assert b"\xff" in raw.stdout  # what the provider would be handed without the filter
    done = run_bytes(deadline_wrapper(step, 60, "stopped"))
    assert done.returncode == 5
    assert done.stdout.decode() == "caf\ufffd \ufffdok \u20ac\n\u20ac end\n"
    assert done.stderr.decode() == "r\ufffdsum\ufffd\n"


def test_without_python3_on_the_host_the_output_passes_as_it_is() -> None:
    """The facts refuse a host without python3, and say so on a step's output: that message
    must reach the user through the same wrapper."""
    bare = Path(tempfile.mkdtemp())
    for tool in ("bash", "timeout", "date", "cat", "printf", "sh"):
        (bare / tool).symlink_to(shutil.which(tool) or tool)
    done = run_bytes(
        deadline_wrapper(r"printf 'no python3 \377\n'; echo err >&2", 60, "stopped"),
        env={"PATH": str(bare)},
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"no python3 \xff\n", b"err\n")


def test_the_output_streams_while_the_step_runs() -> None:
    """The live log stays live: a line is forwarded when it is written, not when the step ends."""
    shell = subprocess.Popen(
        ["sh", "-c", deadline_wrapper("echo first; sleep 3; echo second", 60, "stopped")],
        stdout=subprocess.PIPE,
    )
    assert shell.stdout is not None
    started = time.monotonic()
    assert shell.stdout.readline() == b"first\n"
    assert time.monotonic() - started < 2
    assert shell.wait(timeout=30) == 0


def test_a_bare_wait_in_a_step_waits_for_its_own_jobs_only() -> None:
    """The filters are the wrapper's process substitutions: a `wait` with no argument in the
    same shell would wait for them too, and they end only when that shell's output closes. The
    step runs in a bash of its own, whose `wait` knows only its jobs."""
    started = time.monotonic()
    done = run(deadline_wrapper("sleep 0.2 & wait; echo waited", 30, "stopped"))
    assert (done.returncode, done.stdout) == (0, "waited\n"), done
    assert time.monotonic() - started < 10
