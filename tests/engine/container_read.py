"""What pulumi-docker's read of a container writes into the state, and so what the next `up`
compares the program's inputs with (terraform-provider-docker v4.5.0,
`internal/provider/resource_docker_container_funcs.go` `resourceDockerContainerRead`, each field
with its schema in `resource_docker_container.go`).

The bridge diffs the state the read left against the program's inputs with Terraform's rules
(pulumi-terraform-bridge): an attribute the program leaves unset is no change when the schema
marks it `Computed` (Docker's own value is kept) or its `DiffSuppressFunc` treats an empty value
as a no-op (`user`, `working_dir`); otherwise the read's value against the unset (zero) value is
a change, and every such field is `ForceNew`. Set-typed attributes compare as sets.

`read_container` returns the state's inputs after the read: the old ones with each read
attribute as Docker reports it, where it can make a difference by those rules. Attributes the
read sets but that cannot (Computed and unset, suppressed, or read only when set and equal as a
set) keep the program's value, so the diff module (tests/engine/diff.py) compares like for like.
The restart policy and `init` are read too: a policy changed by hand is an update that restores it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Read only when the program set them (`if _, ok := d.GetOk(...)`), or Computed: the program's
# value stands unless Docker reports another one.
COMPUTED_OR_SET_ONLY = ("command", "entrypoints", "hostname", "stopTimeout", "shmSize", "ipcMode")
# DiffSuppressFunc: "" in the program is a no-op ("treat "" as a no-op, which is Docker's
# default"): what the image declares never differs.
SUPPRESSED_WHEN_EMPTY = ("user", "workingDir")


def _caps(inspect: Mapping[str, Any]) -> dict[str, list[str]] | None:
    """`capabilities`: set by the read only when CapAdd or CapDrop is non-empty, as Docker
    stored them (Docker normalizes each to upper case with a `CAP_` prefix), with no
    DiffSuppressFunc ("TODO implement DiffSuppressFunc")."""
    host = inspect.get("HostConfig") or {}
    adds, drops = host.get("CapAdd") or [], host.get("CapDrop") or []
    if not adds and not drops:
        return None
    read: dict[str, list[str]] = {}
    if adds:
        read["adds"] = list(adds)
    if drops:
        read["drops"] = list(drops)
    return read


def _mounts(inspect: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`mounts` (`getDockerContainerMounts`): target, source, type, read_only, and the bind
    options Docker reports."""
    mounts = []
    for mount in (inspect.get("HostConfig") or {}).get("Mounts") or []:
        read: dict[str, Any] = {
            "target": mount.get("Target"),
            "source": mount.get("Source"),
            "type": mount.get("Type"),
            "readOnly": bool(mount.get("ReadOnly")),
        }
        if mount.get("BindOptions"):
            read["bindOptions"] = {"propagation": mount["BindOptions"].get("Propagation", "")}
        mounts.append(read)
    return mounts


# Non-Computed attributes the read always sets, with the zero value an unset input stands for.
_PLAIN: dict[str, tuple[Callable[[Mapping[str, Any]], Any], Any]] = {
    "domainname": (lambda c: c["Config"].get("Domainname") or "", ""),
    "privileged": (lambda c: bool(c["HostConfig"].get("Privileged")), False),
    "readOnly": (lambda c: bool(c["HostConfig"].get("ReadonlyRootfs")), False),
    "publishAllPorts": (lambda c: bool(c["HostConfig"].get("PublishAllPorts")), False),
    "tty": (lambda c: bool(c["Config"].get("Tty")), False),
    "stdinOpen": (lambda c: bool(c["Config"].get("OpenStdin")), False),
    "dns": (lambda c: list(c["HostConfig"].get("Dns") or []), []),
    "dnsSearches": (lambda c: list(c["HostConfig"].get("DnsSearch") or []), []),
    "groupAdds": (lambda c: list(c["HostConfig"].get("GroupAdd") or []), []),
    "sysctls": (lambda c: dict(c["HostConfig"].get("Sysctls") or {}), {}),
    "ulimits": (lambda c: _ulimits(c), []),
}


def _ulimits(inspect: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`ulimit` (`flattenUlimits(container.HostConfig.Ulimits)`): every ulimit the container
    runs with, dockerd's `default-ulimits` merged in at its start (daemon `mergeUlimits`), so
    a host with defaults reads back more than the program gave. Numbers as the SDK sends them."""
    return [
        {"name": u["Name"], "soft": float(u["Soft"]), "hard": float(u["Hard"])}
        for u in inspect["HostConfig"].get("Ulimits") or []
    ]


def read_container(inspect: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The container's state inputs after the read of `inspect` (`docker inspect` output)."""
    state = dict(inputs)
    config, host = inspect.get("Config") or {}, inspect.get("HostConfig") or {}
    read: dict[str, Any] = {
        "command": list(config.get("Cmd") or []),
        "entrypoints": list(config.get("Entrypoint") or []),
        "hostname": config.get("Hostname", ""),
        "stopTimeout": config.get("StopTimeout"),
        "shmSize": int(host.get("ShmSize") or 0) // (1024 * 1024),
        "ipcMode": host.get("IpcMode", ""),
        "user": config.get("User", ""),
        "workingDir": config.get("WorkingDir", ""),
    }
    for key in COMPUTED_OR_SET_ONLY + SUPPRESSED_WHEN_EMPTY:
        if key in inputs and inputs[key] not in (None, ""):
            state[key] = _like(read[key], inputs[key])
    capabilities = _caps(inspect)
    if capabilities is not None or "capabilities" in inputs:
        state["capabilities"] = _as_set_of(capabilities, inputs.get("capabilities"))
    if "securityOpts" in inputs:
        # `security_opts` (`container.HostConfig.SecurityOpt`, as given at create): Optional and
        # Computed, so an unset input keeps Docker's value and is no diff; a set one compares
        # as a set.
        read_opts = list(host.get("SecurityOpt") or [])
        state["securityOpts"] = _same_set(read_opts, inputs["securityOpts"])
    state["mounts"] = _same_set(_mounts(inspect), inputs.get("mounts"))
    for key, (value_of, zero) in _PLAIN.items():
        value = value_of(inspect)
        if key in inputs or value != zero:
            state[key] = _same_set(value, inputs.get(key)) if isinstance(value, list) else value
    state.update(_restart_and_init(host, inputs))
    return state


def _restart_and_init(host: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The read also sets `restart`, `max_retry_count` (`container.HostConfig.RestartPolicy`)
    and `init` (`*container.HostConfig.Init`, false when nil), all three updatable in place
    (not ForceNew): a policy changed by hand (`docker update --restart=no`) is a diff, an update,
    which `resourceDockerContainerUpdate` undoes with ContainerUpdate. `restart` has
    `Default: "no"` and `max_retry_count` none (an unset input is "no" and 0); `init` is
    Optional+Computed (unset: no diff, Docker's value kept)."""
    policy = host.get("RestartPolicy") or {}
    read: dict[str, Any] = {}
    restart = policy.get("Name") or "no"  # Docker reports "" for a container run without one
    if "restart" in inputs or restart != "no":
        read["restart"] = restart
    retries = int(policy.get("MaximumRetryCount") or 0)
    if "maxRetryCount" in inputs or retries:
        read["maxRetryCount"] = _like(retries, inputs.get("maxRetryCount", 0.0))
    if inputs.get("init") is not None:
        read["init"] = bool(host.get("Init"))
    return read


def _like(read: Any, program: Any) -> Any:
    """A number as the program's input holds it (the SDK sends every number as a float)."""
    if isinstance(program, float) and isinstance(read, int) and not isinstance(read, bool):
        return float(read)
    return read


def _canonical(value: Any) -> Any:
    """For comparing sets: order aside, and an unset field the same as its zero value."""
    if isinstance(value, Mapping):
        return tuple(
            sorted((k, _canonical(v)) for k, v in value.items() if v not in (None, [], False, ""))
        )
    if isinstance(value, list):
        return tuple(sorted(map(repr, map(_canonical, value))))
    return value


def _same_set(read: Any, program: Any) -> Any:
    """A set-typed attribute: the program's value when equal as a set (order and absent empty
    fields aside), else what was read."""
    return program if program is not None and _canonical(read) == _canonical(program) else read


def _as_set_of(read: dict[str, list[str]] | None, program: Any) -> Any:
    return _same_set(read if read is not None else {}, program)
