"""Evaluate the real `__main__.py` under Pulumi's mock runtime and record every registration.

The recording monitor sees the raw RegisterResource requests, so tests can check parents,
dependencies, providers, timeouts and replacement options, not only inputs.
"""

from __future__ import annotations

import hashlib
import json
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

# Secret values as the mock runtime delivers them: one definition for both kinds of mock test.
from tests.lab.realmocks import is_secret, unwrap_secrets

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
    inputs: dict[str, Any] = field(default_factory=dict)  # as the mock saw them (secrets wrapped)


@dataclass
class Evaluation:
    registrations: list[Registration]
    outputs: dict[str, Any]
    secret_outputs: set[str]
    warnings: list[str]

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
    """Plausible outputs for every resource type the program declares, deterministic per input."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        outputs = dict(args.inputs)
        if args.typ == "command:remote:Command":
            outputs["stdout"] = _command_stdout(args.name, args.inputs)
            outputs["stderr"] = ""
        elif args.typ == "docker:index/remoteImage:RemoteImage":
            outputs["imageId"] = "sha256:" + fake_id("image", args.inputs["name"])
            outputs["repoDigest"] = args.inputs["name"] + "@sha256:" + fake_id("digest")
        return fake_id(args.typ, args.name, json.dumps(args.inputs, sort_keys=True)), outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        raise NotImplementedError(args.token)


def _command_stdout(name: str, inputs: dict[str, Any]) -> str:
    if name.endswith("-head-key"):
        return "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeHeadKey spark-vllm-fabric:x:spark1\n"
    if name.endswith("-fetch"):
        return "0123456789abcdef0123456789abcdef01234567 3 1048576\n"
    if name.endswith("-ready"):
        return 'vllm: ready after 42s; first completion: "hello"\n'
    return ""


class RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
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
    raw = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in raw.items()}


def evaluate(
    config: dict[str, Any],
    secrets: dict[str, str] | None = None,
    stack: str = "dev",
    mocks: pulumi.runtime.Mocks | None = None,
) -> Evaluation:
    """Run __main__.py once with `config` (plain keys) and `secrets`; raise what it raises."""
    secrets = secrets or {}
    monitor = RecordingMonitor(mocks or FakeHosts())
    logger = CapturingLogger()
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(
        monitor.mocks,
        project=PROJECT,
        stack=stack,
        preview=False,
        monitor=monitor,
        logger=logger,  # type: ignore[arg-type]  # duck-typed: records warnings
    )
    all_config = {f"{PROJECT}:{k}": _config_text(v) for k, v in config.items()}
    all_config.update({f"{PROJECT}:{k}": v for k, v in secrets.items()})
    pulumi.runtime.set_all_config(all_config, secret_keys=[f"{PROJECT}:{k}" for k in secrets])
    pulumi_settings.SETTINGS.rpc_manager.clear()
    _sync_await(run_pulumi_func(_run_main))
    return Evaluation(
        registrations=[_registration(urn, req) for urn, req in monitor.requests.items()],
        outputs=_resolved_outputs(),
        secret_outputs=_secret_output_names(),
        warnings=logger.warnings,
    )


def _run_main() -> None:
    runpy.run_path(str(REPO / "__main__.py"), run_name="__main__")


def _config_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


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
        inputs=json_format.MessageToDict(request.object),
    )


def _root_outputs() -> dict[str, Any]:
    root = pulumi_settings.get_root_resource()
    assert root is not None
    return dict(root.outputs)  # type: ignore[attr-defined]


def _resolved_outputs() -> dict[str, Any]:
    return {name: _sync_await(_resolve(value)) for name, value in _root_outputs().items()}


def _secret_output_names() -> set[str]:
    names = set()
    for name, value in _root_outputs().items():
        output = pulumi.Output.from_input(value)
        if _sync_await(output.is_secret()):
            names.add(name)
    return names


async def _resolve(value: Any) -> Any:
    return await pulumi.Output.from_input(value).future()
