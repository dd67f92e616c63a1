"""Every command the program runs on a host, as a pure spec: where it runs, its command line, what
it leaves behind (its receipts), how it is undone, what it reads on stdin, and how long it may take.

The components turn these into pulumi-command resources through one helper
(components/steps.py) and add only the graph's edges: what a step runs after, and which
resource's output it reads on stdin. Nothing here performs I/O: the facts a command depends on
(the image ID, the model's manifest, the scripts bundle's digest, each receipt's token) come in
as arguments, so each spec is tested as a function, facts in and commands out
(tests/program/test_steps.py), the way pyinfra tests its operations.

One quoting rule: every word of every command line is `shlex.quote`d (`words`), and the scripts
quote what they send onward with lib.sh's `words`. A state or cache directory holding a space or
a quote stays one word.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.later import consumed, resolve

# Which bundle `<stateDir>/bin` holds (its digest): the scripts' delete checks it.
BUNDLE_MARKER = ".bundle-digest"

# What a step reads on stdin; the component wires the resource (or secret) that provides it.
Stdin = Literal[
    "scripts-bundle",
    "hf-token",
    "api-key",
    "user-keys",
    "head-public-key",
    "worker-host-keys",
    "front-tls",
]


@dataclass(frozen=True)
class Timeouts:
    """Minutes a step may run: its deadline on the host (`with_deadline`: timeout(1) stops the
    command there), and the engine's customTimeouts, which in pulumi-command bound only the
    dial retries (a running remote command is never stopped by the provider, nor by Ctrl-C)."""

    create: int
    update: int | None = None
    delete: int | None = None


# Steps that only edit a file or two on a host: anything slower is a hung connection.
QUICK = Timeouts(create=3, update=3, delete=3)


def words(command: Iterable[str]) -> str:
    """One command line for a POSIX shell, every word quoted: the one quoting rule."""
    return " ".join(shlex.quote(word) for word in command)


def script_call(node: NodePlan, script: str, *positional: str, **flags: str | float) -> str:
    """`bash <bin>/<script> [positional] --host <node> --flag value ...` (`python3` for a
    `.py` script).

    Command lines stay short (the script lives on the host), so a failure shows a readable one,
    and no secret is ever among the words: secrets travel on stdin.
    """
    interpreter = "python3" if script.endswith(".py") else "bash"
    command = [interpreter, f"{node.bin_dir}/{script}", *positional, "--host", node.name]
    for key, value in flags.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    return words(command)


def check(kind: str, *args: str | int) -> str:
    """One receipt check (see receipt.sh), fields joined by `|`."""
    fields = [kind, *(str(a) for a in args)]
    bad = [f for f in fields if "|" in f or ";" in f or "\n" in f]
    if bad:
        raise ValueError(f"spark-vllm: cannot record a check on {bad[0]!r}: '|' or ';'")
    return "|".join(fields)


@dataclass(frozen=True)
class Receipt:
    """What a step leaves on `node`, as receipt.sh records it once the step succeeded: its token
    (from that node's facts) and the checks that must keep holding (components/facts.py)."""

    step: str
    node: NodePlan
    checks: tuple[str, ...]


@dataclass(frozen=True)
class StepSpec:
    name: str  # the resource's name, and its receipt's step
    node: NodePlan  # whose connection runs it
    create: str  # the command line, without its receipts
    receipts: tuple[Receipt, ...] = ()
    delete: str | None = None
    stdin: Stdin | None = None
    timeouts: Timeouts = QUICK
    quiet: Literal["stderr", "none"] | None = None  # what the engine may show; None: both
    secret_stdout: bool = False  # its stdout is a Pulumi secret (encrypted in the state)
    prints: str | None = None  # echoed after the receipts: the step's output
    fabric: tuple[tuple[str, str], ...] = ()  # how the head reaches workers (receipts there)
    # A replacement runs the old delete before the new create. For a step whose delete removes
    # what its create writes at a fixed path: the engine's default (create the new one, delete
    # the old one at the end of the run) would leave the path empty.
    delete_first: bool = False


TokenOf = Callable[[Receipt], str]


def create_command(spec: StepSpec, token_of: TokenOf) -> str:
    """The step's `create`: its command, then each receipt with the token the facts give it."""
    receipts = [_receipt_call(spec, receipt, token_of(receipt)) for receipt in spec.receipts]
    echo = [f"echo {shlex.quote(spec.prints)}"] if spec.prints is not None else []
    return " && ".join([spec.create, *receipts, *echo])


# After the deadline's TERM, what a step gets to clean up before KILL.
DEADLINE_GRACE_SECONDS = 30
# How a bounded command starts: its start time, for telling the grace's KILL from an OOM kill.
DEADLINE_START = "t0=$(date +%s); "
# What a step left unread of its stdin is read for at most this long after it (deadline_wrapper).
DRAIN_SECONDS = 60
# Every step's stdout and stderr made valid UTF-8 as they stream (invalid bytes become U+FFFD):
# pulumi-command returns them as proto3 strings, and one invalid byte (a tool's Latin-1 message,
# a binary file's line) fails the create's response with "grpc: error while marshaling: string
# field contains invalid UTF-8" after the command ran, so the step is not recorded. The hosts'
# own python3 (facts refuse a host without it); without it, or if it fails, the bytes pass as
# they are. Read in chunks, written at once: the live log stays live.
UTF8_FILTER = (
    "import sys,codecs\n"
    "r,w=sys.stdin.buffer.raw,sys.stdout.buffer\n"
    'd=codecs.getincrementaldecoder("utf-8")("replace")\n'
    "while b:=r.read(65536):\n"
    " w.write(d.decode(b).encode());w.flush()\n"
    'w.write(d.decode(b"",True).encode())'
)
# The step's command then runs in a bash of its own (`exec bash -c "$1"`): a bare `wait` in it
# would otherwise wait for the filters, which end only when the shell that waits closes its
# output, and the step would hang until its deadline.
UTF8_OUTPUT = (
    f"u(){{ python3 -c '{UTF8_FILTER}' 2>/dev/null || cat; }}; exec > >(u) 2> >(u >&2); "
    'exec bash -c "$1"'
)
STEP_ARGV0 = "spark-vllm-step"  # $0 of the wrapper's bash: the name its own errors carry


def with_deadline(
    command: str, node: NodePlan, step: str, minutes: int, *, drain_stdin: bool = False
) -> str:
    """`command` stopped on the host once it has run `minutes` (timeout(1): TERM to its whole
    process group, KILL after a grace), with one line naming the host, the step and the
    deadline; its exit status is kept. A step the provider would wait on for ever (a hung
    download, a wedged daemon, a peer that stopped answering) thus ends as a failure.
    `drain_stdin`: the step is given stdin (create and delete alike, pulumi-command's `run`)."""
    said = (
        f"spark-vllm: {node.name}: {step}: still running after {minutes} min, its deadline on "
        "the host: stopped. Likely cause: a hung download, copy or wait (its last lines above "
        "say which); the next `pulumi up` runs it again"
    )
    return deadline_wrapper(command, minutes * 60, said, drain_stdin=drain_stdin)


def deadline_wrapper(command: str, seconds: int, said: str, *, drain_stdin: bool = False) -> str:
    """`command` under timeout(1) for `seconds`, `said` on stderr when that stopped it (124 after
    TERM; 137 after the grace's KILL, once the time is up), its exit status kept, its output
    made valid UTF-8 (UTF8_OUTPUT).

    `drain_stdin`: what the command left unread of its stdin is read after it, bounded: the
    provider writes all of it, and a command that ends with success before reading it all (a
    delete, a step with nothing to do) would otherwise fail with EOF (x/crypto/ssh
    `Session.Wait` returns the stdin copy's error when the exit status is 0)."""
    drain = f"timeout {DRAIN_SECONDS} cat >/dev/null 2>&1; " if drain_stdin else ""
    # POSIX sh around it (the SSH user's login shell runs it, dash or bash): no $SECONDS.
    return (
        f"{DEADLINE_START}timeout -k {DEADLINE_GRACE_SECONDS} {seconds} "
        f"bash -c {shlex.quote(UTF8_OUTPUT)} {STEP_ARGV0} {shlex.quote(command)}; rc=$?; {drain}"
        f'if [ "$rc" = 124 ] || {{ [ "$rc" = 137 ] && [ "$(($(date +%s) - t0))" -ge {seconds} ]; '
        f'}}; then echo {shlex.quote(said)} >&2; fi; exit "$rc"'
    )


def create_deadline(spec: StepSpec) -> int:
    """The minutes a create (or an update, which runs the create again) may take."""
    return max(spec.timeouts.create, spec.timeouts.update or 0)


def delete_deadline(spec: StepSpec) -> int:
    return spec.timeouts.delete or spec.timeouts.create


def _receipt_call(spec: StepSpec, receipt: Receipt, token: str) -> str:
    """receipt.sh run where the step ran; for a worker's receipt, written there over the fabric
    (the step ran on the head for it)."""
    target = receipt.node
    flags: dict[str, str] = {
        "state_dir": target.state_dir,
        "step": receipt.step,
        "token": token,
        "checks": ";".join(receipt.checks),
    }
    if target != spec.node:
        flags |= {
            "worker": target.name,
            "target": target.fabric_destination,
            "worker_bin": target.bin_dir,
            **dict(spec.fabric),
        }
    return script_call(spec.node, "receipt.sh", **flags)


def owned(plan: ClusterPlan, node: NodePlan, command: str) -> str:
    """`command` (a delete inside `node`'s state leaf) run only while the leaf's owner file names
    this deployment: no delete reaches a directory the program did not make. A leaf that is gone
    (removed by hand) has nothing left to delete: the step succeeds, and says so."""
    owner = shlex.quote(node.owner_file)
    skipped = shlex.quote(
        f"spark-vllm: {node.name}: {node.state_dir} is not this deployment's "
        f"({plan.deployment_id}) or is gone: nothing deleted there"
    )
    return (
        f'if [ "$(cat {owner} 2>/dev/null)" = {shlex.quote(plan.deployment_id)} ]; '
        f"then {command}; else echo {skipped} >&2; fi"
    )


def undoable(
    plan: ClusterPlan,
    name: str,
    node: NodePlan,
    script: str,
    actions: tuple[str, str],
    flags: dict[str, str],
    checks: tuple[str, ...],
    *,
    create_flags: dict[str, str] | None = None,
    stdin: Stdin | None = None,
    quiet: Literal["stderr", "none"] | None = None,
    in_state_leaf: bool = True,
) -> StepSpec:
    """A quick step whose script both does (`actions[0]`) and undoes (`actions[1]`) its work on
    `node` with the same flags; its receipt is kept there. An undo that deletes inside the state
    leaf (`in_state_leaf`) runs only while the leaf is this deployment's (`owned`)."""
    do, undo = actions
    delete = script_call(node, script, undo, **flags)
    return StepSpec(
        name=name,
        node=node,
        create=script_call(node, script, do, **flags, **(create_flags or {})),
        receipts=(Receipt(name, node, checks),),
        delete=owned(plan, node, delete) if in_state_leaf else delete,
        stdin=stdin,
        quiet=quiet,
    )


def create_consumes(spec: StepSpec) -> tuple[str, ...]:
    """What a step's create (its command, its receipts' checks, what it prints) needs."""
    checks = [c for receipt in spec.receipts for c in receipt.checks]
    return consumed(spec.create, spec.prints, *checks)


def delete_consumes(spec: StepSpec) -> tuple[str, ...]:
    return consumed(spec.delete)


def resolve_create(spec: StepSpec, values: Mapping[str, str]) -> StepSpec:
    """`spec` with what its create consumes known: its command and receipts as the host will run
    them (its delete is resolved apart: `resolve_shell`, with `delete_consumes`)."""
    receipts = tuple(
        replace(r, checks=tuple(resolve(c, values) for c in r.checks)) for r in spec.receipts
    )
    return replace(
        spec,
        create=resolve(spec.create, values),
        prints=resolve(spec.prints, values) if spec.prints is not None else None,
        receipts=receipts,
    )


def resolve_spec(spec: StepSpec, values: Mapping[str, str]) -> StepSpec:
    """`spec` with every later value known: create, receipts and delete as the host runs them."""
    delete = resolve(spec.delete, values) if spec.delete is not None else None
    return replace(resolve_create(spec, values), delete=delete)
