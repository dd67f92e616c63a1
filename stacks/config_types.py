"""What one configuration value may be: the annotated types the schema's fields use, each with
its own check (an address, a host key, a directory on the hosts, a Hub name, a byte size...).

Nothing here looks at a second key; the checks across keys are stacks/config_rules.py's.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

# Names become Pulumi resource names, container names and shell words: keep them boring.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$"
IFNAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,15}$"  # Linux IFNAMSIZ is 16 including the NUL
USER_PATTERN = r"^[a-z_][a-z0-9_.-]{0,31}$"
MAX_PORT = 65535

Port = Annotated[int, Field(ge=1, le=MAX_PORT)]

# Host paths spark-vllm creates, writes and (on destroy) removes from: never a system tree, with
# anything below it (/usr/local too: its bin and lib are on the system's search paths) ...
SYSTEM_TREES = (
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/var/run",
    "/var/lock",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/snap",
)
# ... and not a directory that holds others' data as a whole; a directory of its own below one
# of these is fine (/srv/hf, /opt/spark-vllm, /home/aurora/.cache/huggingface).
SHARED_DIRS = frozenset(
    {"/", "/home", "/root", "/var", "/var/lib", "/var/cache"} | {"/opt", "/srv", "/mnt", "/media"}
)
# ... nor below a directory every local user may write (mode 1777 on every common Linux): whoever
# makes a name there first owns it, and the sticky bit only stops others from removing it. The
# state holds keys and the scripts the SSH user (in the docker group: root) runs, and a destroy
# empties it: another user who made the directory could read the keys, replace the scripts, or
# make a path in it a link to /. /run/user/<uid> and /run/lock are under /run above (a tmpfs
# emptied at logout or boot); /dev/mqueue is under /dev. The hosts' own check (dir_safety.py)
# catches any other directory another user may write.
WORLD_WRITABLE_TREES = ("/tmp", "/var/tmp", "/dev/shm", "/var/crash")
STATE_DIR_NAME = ".spark-vllm"


def default_state_dir(user: str) -> str:
    """Where spark-vllm keeps its scripts, receipts and secrets on a host whose hosts[].stateDir
    is not set: a directory in the SSH user's home."""
    home = "/root" if user == "root" else f"/home/{user}"
    return f"{home}/{STATE_DIR_NAME}"


def _check_host_key(value: str | None) -> str | None:
    """A pinned key is one authorized_keys-style line: `<type> <base64> [comment]`."""
    if value is None:
        return None
    parts = value.split()
    if len(parts) < 2 or not re.fullmatch(r"(ssh-|ecdsa-|sk-)[\w@.-]+", parts[0]):
        raise ValueError("must look like 'ssh-ed25519 AAAA...' (a public host key line)")
    return f"{parts[0]} {parts[1]}"


def _check_address(value: str) -> str:
    """An SSH address is an IP or a DNS name; anything with spaces or slashes is a paste error."""
    if not re.fullmatch(r"[A-Za-z0-9.:_-]+", value):
        raise ValueError(f"{value!r} is not a host name or IP address")
    if value.startswith("-"):
        raise ValueError(
            f"{value!r} starts with '-', so ssh would read it as an option; "
            "use the host's name or IP address"
        )
    return value


SshAddress = Annotated[str, AfterValidator(_check_address)]
HostKey = Annotated[str | None, AfterValidator(_check_host_key)]


def _host_path(value: str) -> str:
    """An absolute path on the hosts, normalized (`//` and a trailing `/` dropped). Spaces and
    quotes are fine (every shell word is quoted); `|`, `;` and line breaks are not: receipts
    (receipt.sh) separate their fields with them. `.` and `..` are refused, not resolved: the
    path checks below must see the directory the hosts will use."""
    if not value.startswith("/"):
        raise ValueError("must be an absolute path on the hosts")
    if any(c in value for c in "|;\n\r"):
        raise ValueError("must not contain '|', ';' or a line break")
    parts = [part for part in value.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise ValueError(
            f"{value!r} has a '.' or '..' part; write the directory's plain absolute path"
        )
    return "/" + "/".join(parts)


def inside(path: str, directory: str) -> bool:
    """path is directory or below it (both normalized)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _own_directory(instead: str) -> Any:
    """A validator: a directory spark-vllm may own, not a system tree nor a shared directory as
    a whole; `instead` says what to use."""

    def check(value: str) -> str:
        for tree in WORLD_WRITABLE_TREES:
            if inside(value, tree):
                raise ValueError(
                    f"{value} is under {tree}, which every local user may write: another user "
                    f"who makes the directory first owns it; use {instead}"
                )
        for tree in SYSTEM_TREES:
            if inside(value, tree):
                where = "" if value == tree else f"under {tree}, "
                raise ValueError(f"{value} is {where}a system directory; use {instead}")
        if value in SHARED_DIRS or re.fullmatch(r"/home/[^/]+", value):
            raise ValueError(f"{value} is a directory other data lives in as well; use {instead}")
        if re.fullmatch(r"(/root|/home/[^/]+)/\.ssh(/.*)?", value):
            raise ValueError(f"{value} is where SSH keeps authorized_keys; use {instead}")
        return value

    return check


StateDirectory = Annotated[
    str,
    AfterValidator(_host_path),
    AfterValidator(
        _own_directory(
            "a directory of its own, e.g. /srv/spark-vllm, or no stateDir (~/.spark-vllm)"
        )
    ),
]
CacheDirectory = Annotated[
    str,
    AfterValidator(_host_path),
    AfterValidator(
        _own_directory(
            "a directory of its own, e.g. /home/<user>/.cache/huggingface or /srv/huggingface"
        )
    ),
]

MIN_KV_CACHE_BYTES = 64 * 1024**2
BYTE_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
BYTE_UNITS |= {"KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}


def _byte_size(value: Any) -> Any:
    """ "24GiB", "1.5 TB" or "25769803776" as bytes; anything else as given (the type decides)."""
    if not isinstance(value, str):
        return value
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", value)
    if found is None or (found.group(2) or "") not in BYTE_UNITS:
        return value
    return int(float(found.group(1)) * BYTE_UNITS[found.group(2) or ""])


def _one_error(message: str) -> Any:
    """A wrap validator that reports any failure as one line, `<value> is <message>`: a union's
    members would each give their own, under keys the user never wrote (`...constrained-float`)."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(f"{value!r} is {message}") from None

    return validate


# A fraction of each node's total memory, or "auto" (the memory check derives it).
GpuShare = Annotated[
    Annotated[float, Field(gt=0.0, le=0.98)] | Literal["auto"],
    WrapValidator(
        _one_error("neither a fraction above 0 and at most 0.98 nor auto; set e.g. 0.8, or auto")
    ),
]
# memoryGuard.minAvailableGib: "auto" (memory_guard.py AUTO_*), or GiB.
GuardFloor = Annotated[
    Annotated[float, Field(gt=0.0, le=64.0)] | Literal["auto"],
    WrapValidator(_one_error("neither GiB above 0 and at most 64 nor auto; set e.g. 4, or auto")),
]
# The KV cache per GPU: "auto", or a size in bytes that may be written with a unit.
KvCacheSize = Annotated[
    Literal["auto"] | Annotated[int, Field(ge=MIN_KV_CACHE_BYTES)] | None,
    BeforeValidator(_byte_size),
    WrapValidator(
        _one_error(
            "neither auto nor a size of at least 64 MiB; set e.g. auto, 24GiB or 25769803776"
        )
    ),
]


def _plain_hub_name(value: str) -> str:
    """Model ids and revisions name directories on the hosts (the cache's models--org--name,
    refs/<revision>): a '.' or '..' part, a leading '/' or an empty part would name another."""
    parts = value.split("/")
    if value.startswith("/"):
        problem = "starts with '/'"
    elif "" in parts:
        problem = "has an empty part ('//', or '/' at the end)"
    elif "." in parts or ".." in parts:
        problem = "has a '.' or '..' part"
    else:
        return value
    raise ValueError(
        f"{value!r} {problem}, which would name another directory on the hosts; write it as the "
        "Hugging Face Hub shows it (org/name; a branch, tag or commit)"
    )


def _weights_pattern(value: str) -> str:
    """An include/exclude pattern names files inside the model's snapshot: never outside it
    (a leading '/', a '..' part), and never a receipt's separators ('|', ';') or a control
    character (the pattern is recorded in the copy's receipt, one line)."""
    parts = value.replace("\\", "/").split("/")  # `\` is a separator to the hub client too
    if not value:
        problem = "is empty"
    elif value.startswith(("/", "\\")):
        problem = "starts with '/': patterns are relative to the model's snapshot"
    elif ".." in parts:
        problem = "has a '..' part: patterns name files inside the model's snapshot"
    elif any(c in value for c in "|;") or any(ord(c) < 32 or ord(c) == 127 for c in value):
        problem = "holds '|', ';' or a control character"
    else:
        return value
    raise ValueError(
        f"{value!r} {problem}; write a Hugging Face glob such as 'original/*' or '*.gguf'"
    )


WeightsPattern = Annotated[str, AfterValidator(_weights_pattern)]


# A served name is what clients put in `model`, and a word in the front's configuration.
# ASCII: HAProxy's json_query does not decode \u escapes; no leading `-`: HAProxy would read it
# as a flag of the match.
ServedName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:/@+][A-Za-z0-9_.:/@+-]{0,199}$")]
HubId = Annotated[str, AfterValidator(_plain_hub_name), Field(pattern=r"^[\w.-]+/[\w.-]+$")]
HubRevision = Annotated[str, AfterValidator(_plain_hub_name), Field(pattern=r"^[\w./-]+$")]

# Retention as Prometheus reads it: a duration (`15d`, `12h`) and a size (`20GB`, `512MB`).
PrometheusDuration = Annotated[str, Field(pattern=r"^[0-9]+(ms|s|m|h|d|w|y)$")]
PrometheusSize = Annotated[str, Field(pattern=r"^[0-9]+(B|KB|MB|GB|TB|PB|EB)$")]
