"""How the engine and each provider classify a resource whose inputs changed: same, update or
replace, and whether a replacement deletes first. Every rule cites the source it was read from.

- Engine (pulumi/pulumi `pkg/resource/deploy/step_generator.go`): a property that changed and
  matches the resource's `replaceOnChanges` makes a replace; otherwise the provider's diff
  decides. Replacement is create-before-delete unless the resource or the provider says
  delete-before-replace (issues #450, #2877; PR #22193). During a preview an unknown input is a
  possible change.
- pulumi-command v1.2.1 (`provider/pkg/provider/common/inputs.go`: only `Triggers` carries
  `provider:"replaceOnChanges"`; the Python SDK adds `replace_on_changes=["triggers[*]"]`): a
  changed `triggers` replaces, any other change (create, delete, stdin, connection, ...) is an
  update, which runs `update` or else `create` again (`remote/commandController.go`).
- pulumi-docker 5.x (`provider/resources.go`: `docker_container` has `DeleteBeforeReplace: true`,
  no field overrides) over terraform-provider-docker v4.5.0 (the `upstream` submodule):
  - `docker_container` (`internal/provider/resource_docker_container.go`): every field is
    `ForceNew` except those in CONTAINER_IN_PLACE below. Its `schema.TypeSet` fields
    (CONTAINER_SETS) are compared as sets: the bridge plans through the SDKv2's own diff
    (pulumi-terraform-bridge `pkg/tfshim/sdk-v2/provider2.go` `v2Provider.Diff` ->
    `PlanResourceChange`), where set elements are matched by their hash, and "Terraform
    considers set element reordering in programs a no-change plan" (`docs/guides/sets.md`).
  - `docker_image` (RemoteImage, `resource_docker_image.go`): `name`, `pull_triggers`,
    `triggers`, `platform` and `build` are `ForceNew`; `keep_locally` and `force_remove` are not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pulumi.runtime.rpc import UNKNOWN

TYPE_COMMAND = "command:remote:Command"
TYPE_CONTAINER = "docker:index/container:Container"
TYPE_REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
TYPE_DOCKER_PROVIDER = "pulumi:providers:docker"

# terraform-provider-docker v4.5.0: the container's settable fields without ForceNew (camelCase
# as pulumi-docker names them). `restart`, `maxRetryCount` and the resource limits are changed
# on the live container (`ContainerUpdate`); `mustRun` false -> true starts it; the rest are
# only recorded in state.
CONTAINER_IN_PLACE = frozenset(
    {
        "restart", "maxRetryCount", "mustRun", "start", "rm", "wait", "waitTimeout", "attach",
        "logs", "removeVolumes", "destroyGraceSeconds", "containerReadRefreshTimeoutMilliseconds",
        "cpuShares", "memory", "memoryReservation", "memorySwap", "cpuSet", "cpuPeriod",
        "cpuQuota", "deviceReadBps", "deviceReadIops", "deviceWriteBps", "deviceWriteIops",
        "tmpfs", "healthcheck", "init",
    }
)  # fmt: skip
# resource_docker_container.go: the attributes of `Type: schema.TypeSet` (and the sets nested in
# them: `capabilities.add`/`drop`, a mount's `volume_options.labels`), by pulumi-docker's names.
CONTAINER_SETS = frozenset(
    {
        "envs", "labels", "mounts", "ulimits", "devices", "dns", "dnsOpts", "dnsSearches",
        "groupAdds", "securityOpts", "volumes", "hosts", "uploads", "networksAdvanced",
        "deviceRequests", "deviceReadBps", "deviceReadIops", "deviceWriteBps", "deviceWriteIops",
        "capabilities", "adds", "drops",
    }
)  # fmt: skip
REMOTE_IMAGE_FORCE_NEW = frozenset({"name", "pullTriggers", "triggers", "platform", "build"})

Step = Literal["same", "update", "replace"]


@dataclass(frozen=True)
class Diff:
    step: Step
    changed: tuple[str, ...]  # top-level input keys that differ (or are unknown)
    delete_before_replace: bool = False


def has_unknown(value: Any) -> bool:
    if value == UNKNOWN:
        return True
    if isinstance(value, Mapping):
        return any(has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(has_unknown(v) for v in value)
    return False


def changed_keys(
    old: Mapping[str, Any], new: Mapping[str, Any], sets: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """Top-level keys that differ; a key in `sets` (and a key of that name nested in it) holds
    a set: its elements' order is no change."""
    keys = set(old) | set(new)
    return tuple(
        sorted(
            key
            for key in keys
            if has_unknown(new.get(key))
            or _canonical(old.get(key), key in sets, sets)
            != _canonical(new.get(key), key in sets, sets)
        )
    )


def _canonical(value: Any, is_set: bool = False, sets: frozenset[str] = frozenset()) -> str:
    return json.dumps(_ordered(value, is_set, sets), sort_keys=True)


def _ordered(value: Any, is_set: bool, sets: frozenset[str]) -> Any:
    """`value` with every set's elements in one order (their JSON text's)."""
    if isinstance(value, Mapping):
        return {k: _ordered(v, k in sets, sets) for k, v in value.items()}
    if isinstance(value, list):
        items = [_ordered(v, False, sets) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True)) if is_set else items
    return value


def _matches(key: str, patterns: Sequence[str]) -> bool:
    """`replaceOnChanges` paths: `triggers[*]` or `triggers` name the top-level `triggers`."""
    return any(p == "*" or p.split("[", 1)[0].split(".", 1)[0] == key for p in patterns)


def diff(
    typ: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    replace_on_changes: Sequence[str] = (),
    delete_before_replace: bool = False,
) -> Diff:
    """The step the engine plans for a resource that exists in the state and in the program."""
    changed = changed_keys(old, new, CONTAINER_SETS if typ == TYPE_CONTAINER else frozenset())
    if not changed:
        return Diff("same", ())
    replaces = any(_matches(key, replace_on_changes) for key in changed)
    if typ == TYPE_COMMAND:
        replaces = replaces or "triggers" in changed
    elif typ == TYPE_CONTAINER:
        replaces = replaces or any(key not in CONTAINER_IN_PLACE for key in changed)
    elif typ == TYPE_REMOTE_IMAGE:
        replaces = replaces or any(key in REMOTE_IMAGE_FORCE_NEW for key in changed)
    return Diff(
        "replace" if replaces else "update",
        changed,
        replaces and deletes_first(typ, delete_before_replace),
    )


def deletes_first(typ: str, delete_before_replace: bool) -> bool:
    """Whether a replacement deletes the old resource first: the resource's option, else the
    provider's answer (step_generator.go `continueStepsFromDiff`: `deleteBeforeReplace :=
    diff.DeleteBeforeReplace`, overridden by the goal's; pulumi-docker `provider/resources.go`:
    `docker_container` answers DeleteBeforeReplace)."""
    return delete_before_replace or typ == TYPE_CONTAINER
