"""`pulumi-resource-command` and `pulumi-resource-docker` where the Go module proxy serves neither
(scripts/pulumi-build/modules.tsv): a gRPC ResourceProvider that the real engine loads, plans
with and drives, each operation performed on the lab's hosts as tests/lab/realmocks.py performs
a create (OpenSSH, the remote docker CLI).

The engine decides what runs (same, update, replace and in which order, refresh, destroy, state,
secrets); this plugin answers only what a provider answers:

- Check: the inputs as given (neither real provider adds defaults our program reads).
- Diff: the provider's classification (tests/engine/diff.py, each rule cited there); the engine
  adds the resource's own `replaceOnChanges` and `deleteBeforeReplace`.
- Create/Update/Delete: as realmocks and tests/lab/engine.py perform them.
- Read: a container and an image read back as pulumi-docker reads them; a Command as is (it has
  no read of its own).
- Invoke: pulumi-command's `local.run`.

Secrets: the plugin says it does not accept secrets, so the engine hands it plain values and
marks as secret each output whose input was (pulumi/pulumi provider_plugin.go).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from google.protobuf import empty_pb2, struct_pb2
from pulumi.output import Unknown
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockCallArgs, MockResourceArgs
from pulumi.runtime.proto import plugin_pb2, provider_pb2, provider_pb2_grpc

from tests.engine.diff import TYPE_COMMAND, TYPE_CONTAINER, TYPE_REMOTE_IMAGE, diff
from tests.engine.images import repo_digest
from tests.lab.plugins.plugin import configure_logging, serve
from tests.lab.realmocks import (
    TOKEN_LOCAL_RUN,
    DockerHost,
    JournalEntry,
    RealMocks,
    connection_from_inputs,
    docker_host_from_provider_inputs,
    inspect_image,
    read_container_back,
    refuse_previous_output_in_env,
    teardown_entry,
    update_container,
)
from tests.mockvalues import ProviderInvokeError

log = logging.getLogger("provider")

# The version each plugin reports: the one our Python SDKs ask for (uv.lock).
VERSIONS = {"command": "1.2.1", "docker": "5.2.0"}
# The provider reference realmocks resolves a docker resource's host by (this process's host).
CONFIGURED = "configured"
# The log line of each invoke's wall time: "<marker> <token> <start> <end>" (epoch seconds).
INVOKE_TIMING = "invoke-timing"
# And of each create, read, update and delete: "<marker> <op> <name> <seconds>".
STEP_TIMING = "step-timing"


def type_and_name(urn: str) -> tuple[str, str]:
    """`urn:pulumi:stack::project::parent$type::name` -> (type, name)."""
    qualified, name = urn.split("::")[2], urn.split("::", 3)[3]
    return qualified.rsplit("$", 1)[-1], name


def as_dict(struct: struct_pb2.Struct, keep_unknowns: bool = False) -> dict[str, Any]:
    """Plain values; with `keep_unknowns`, an unknown is rpc.UNKNOWN (what tests/engine/diff.py
    treats as a possible change), else the SDK drops it to None."""
    values = rpc.deserialize_properties(struct, keep_unknowns=keep_unknowns) or {}
    return dict(marked_unknowns(values))


def marked_unknowns(value: Any) -> Any:
    if isinstance(value, Unknown):
        return rpc.UNKNOWN
    if isinstance(value, dict):
        return {key: marked_unknowns(item) for key, item in value.items()}
    if isinstance(value, list):
        return [marked_unknowns(item) for item in value]
    return value


def as_struct(values: Mapping[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(json.loads(json.dumps(values)))
    return struct


def old_inputs(request: Any) -> dict[str, Any]:
    """The inputs the state holds (the engine sends them beside the old outputs)."""
    if request.HasField("old_inputs"):
        return as_dict(request.old_inputs)
    return as_dict(request.olds if hasattr(request, "olds") else request.properties)


class StandinProvider(provider_pb2_grpc.ResourceProviderServicer):
    """One provider instance: the engine starts a process per provider (default or explicit)."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.mocks = RealMocks()
        self.docker_host: DockerHost | None = None

    # -- the plugin and its configuration ----------------------------------------------------

    def Handshake(self, request: Any, context: Any) -> Any:
        """Not implemented, as by providers older than the handshake: the engine then
        configures the provider with Configure alone."""
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "no handshake: configure with Configure")

    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        return plugin_pb2.PluginInfo(version=VERSIONS[self.package])

    def GetSchema(self, request: Any, context: Any) -> Any:
        schema = {"name": self.package, "version": VERSIONS[self.package]}
        return provider_pb2.GetSchemaResponse(schema=json.dumps(schema))

    def CheckConfig(self, request: Any, context: Any) -> Any:
        return provider_pb2.CheckResponse(inputs=request.news)

    def DiffConfig(self, request: Any, context: Any) -> Any:
        """A changed setting is an update of the provider: its resources are read, updated and
        deleted through the new one from then on (nothing is replaced)."""
        olds, news = old_inputs(request), as_dict(request.news, keep_unknowns=True)
        changed = sorted(k for k in set(olds) | set(news) if olds.get(k) != news.get(k))
        return provider_pb2.DiffResponse(
            changes=provider_pb2.DiffResponse.DIFF_SOME
            if changed
            else provider_pb2.DiffResponse.DIFF_NONE,
            diffs=changed,
        )

    def Configure(self, request: Any, context: Any) -> Any:
        if request.HasField("args"):
            settings = as_dict(request.args)
        else:  # an older engine: "docker:config:host" -> "host", complex values as JSON text
            settings = {key.rsplit(":", 1)[-1]: value for key, value in request.variables.items()}
        if self.package == "docker" and settings.get("host"):
            self.docker_host = docker_host_from_provider_inputs(settings, "docker provider")
            with self.mocks._lock:
                self.mocks._docker_hosts[CONFIGURED] = self.docker_host
        return provider_pb2.ConfigureResponse(
            acceptSecrets=False, supportsPreview=False, acceptResources=False, acceptOutputs=False
        )

    # -- resources ---------------------------------------------------------------------------

    def Check(self, request: Any, context: Any) -> Any:
        return provider_pb2.CheckResponse(inputs=request.news)

    def Diff(self, request: Any, context: Any) -> Any:
        typ, _ = type_and_name(request.urn)
        planned = diff(typ, old_inputs(request), as_dict(request.news, keep_unknowns=True))
        if planned.step == "same":
            return provider_pb2.DiffResponse(changes=provider_pb2.DiffResponse.DIFF_NONE)
        return provider_pb2.DiffResponse(
            changes=provider_pb2.DiffResponse.DIFF_SOME,
            diffs=list(planned.changed),
            replaces=list(planned.changed) if planned.step == "replace" else [],
            deleteBeforeReplace=planned.delete_before_replace,
        )

    def Create(self, request: Any, context: Any) -> Any:
        typ, name = type_and_name(request.urn)
        args = MockResourceArgs(
            typ, name, as_dict(request.properties), f"{request.urn}::{CONFIGURED}", None, True
        )
        resource_id, outputs = self._answer(
            context, f"create {name}", lambda: self.mocks.perform(args)
        )
        return provider_pb2.CreateResponse(id=resource_id or name, properties=as_struct(outputs))

    def Read(self, request: Any, context: Any) -> Any:
        typ, name = type_and_name(request.urn)
        state, inputs = as_dict(request.properties), as_dict(request.inputs)
        read = self._answer(
            context, f"read {name}", lambda: self._read(typ, request.id, state, inputs)
        )
        if read is None:  # gone: the engine drops it from the state
            return provider_pb2.ReadResponse(id="")
        resource_id, state, inputs = read
        return provider_pb2.ReadResponse(
            id=resource_id, properties=as_struct(state), inputs=as_struct(inputs)
        )

    def Update(self, request: Any, context: Any) -> Any:
        typ, name = type_and_name(request.urn)
        olds, news = as_dict(request.olds), as_dict(request.news)
        outputs = self._answer(
            context,
            f"update {name}",
            lambda: self._update(typ, name, request.id, olds, old_inputs(request), news),
        )
        return provider_pb2.UpdateResponse(properties=as_struct(outputs))

    def Delete(self, request: Any, context: Any) -> Any:
        typ, name = type_and_name(request.urn)
        state = as_dict(request.properties)
        entry = JournalEntry(
            typ, name, f"{typ}::{name}", old_inputs(request), state, self.docker_host, request.id
        )
        self._answer(
            context,
            f"delete {name}",
            lambda: teardown_entry(entry, self.mocks.command_timeout_s),
        )
        return empty_pb2.Empty()

    def Invoke(self, request: Any, context: Any) -> Any:
        if request.tok != TOKEN_LOCAL_RUN:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"no invoke {request.tok}")
        args = MockCallArgs(request.tok, as_dict(request.args), "")
        started = time.time()
        try:
            outputs, _ = self.mocks.call(args)
        except ProviderInvokeError as error:
            return provider_pb2.InvokeResponse(
                failures=[provider_pb2.CheckFailure(reason=str(error))]
            )
        finally:
            # What a run spends reading facts over SSH (the lab's figures: tests/lab/realcli.py).
            log.info("%s %s %.3f %.3f", INVOKE_TIMING, request.tok, started, time.time())
        return provider_pb2.InvokeResponse(**{"return": as_struct(outputs)})

    def Cancel(self, request: Any, context: Any) -> Any:
        return empty_pb2.Empty()

    # -- what each operation does -----------------------------------------------------------

    def _answer(self, context: Any, what: str, operation: Callable[[], Any]) -> Any:
        """The operation's result, or its failure as the gRPC error the engine reports; its
        wall time goes to the log ("step-timing <op> <name> <seconds>", the lab's figures)."""
        started = time.monotonic()
        try:
            return operation()
        except Exception as error:  # the message reaches the user through the engine
            log.warning("%s failed: %s", what, error)
            context.abort(grpc.StatusCode.UNKNOWN, str(error))
        finally:
            log.info("%s %s %.3f", STEP_TIMING, what, time.monotonic() - started)

    def _read(
        self, typ: str, resource_id: str, state: dict[str, Any], inputs: dict[str, Any]
    ) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        host = self.docker_host
        if typ == TYPE_CONTAINER and host is not None:
            new_inputs = read_container_back(host, resource_id, inputs)
            if new_inputs is None:
                return None
            return resource_id, {**state, **new_inputs}, new_inputs
        if typ == TYPE_REMOTE_IMAGE and host is not None:
            name = str(state.get("name") or inputs.get("name"))
            image = inspect_image(host, name)
            if image is None:
                return None
            digest = repo_digest(name, list(image.get("RepoDigests") or []))
            refreshed = {**state, "imageId": image["Id"], "repoDigest": digest}
            return f"{image['Id']}{name}", refreshed, inputs
        return resource_id, state, inputs  # Commands have no read

    def _update(
        self,
        typ: str,
        name: str,
        resource_id: str,
        olds: dict[str, Any],
        old: dict[str, Any],
        news: dict[str, Any],
    ) -> dict[str, Any]:
        what = f"{typ} {name!r}"
        outputs = {**olds, **news}
        if typ == TYPE_COMMAND:
            # pulumi-command remote/commandController.go Update: `update`, else `create` again.
            refuse_previous_output_in_env(news, what)
            command = news.get("update") or news.get("create")
            if command:
                result = self.mocks._run_command(
                    connection_from_inputs(news.get("connection"), what),
                    str(command),
                    news.get("stdin"),
                    what,
                    news.get("logging"),
                )
                outputs.update(
                    stdout=result.stdout.removesuffix("\n"),
                    stderr=result.stderr.removesuffix("\n"),
                )
        elif typ == TYPE_CONTAINER and self.docker_host is not None:
            update_container(self.docker_host, resource_id, old, news)
        return outputs


def main(argv: list[str]) -> None:
    package = argv[0]
    configure_logging(f"pulumi-resource-{package}")
    serve(provider_pb2_grpc.add_ResourceProviderServicer_to_server, StandinProvider(package))


if __name__ == "__main__":
    main(sys.argv[1:])
