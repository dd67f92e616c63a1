"""A mock resource monitor that answers RegisterResource as the engine does during
`pulumi preview` (or, with `dry_run=False`, the next `pulumi up`, the mocks making what it
creates), given the state of an earlier `up` (or none, for a new stack). Each step is planned
by tests/engine/steps.py, cascades of delete-before-replace included; `operations` lists what
the run carries out, in order (the deletes before a create, the deletes after the program).

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

from tests.engine.cascade import OldResource
from tests.engine.diff import TYPE_COMMAND, diff
from tests.engine.steps import StepGenerator
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
    property_dependencies: dict[str, tuple[str, ...]] = field(default_factory=dict)
    provider_urn: str = ""
    pending_replacement: bool = False
    init_errors: tuple[str, ...] = ()

    def old_resource(self) -> OldResource:
        """As the engine's step generator reads it."""
        return OldResource(
            self.urn,
            self.type,
            self.inputs,
            self.dependencies,
            self.property_dependencies,
            self.provider_urn,
            self.custom,
            self.replace_on_changes,
            self.pending_replacement,
            self.init_errors,
        )

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
            property_dependencies={
                key: tuple(deps.urns) for key, deps in request.propertyDependencies.items()
            },
            # A provider reference is `URN::ID` (sdk/go/common/resource/providers ParseReference).
            provider_urn=request.provider.rsplit("::", 1)[0] if request.provider else "",
        )


class PreviewMonitor(EngineUrns, pulumi_mocks.MockMonitor):
    """Plans a step per resource against `prior` (by URN, then by its aliases, as the engine's
    getOldResource looks it up) and answers as a preview does (`dry_run=False`: as an `up`
    does, with what the mocks make; `state` is then the state the run leaves)."""

    def __init__(
        self, mocks: pulumi.runtime.Mocks, prior: dict[str, PriorResource], dry_run: bool = True
    ) -> None:
        super().__init__(mocks)
        self.prior = prior
        self.dry_run = dry_run
        self.steps: dict[str, str] = {}  # resource name -> create/same/update/replace
        self.registered: set[str] = set()
        self.matched: dict[str, str] = {}  # URN -> the old URN an alias found it under
        self.generator = StepGenerator([r.old_resource() for r in prior.values()])
        # (operation, resource name) in the order the run carries them out: "delete", "create",
        # "update"; the deletes after the program are added by `finish()`.
        self.operations: list[tuple[str, str]] = []
        self.delete_at_end: list[str] = []  # old URNs of create-before-delete replacements
        self.state: dict[str, PriorResource] = {}

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
            step = "create"
        elif not request.custom:  # a component: no provider, no cascade
            step = diff(request.type, old.inputs, inputs).step
        else:
            planned = self.generator.step(
                found,
                request.type,
                inputs,
                tuple(request.replaceOnChanges),
                request.deleteBeforeReplace,
                self.registered - {urn, found},
            )
            step = planned.op
            self.operations += [("delete", self.prior[u].name) for u in planned.delete_now]
            if planned.delete_old_at_end:
                self.delete_at_end.append(found)
        if request.custom:
            self.steps[request.name] = step
            if step != "same":
                self.operations.append(("update" if step == "update" else "create", request.name))
        if not self.dry_run and (old is None or step != "same"):
            response = super().RegisterResource(request)  # the mocks make it
            resource_id = old.id if step == "update" and old is not None else response.id
            response = resource_pb2.RegisterResourceResponse(
                urn=urn, id=resource_id, object=response.object
            )
            self.state[urn] = PriorResource.recorded(request, response)
            return response
        if old is None:
            resource_id, outputs = "", inputs
        else:
            resource_id, outputs = _answer(step, request.type, old, inputs)
        obj = json_format.ParseDict(outputs, struct_pb2.Struct())
        self.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(
            urn, resource_id, outputs
        )
        response = resource_pb2.RegisterResourceResponse(urn=urn, id=resource_id, object=obj)
        if old is not None:
            self.state[urn] = PriorResource.recorded(request, response)
        return response

    def deletes(self) -> list[str]:
        """Names of resources in the state that the program no longer declares."""
        return sorted(
            r.name for u, r in self.prior.items() if u not in self.registered and r.custom
        )

    def finish(self) -> None:
        """The deletes after the program's last step: old halves of create-before-delete
        replacements and what the program no longer declares (SG `GenerateDeletes`)."""
        gone, _dropped = self.generator.gone(self.registered)
        for urn in [*self.delete_at_end, *gone]:
            if self.prior[urn].custom:
                self.operations.append(("delete", self.prior[urn].name))


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
