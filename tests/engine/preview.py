"""A mock resource monitor that answers RegisterResource as the engine does during
`pulumi preview`, given the state of an earlier `up` (or none, for a new stack).

What the engine returns to the program for each planned step (pulumi/pulumi
`pkg/resource/deploy/step_generator.go`, `step.go`; pulumi-go-provider v1.3.0 `infer/resource.go`
`markComputed`; the SDK's `runtime/resource.py`, where an empty ID and every output missing
from the response are unknown during a dry run):

- same: the old ID and the old outputs.
- create, replace: no ID yet; the inputs as planned, every other output unknown.
- update: the old ID. pulumi-command's outputs (`stdout`, `stderr`) are unknown, because infer
  assumes that every output depends on every input and an input changed; the Docker provider
  (Terraform plan) keeps the old outputs and takes the new inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime.proto import resource_pb2

from tests.engine.diff import TYPE_COMMAND, diff
from tests.engine.urns import EngineUrns


@dataclass(frozen=True)
class PriorResource:
    """One resource in the state an `up` left: what the next run's diff starts from."""

    urn: str
    type: str
    name: str
    custom: bool
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    replace_on_changes: tuple[str, ...] = ()
    delete_before_replace: bool = False
    dependencies: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def recorded(cls, request: Any, response: Any) -> PriorResource:
        return cls(
            urn=response.urn,
            type=request.type,
            name=request.name,
            custom=request.custom,
            id=response.id,
            inputs=json_format.MessageToDict(request.object),
            outputs=json_format.MessageToDict(response.object),
            replace_on_changes=tuple(request.replaceOnChanges),
            delete_before_replace=request.deleteBeforeReplace,
            dependencies=tuple(request.dependencies),
        )


class PreviewMonitor(EngineUrns, pulumi_mocks.MockMonitor):
    """Plans a step per resource against `prior` (by URN, then by its aliases, as the engine's
    getOldResource looks it up) and answers as a preview does."""

    def __init__(self, mocks: pulumi.runtime.Mocks, prior: dict[str, PriorResource]) -> None:
        super().__init__(mocks)
        self.prior = prior
        self.steps: dict[str, str] = {}  # resource name -> create/same/update/replace
        self.registered: set[str] = set()
        self.matched: dict[str, str] = {}  # URN -> the old URN an alias found it under

    def RegisterResource(self, request: Any) -> Any:
        urn = self.make_urn(request.parent, request.type, request.name)
        self.registered.add(urn)
        if request.type == "pulumi:pulumi:Stack":
            return resource_pb2.RegisterResourceResponse(urn=urn)
        inputs = json_format.MessageToDict(request.object)
        found = next((u for u in self.old_urns(request, urn, self.matched) if u in self.prior), "")
        old = self.prior.get(found) if found else None
        if found and found != urn:
            self.matched[urn] = found
            self.registered.add(found)  # found under its alias: not deleted at the end
        if old is None:
            step, resource_id, outputs = "create", "", inputs
        else:
            step = diff(
                request.type,
                old.inputs,
                inputs,
                tuple(request.replaceOnChanges),
                request.deleteBeforeReplace,
            ).step
            resource_id, outputs = _answer(step, request.type, old, inputs)
        if request.custom:
            self.steps[request.name] = step
        obj = json_format.ParseDict(outputs, struct_pb2.Struct())
        self.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(
            urn, resource_id, outputs
        )
        return resource_pb2.RegisterResourceResponse(urn=urn, id=resource_id, object=obj)

    def deletes(self) -> list[str]:
        """Names of resources in the state that the program no longer declares."""
        return sorted(
            r.name for u, r in self.prior.items() if u not in self.registered and r.custom
        )


def _answer(
    step: str, typ: str, old: PriorResource, inputs: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    if step == "same":
        return old.id, old.outputs
    if step == "replace":
        return "", inputs
    if typ == TYPE_COMMAND:
        return old.id, inputs
    return old.id, {**old.outputs, **inputs}
