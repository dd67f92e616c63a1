"""Evaluate the real `__main__.py` under Pulumi's mock runtime and record every registration.

Each run starts the way the Pulumi CLI starts one (tests/cli): `Pulumi.yaml` loaded and
validated, the stack's config merged with the project's declarations, secrets set with
`--secret`, and the result handed to the program through PULUMI_CONFIG as the language host
does. A refusal is the CLI's `CliError`, before the program runs.

The recording monitor sees the raw RegisterResource requests, so tests can check parents,
dependencies, providers, timeouts and replacement options, not only inputs. With
`preview=True` it answers as the engine does during `pulumi preview` (tests/engine/preview.py);
with a `prior` state and no preview, as the next `pulumi up` does (the same planner; the fake
hosts make what it creates).
"""

from __future__ import annotations

import hashlib
import json
import re
import runpy
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from components.facts import FACTS_HEADER
from stacks.plan.hosts import SLOTS_FILE_NAME
from stacks.plan.steps import DEADLINE_START, STEP_ARGV0, UTF8_OUTPUT
from tests.cli import PulumiCli, gotext, handed_to_program
from tests.engine.preview import PreviewMonitor, PriorResource
from tests.engine.urns import EngineUrns
from tests.mockvalues import is_secret, unwrap_secrets

unwrap = unwrap_secrets
__all__ = ["Evaluation", "FakeHosts", "evaluate", "is_secret", "load_stack_config", "unwrap"]

REPO = Path(__file__).resolve().parents[2]
PROJECT = "spark-vllm"


@dataclass
class Registration:
    typ: str
    name: str
    urn: str
    parent: str
    dependencies: list[str]
    provider: str
    custom: bool
    delete_before_replace: bool
    custom_timeouts: dict[str, str]
    # As the mock saw them (secrets wrapped), but a Command's `create` and `delete` without the
    # host-side deadline every step gets (stacks/plan/steps.py with_deadline): the step's own
    # command line, which the tests read; `registered` keeps them as the program sent them.
    inputs: dict[str, Any] = field(default_factory=dict)
    replace_on_changes: list[str] = field(default_factory=list)
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)  # input -> URNs
    registered: dict[str, Any] = field(default_factory=dict)  # the inputs exactly as sent


@dataclass
class Evaluation:
    registrations: list[Registration]
    outputs: dict[str, Any]  # unknown outputs (preview) resolve to None
    secret_outputs: set[str]
    warnings: list[str]
    state: dict[str, PriorResource] = field(default_factory=dict)  # by URN, for the next run
    unknown_outputs: set[str] = field(default_factory=set)
    steps: dict[str, str] = field(default_factory=dict)  # preview: resource name -> step
    deletes: list[str] = field(default_factory=list)  # preview: names in the state, not declared
    # A run on a prior state: (delete|create|update, name) in the order the engine runs them.
    operations: list[tuple[str, str]] = field(default_factory=list)

    def by_type(self, typ: str) -> list[Registration]:
        return [r for r in self.registrations if r.typ == typ]

    def named(self, name: str) -> Registration:
        matches = [r for r in self.registrations if r.name == name]
        assert len(matches) == 1, f"{name}: {len(matches)} registrations"
        return matches[0]

    def urn(self, name: str) -> str:
        return self.named(name).urn

    def depends_on(self, name: str, other: str) -> bool:
        """True when `name` depends on `other`, directly or through other resources."""
        by_urn = {r.urn: r for r in self.registrations}
        target = self.urn(other)
        todo, seen = [self.urn(name)], set()
        while todo:
            urn = todo.pop()
            for dep in by_urn[urn].dependencies if urn in by_urn else []:
                if dep == target:
                    return True
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return False


def fake_id(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


class FakeHosts(pulumi.runtime.Mocks):
    """Plausible outputs for every resource type the program declares, deterministic per input.

    Like real hosts they keep the receipts the steps' commands record (components/facts.py),
    and answer the program's facts invoke with them: a second run plans nothing.
    """

    def __init__(self) -> None:
        self.receipts: dict[str, str] = {}  # step -> token
        self.slots: str = ""  # the head's record of each server's slot, as last written

    def remember(self, state: dict[str, PriorResource]) -> None:
        """The hosts as an earlier `up` left them: every recorded step's receipt."""
        for prior in state.values():
            if prior.type == "command:remote:Command":
                self._keep_receipts(prior.inputs.get("create"))

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        outputs = dict(args.inputs)
        if args.typ == "command:remote:Command":
            outputs["stdout"] = _command_stdout(args.name, args.inputs)
            outputs["stderr"] = ""
            self._keep_receipts(args.inputs.get("create"))
        elif args.typ == "command:local:Command":  # the stack instance's token
            outputs["stdout"] = fake_id("instance", args.name)[:32]
        elif args.typ == "docker:index/remoteImage:RemoteImage":
            outputs["imageId"] = "sha256:" + fake_id("image", args.inputs["name"])
            # Docker's RepoDigests name the repository without the tag: `repo@sha256:...`.
            repository = re.sub(r":[^:/]*$", "", args.inputs["name"].split("@")[0])
            outputs["repoDigest"] = repository + "@sha256:" + fake_id("digest")
        return fake_id(args.typ, args.name, json.dumps(args.inputs, sort_keys=True)), outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        if args.token != "command:local:run":
            raise NotImplementedError(args.token)
        receipts = sorted(self.receipts.items())
        lines = [FACTS_HEADER, *(f"{step} {token}" for step, token in receipts)]
        lines += [f"slot {line}" for line in self.slots.splitlines()]  # as facts.sh prints it
        return {**args.args, "stdout": "\n".join(lines) + "\n", "stderr": ""}, []

    def _keep_receipts(self, create: Any) -> None:
        self.receipts.update(recorded_receipts(unwrap_secrets(create)))
        slots = written_file(unwrap_secrets(create), f"/front/{SLOTS_FILE_NAME}")
        if slots is not None:
            self.slots = slots


def step_command(command: Any) -> Any:
    """A step's own command line out of its deadline wrapper (stacks/plan/steps.py
    with_deadline: `t0=...; timeout -k G S bash -c CMD; ...`); anything else as it is."""
    if not isinstance(command, str) or not command.startswith(DEADLINE_START + "timeout -k "):
        return command
    words = shlex.split(command.removeprefix(DEADLINE_START).split("; rc=$?;", 1)[0])
    assert words[4:8] == ["bash", "-c", UTF8_OUTPUT, STEP_ARGV0] and len(words) == 9, command
    return words[8]


def without_deadlines(inputs: dict[str, Any]) -> dict[str, Any]:
    return {
        key: step_command(value) if key in ("create", "delete") else value
        for key, value in inputs.items()
    }


def written_file(create: Any, suffix: str) -> str | None:
    """What a command line writes (`printf '%s' TEXT > PATH.tmp`) to the file ending in
    `suffix`, or None."""
    create = step_command(create)
    if not isinstance(create, str) or suffix not in create:
        return None
    words = shlex.split(create)
    for i, word in enumerate(words[:-4]):
        if word == "printf" and words[i + 3] == ">" and words[i + 4].endswith(f"{suffix}.tmp"):
            return words[i + 2]
    return None


def recorded_receipts(create: Any) -> dict[str, str]:
    """step -> token of each `receipt.sh --step S --token T` in a command line."""
    create = step_command(create)
    if not isinstance(create, str) or "receipt.sh" not in create:
        return {}
    words = shlex.split(create)
    found: dict[str, str] = {}
    for i, word in enumerate(words):
        if word.endswith("/receipt.sh"):
            flags = dict(zip(words[i + 1 :: 2], words[i + 2 :: 2], strict=False))
            found[flags["--step"]] = flags["--token"]
    return found


# A certificate as front-tls-file.sh prints it (its body need not parse: only hashed).
FAKE_CERTIFICATE = (
    "front certificate made for IP:10.240.1.11\n-----BEGIN CERTIFICATE-----\n"
    "ZmFrZSBjZXJ0aWZpY2F0ZSBvZiB0aGUgZnJvbnQ=\n-----END CERTIFICATE-----\n"
)


def _command_stdout(name: str, raw: dict[str, Any]) -> str:
    inputs = without_deadlines(raw)
    if name == "monitoring-grafana-password":  # as grafana-password.sh prints it
        return "spark-vllm-grafana-password Zk3fQ9xW2bLr7TnV0aYc5sHd8mJp1uEg\n"
    if name.endswith("-head-key"):
        return "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeHeadKey spark-vllm-fabric:x:spark1\n"
    if name.endswith("-fetch"):  # its time (lib.sh step_seconds), then the manifest
        return "spark-vllm-seconds 12.5\n0123456789abcdef0123456789abcdef01234567 3 1048576\n"
    if name.endswith("-sync"):  # as the image copy reports what it sent, and its time
        sent = {"bytes": 5 << 30, "layersKept": 0, "layers": 9, "staged": 0, "relayed": 0}
        return "spark-vllm-image-sent " + json.dumps({**sent, "seconds": 61.2}) + "\n"
    if name.endswith("-copy"):  # as the weights copy does
        sent = {"bytes": 1048576, "total": 1048576, "kept": 0, "resumed": 0, "sent": 3}
        return (
            "spark-vllm-weights-sent " + json.dumps({**sent, "relayed": 0, "seconds": 8.4}) + "\n"
        )
    if name.endswith("-retain"):  # as image_retain.py answers on a node's first image
        create = shlex.split(str(inputs.get("create")))
        pinned = create[create.index("--pinned") + 1]
        report = {"kept": [pinned], "removed": [], "inUse": []}
        return "spark-vllm-images " + json.dumps(report, sort_keys=True) + "\n"
    if name.endswith("-ready"):  # as vllm-ready.sh answers on hosts where NCCL uses RoCE
        transport = (
            "ib rocep1s0f1:1/RoCE"
            if "--expect-transport ib" in str(inputs.get("create"))
            else "not checked (no hosts[].rdmaHcas)"
        )
        start = {"measured": True, "containerStartSeconds": 0.4, "portOpenSeconds": 31.0,
                 "healthSeconds": 33.1, "firstTokenSeconds": 35.2}  # fmt: skip
        return (
            f'vllm: ready after 42s; first completion: "hello"\nfabric transport: {transport}\n'
            f"spark-vllm-start {json.dumps(start)}\n"
        )
    if name.endswith("-link"):  # as fabric-link.sh answers for a healthy 200G link
        worker = name.split("-")[-2]
        figures = {"worker": worker, "gbps": 93.5, "mtu": 9000, "headSpeedMbps": 200000}
        return "spark-vllm-fabric-link " + json.dumps({**figures, "workerSpeedMbps": 200000}) + "\n"
    if re.fullmatch(r"memory(-s\d+)?-check", name):  # as memory-check.sh answers on two Sparks
        create = shlex.split(str(inputs.get("create")))
        asked = create[create.index("--utilization") + 1]
        node = {"totalGib": 121.7, "freeGib": 110.0, "fits": 0.9, "basis": "cuda"}
        sizing: dict[str, Any] = {
            "gpuMemoryUtilization": "0.85" if asked == "auto" else asked,
            "mode": "auto" if asked == "auto" else "fixed",
            "nodes": {"spark1": node},
        }
        if "--kv-cache" in create:  # 30 GiB for `auto`, else the bytes asked for
            kv_cache = create[create.index("--kv-cache") + 1]
            kv_bytes = 30 * 1024**3 if kv_cache == "auto" else int(kv_cache)
            sizing["kvCache"] = {"kvCacheBytes": kv_bytes, "mode": kv_cache}
        return "spark-vllm-seconds 3.0\nspark-vllm-memory-sizing " + json.dumps(sizing) + "\n"
    if name == "front-tls":  # as front-tls-file.sh prints the certificate it made
        return FAKE_CERTIFICATE
    if name.endswith("-facts"):  # as image-facts.sh answers for a vLLM image with Ray
        facts = {"machine": "aarch64", "python": "3.12.3", "ray": "2.53.0", "vllm": "0.16.0"}
        return "spark-vllm-image-facts " + json.dumps(facts, sort_keys=True) + "\n"
    return ""


class RecordingMonitor(EngineUrns, pulumi_mocks.MockMonitor):
    """An `up`: every resource is created by the mocks; the state is kept for a next run."""

    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
        self.requests: dict[str, Any] = {}
        self.state: dict[str, PriorResource] = {}

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        self.requests[response.urn] = request
        self.state[response.urn] = PriorResource.recorded(request, response)
        return response


class RecordingPreviewMonitor(PreviewMonitor):
    def __init__(
        self, mocks: pulumi.runtime.Mocks, prior: dict[str, PriorResource], dry_run: bool = True
    ):
        super().__init__(mocks, prior, dry_run)
        self.requests: dict[str, Any] = {}

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        self.requests[response.urn] = request
        return response


class CapturingLogger:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str, *args: Any) -> None:
        self.warnings.append(message % args if args else message)

    def debug(self, *args: Any) -> None:
        pass

    info = debug

    def error(self, message: str, *args: Any) -> None:
        self.warnings.append("ERROR " + (message % args if args else message))

    def exception(self, message: str, *args: Any) -> None:
        self.error(message, *args)


def load_stack_config(stack: str) -> dict[str, Any]:
    """The `spark-vllm:` keys of Pulumi.<stack>.yaml, without the namespace."""
    raw = gotext.load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"]  # as the CLI reads it
    return {key.split(":", 1)[1]: value for key, value in raw.items()}


def evaluate(
    config: dict[str, Any],
    secrets: dict[str, str] | None = None,
    stack: str = "dev",
    mocks: pulumi.runtime.Mocks | None = None,
    *,
    preview: bool = False,
    prior: Evaluation | None = None,
) -> Evaluation:
    """`pulumi up` (or `preview`) of __main__.py on a stack whose `Pulumi.<stack>.yaml` holds
    `config` (keys without the namespace) and `secrets` (set with --secret). `prior` is the
    state of an earlier `up` (a deployed stack). Raises the CLI's refusal or the program's error.
    """
    cli = PulumiCli(REPO)
    cli.stack_from(stack, config)
    for key, value in (secrets or {}).items():
        cli.config_set(stack, key, value, secret=True)
    return run_stack(cli, stack, mocks, preview=preview, prior=prior)


def run_stack(
    cli: PulumiCli,
    stack: str,
    mocks: pulumi.runtime.Mocks | None = None,
    *,
    preview: bool = False,
    prior: Evaluation | None = None,
) -> Evaluation:
    """`pulumi up` / `pulumi preview` of a stack the CLI holds: its checks, then the program."""
    program_config = cli.program_config(stack)
    mocks = mocks or FakeHosts()
    prior_state = prior.state if prior is not None else {}
    if isinstance(mocks, FakeHosts):
        mocks.remember(prior_state)
    monitor: RecordingMonitor | RecordingPreviewMonitor = (
        RecordingPreviewMonitor(mocks, prior_state, dry_run=preview)
        if preview or prior is not None
        else RecordingMonitor(mocks)
    )
    logger = CapturingLogger()
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(
        mocks,
        project=PROJECT,
        stack=stack,
        preview=preview,
        monitor=monitor,
        logger=logger,  # type: ignore[arg-type]  # duck-typed: records warnings
    )
    pulumi_settings.SETTINGS.rpc_manager.clear()
    with handed_to_program(program_config):
        _sync_await(run_pulumi_func(_run_main))
    if isinstance(monitor, RecordingPreviewMonitor):
        monitor.finish()
    outputs, unknown = _resolved_outputs()
    return Evaluation(
        registrations=[_registration(urn, req) for urn, req in monitor.requests.items()],
        outputs=outputs,
        secret_outputs=_secret_output_names(),
        warnings=logger.warnings,
        state=monitor.state if not preview else {},
        unknown_outputs=unknown,
        steps=monitor.steps if isinstance(monitor, RecordingPreviewMonitor) else {},
        deletes=monitor.deletes() if isinstance(monitor, RecordingPreviewMonitor) else [],
        operations=monitor.operations if isinstance(monitor, RecordingPreviewMonitor) else [],
    )


def _run_main() -> None:
    runpy.run_path(str(REPO / "__main__.py"), run_name="__main__")


def _registration(urn: str, request: Any) -> Registration:
    timeouts = request.customTimeouts
    return Registration(
        typ=request.type,
        name=request.name,
        urn=urn,
        parent=request.parent,
        dependencies=list(request.dependencies),
        provider=request.provider,
        custom=request.custom,
        delete_before_replace=request.deleteBeforeReplace,
        custom_timeouts={"create": timeouts.create, "delete": timeouts.delete},
        inputs=without_deadlines(json_format.MessageToDict(request.object)),
        registered=json_format.MessageToDict(request.object),
        replace_on_changes=list(request.replaceOnChanges),
        property_dependencies={
            key: list(deps.urns) for key, deps in request.propertyDependencies.items()
        },
    )


def _root_outputs() -> dict[str, Any]:
    root = pulumi_settings.get_root_resource()
    assert root is not None
    return dict(root.outputs)  # type: ignore[attr-defined]


def _resolved_outputs() -> tuple[dict[str, Any], set[str]]:
    """Each stack output's value, and the names of those still unknown (preview)."""
    values, unknown = {}, set()
    for name, value in _root_outputs().items():
        output = pulumi.Output.from_input(value)
        values[name] = _sync_await(_resolve(output))
        if not _sync_await(output.is_known()):
            unknown.add(name)
    return values, unknown


def _secret_output_names() -> set[str]:
    names = set()
    for name, value in _root_outputs().items():
        output = pulumi.Output.from_input(value)
        if _sync_await(output.is_secret()):
            names.add(name)
    return names


async def _resolve(value: Any) -> Any:
    return await pulumi.Output.from_input(value).future()
