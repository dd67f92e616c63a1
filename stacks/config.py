"""The stack configuration: the user's whole interface, validated before any resource is declared.

Keys are camelCase as they appear in `Pulumi.<stack>.yaml` (`spark-vllm:hosts`, ...). Every model
forbids unknown keys, so a typo is an error naming the key instead of a silently ignored setting.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from stacks.fleet import MP_PORT_SPAN, ServedModel, budget_problem, fleet_of
from stacks.vllm_listeners import LISTENER_ENV, LISTENER_FLAGS

# Names become Pulumi resource names, container names and shell words: keep them boring.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$"
IFNAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,15}$"  # Linux IFNAMSIZ is 16 including the NUL
BASTION = "bastion"

Port = Annotated[int, Field(ge=1, le=65535)]

# Environment keys spark-vllm derives per node (stacks/plan/nodes.py); vllm.env may not set them.
DERIVED_ENV_KEYS = frozenset(
    {
        "VLLM_HOST_IP",
        "RAY_ADDRESS",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "TP_SOCKET_IFNAME",
        "UCX_NET_DEVICES",
        "NCCL_IB_HCA",
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "VLLM_API_KEY",
        "HF_TOKEN",
        "VLLM_PORT",
        "VLLM_ENGINE_READY_TIMEOUT_S",
    }
)
# The compile caches' locations (stacks/plan/nodes.py compile_cache_env): the node's bound
# cache directory; vllm.env may not move them back into the container.
COMPILE_CACHE_ENV_KEYS = frozenset(
    {
        "VLLM_CACHE_ROOT",
        "FLASHINFER_WORKSPACE_BASE",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "CUDA_CACHE_PATH",
    }
)
# timeouts.vllmReadySeconds' ceiling, and vLLM's own engine-ready wait: never the shorter.
MAX_VLLM_READY_SECONDS = 21600
# vLLM flags the program sets itself; repeating them in extraArgs would be ambiguous or leak.
OWNED_VLLM_FLAGS = frozenset(
    {
        "--api-key",
        "--host",
        "--port",
        "--served-model-name",
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--distributed-executor-backend",
        "--revision",
        "--max-model-len",
        "--gpu-memory-utilization",
        # vllm.executor mp (vllm/engine/arg_utils.py): set per node from hosts.
        "--nnodes",
        "-n",
        "--node-rank",
        "-r",
        "--master-addr",
        "--master-port",
        "--headless",
    }
)
# Flags only vLLM's multi-node mode without Ray accepts: vLLM refuses nnodes > 1 with Ray
# (vllm/config/parallel.py: "nnodes > 1 can only be set when distributed executor backend is mp").
MP_ONLY_FLAGS = frozenset({"--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port"})
# vLLM reads its arguments from this YAML file, where any owned flag could be set unchecked.
CONFIG_FILE_FLAG = "--config"
MAX_PORT = 65535
RAY_CLIENT_SERVER_PORT = 10001

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
    {"/", "/home", "/root", "/var", "/var/lib", "/var/cache", "/var/tmp"}
    | {"/opt", "/srv", "/mnt", "/media", "/tmp"}
)
STATE_DIR_NAME = ".spark-vllm"


def default_state_dir(user: str) -> str:
    """Where spark-vllm keeps its scripts, receipts and secrets on a host whose hosts[].stateDir
    is not set: a directory in the SSH user's home."""
    home = "/root" if user == "root" else f"/home/{user}"
    return f"{home}/{STATE_DIR_NAME}"


class ConfigModel(BaseModel):
    # No `inf` or `nan` in any float: inf passes a lower bound (a link floor no link meets) and
    # nan is neither above nor below anything a host script compares it with.
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )


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


def _inside(path: str, directory: str) -> bool:
    """path is directory or below it (both normalized)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _own_directory(instead: str) -> Any:
    """A validator: a directory spark-vllm may own, not a system tree nor a shared directory as
    a whole; `instead` says what to use."""

    def check(value: str) -> str:
        for tree in SYSTEM_TREES:
            if _inside(value, tree):
                where = "" if value == tree else f"under {tree}, "
                raise ValueError(f"{value} is {where}a system directory; use {instead}")
        if value in SHARED_DIRS or re.fullmatch(r"/home/[^/]+", value):
            raise ValueError(f"{value} is a directory other data lives in as well; use {instead}")
        if re.fullmatch(r"(/root|/home/[^/]+)/\.ssh(/.*)?", value):
            raise ValueError(f"{value} is where SSH keeps authorized_keys; use {instead}")
        return value

    return check


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


class HostConfig(ConfigModel):
    name: str = Field(pattern=NAME_PATTERN)
    address: SshAddress
    port: Port = 22
    user: str = Field(pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")
    via: str | None = None
    fabric_interface: str = Field(pattern=IFNAME_PATTERN)
    fabric_ip: ipaddress.IPv4Address
    rdma_hcas: list[str] = Field(default_factory=list)
    gpus: int = Field(default=1, ge=1, le=64)
    host_key: HostKey = None
    head: bool = False
    # Unset: default_state_dir(user).
    state_dir: StateDirectory | None = None


class BastionConfig(ConfigModel):
    address: SshAddress
    port: Port = 22
    user: str = Field(pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")
    host_key: HostKey = None


class SshConfig(ConfigModel):
    """How this machine authenticates: a key file, or the running ssh-agent."""

    private_key_path: str | None = None
    use_agent: bool = False
    known_hosts_file: str | None = None
    dial_error_limit: int = Field(default=4, ge=1, le=50)
    per_dial_timeout_seconds: int = Field(default=15, ge=1, le=300)
    # true: talk to hosts whose key is neither pinned nor in knownHostsFile (with a warning);
    # false refuses to deploy to them (composition/deployment.py).
    allow_unpinned: bool = False

    @model_validator(mode="after")
    def _one_auth_method(self) -> SshConfig:
        if (self.private_key_path is None) == (not self.use_agent):
            raise ValueError("set exactly one of privateKeyPath or useAgent: true")
        return self


class ImageConfig(ConfigModel):
    ref: str = Field(min_length=1)
    platform: str | None = None
    keep_on_destroy: bool = True
    # Images a deployment replaced that every node keeps (newest first), so that setting
    # image.ref back to one copies nothing; older ones lose their pinned name (image_retain.py).
    keep_previous: int = Field(default=1, ge=0, le=10)


class FrontImageConfig(ConfigModel):
    # HAProxy's official image (multi-arch, arm64 included); the pulled digest is the
    # `frontImageDigest` output: pin it as `haproxy:3.2@sha256:...`.
    ref: str = Field(default="haproxy:3.2", min_length=1)
    platform: str | None = None


class FrontConfig(ConfigModel):
    """The front on the head: publishes vllm.port and admits only requests with the API key
    (stacks/plan/front.py)."""

    image: FrontImageConfig = Field(default_factory=FrontImageConfig)
    # The front's own Prometheus metrics (HAProxy's exporter), on the head's loopback only: for
    # a Prometheus on the head, or an `ssh -L` tunnel; never on the network.
    metrics_port: Port = 8404
    # At most this many connections at once from one client address, counted before any header
    # (so clients without the key cannot hold all of the front's); a gateway that pools its
    # connections (LiteLLM) stays well below it.
    max_connections_per_client: int = Field(default=64, ge=1, le=4096)


class MonitoringImageConfig(ConfigModel):
    ref: str = Field(min_length=1)
    platform: str | None = None


# Retention as Prometheus reads it: a duration (`15d`, `12h`) and a size (`20GB`, `512MB`).
PrometheusDuration = Annotated[str, Field(pattern=r"^[0-9]+(ms|s|m|h|d|w|y)$")]
PrometheusSize = Annotated[str, Field(pattern=r"^[0-9]+(B|KB|MB|GB|TB|PB|EB)$")]


class PrometheusConfig(ConfigModel):
    """Prometheus on the head, on its loopback only: it scrapes every server, the front, Ray
    (when a model runs with it) and each node's exporter, and keeps its data in the stack's
    directory on the head, bounded by both retentions (whichever is reached first)."""

    # The upstream image (multi-arch, arm64 included): pin its digest (the `monitoring` output).
    image: MonitoringImageConfig = Field(
        default_factory=lambda: MonitoringImageConfig(ref="prom/prometheus:v3.5.0")
    )
    port: Port = 9090
    retention_time: PrometheusDuration = "15d"
    retention_size: PrometheusSize = "10GB"
    scrape_interval_seconds: int = Field(default=15, ge=1, le=300)


class GrafanaConfig(ConfigModel):
    """Grafana on the head's loopback with the shipped dashboards provisioned (read-only for
    anonymous viewers; `admin`'s password is the API key, read from its file)."""

    enabled: bool = True
    image: MonitoringImageConfig = Field(
        default_factory=lambda: MonitoringImageConfig(ref="grafana/grafana:12.2.0")
    )
    port: Port = 3000


class NodeExporterConfig(ConfigModel):
    """Each node's memory, CPU, disks and network (Prometheus's node_exporter), on the node's
    fabric IP: pulled by each node's own Docker daemon (a small image). Its port is among the
    firewall's whether or not monitoring is on, so turning monitoring on changes no guard."""

    enabled: bool = True
    image: MonitoringImageConfig = Field(
        default_factory=lambda: MonitoringImageConfig(ref="prom/node-exporter:v1.9.1")
    )
    # Not node_exporter's usual 9100: a host's own exporter often holds that, and the firewall
    # keeps this port off every interface but loopback and the fabric.
    port: Port = 19100


class MonitoringConfig(ConfigModel):
    """Off unless `enabled`: Prometheus and Grafana on the head's loopback (an `ssh -L` tunnel
    reaches them; nothing on the network), and an exporter on each node."""

    enabled: bool = False
    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)
    grafana: GrafanaConfig = Field(default_factory=GrafanaConfig)
    node_exporter: NodeExporterConfig = Field(default_factory=NodeExporterConfig)


# A served name is what clients put in `model`, and a word in the front's configuration.
# ASCII: HAProxy's json_query does not decode \u escapes; no leading `-`: HAProxy would read it
# as a flag of the match.
ServedName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:/@+][A-Za-z0-9_.:/@+-]{0,199}$")]
HubId = Annotated[str, AfterValidator(_plain_hub_name), Field(pattern=r"^[\w.-]+/[\w.-]+$")]
HubRevision = Annotated[str, AfterValidator(_plain_hub_name), Field(pattern=r"^[\w./-]+$")]


class ModelConfig(ConfigModel):
    """The weights cache on every host; and, unless `models` lists the models, the one model
    (its id is then required: StackConfig checks it)."""

    id: HubId | None = None
    revision: HubRevision = "main"
    served_name: ServedName | None = None
    cache_dir: CacheDirectory


class BenchmarkConfig(ConfigModel):
    """Once the server is ready: vLLM's own load generator (`vllm bench serve`, in the serving
    image) at each concurrency, one after another; tokens/s and time to first token per
    concurrency are the `benchmark` output. Each concurrency runs `requestsPerStream` requests
    per stream, random prompts of `inputTokens` asking for `outputTokens` each."""

    concurrencies: list[Annotated[int, Field(ge=1, le=512)]] = Field(
        default_factory=lambda: [1, 4], min_length=1, max_length=8
    )
    input_tokens: int = Field(default=1024, ge=1, le=131072)
    output_tokens: int = Field(default=128, ge=2, le=32768)
    requests_per_stream: int = Field(default=4, ge=1, le=64)
    timeout_minutes: int = Field(default=30, ge=1, le=720)


class CompileCacheConfig(ConfigModel):
    """Each node's compile caches (vLLM's torch.compile artifacts, FlashInfer's, Triton's,
    Inductor's and CUDA's JIT caches) live in the stack's directory, so a replaced server starts
    warm. A destroy removes them unless kept (a later deployment of this stack reuses them)."""

    keep_on_destroy: bool = False


class ServerSettings(ConfigModel):
    """What each vLLM server is given: under `vllm` for the one model of a stack without
    `models`, or per entry of `models`."""

    # Required for each entry of `models`; for `vllm` unless `models` is set.
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=64)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    max_model_len: int | None = Field(default=None, ge=16)
    # A fraction of each node's total memory, or "auto": derived from what each node will have
    # free when the server starts (the memory check; README, Failures), less a safety margin.
    gpu_memory_utilization: Annotated[
        Annotated[float, Field(gt=0.0, le=0.98)] | Literal["auto"],
        WrapValidator(
            _one_error(
                "neither a fraction above 0 and at most 0.98 nor auto; set e.g. 0.8, or auto"
            )
        ),
    ] = 0.8
    # The KV cache per GPU in bytes (vLLM's --kv-cache-memory-bytes): unset, vLLM's profiler
    # sizes it from gpuMemoryUtilization; "auto", the memory check gives it what the budget
    # leaves beside the weights and a reserve; a size ("24GiB", or bytes), checked to fit. On
    # unified memory the profiler can starve it (README, Memory).
    kv_cache: Annotated[
        Literal["auto"] | Annotated[int, Field(ge=MIN_KV_CACHE_BYTES)] | None,
        BeforeValidator(_byte_size),
        WrapValidator(
            _one_error(
                "neither auto nor a size of at least 64 MiB; set e.g. auto, 24GiB or 25769803776"
            )
        ),
    ] = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # "mp" (the default): vLLM's own multi-node mode (vLLM 0.11.1 on): a vLLM container per
    # node, no Ray; every node must hold the same number of GPUs (README, Executors). Current
    # vLLM images ship without Ray (not a vLLM dependency since about 0.18), and the two-Spark
    # references serve with mp (eugr/spark-vllm-docker, vllm-project/recipes PR #414).
    # "ray": a Ray cluster (a container per node) with the server on the head as its driver,
    # for images that carry Ray and hosts with unequal GPU counts.
    executor: Literal["ray", "mp"] = "mp"
    # Once ready: this many streamed completions measure time to first token and decode speed
    # (the `readiness` output); 0 skips it. Bounded to 2 minutes in all.
    measure_completions: int = Field(default=3, ge=0, le=10)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return value


class VllmConfig(ServerSettings):
    """The stack-wide serving settings; and the one model's (ServerSettings) without `models`."""

    port: Port = 8000
    # Where the front publishes the API on the head: every interface, the fabric IP only, or
    # loopback only (reached through an SSH tunnel). The key is needed on every path there.
    listen: Literal["all", "fabric", "loopback"] = "all"
    # vLLM's own port, on the head's loopback only: the front forwards to it. (vLLM checks the
    # key on /v1 only; /invocations, /tokenize, /metrics... answer whoever reaches its port.)
    server_port: Port = 8001
    compile_cache: CompileCacheConfig = Field(default_factory=CompileCacheConfig)
    # Unset: no benchmark (it loads the server for minutes on real hosts).
    benchmark: BenchmarkConfig | None = None
    # mp: the head's torch.distributed rendezvous port (vLLM's --master-port, default 29501).
    # With either executor, vLLM's message queues use the next MP_PORT_SPAN ports on every node.
    master_port: Port = 29501


class ServedModelConfig(ServerSettings):
    """One entry of `models`: the model (as `model` names it), where it runs (`hosts`: host
    names; every host when unset), its server's settings (as `vllm` holds them for one model)
    and optionally its own image."""

    id: HubId
    revision: HubRevision = "main"
    served_name: ServedName | None = None
    hosts: list[str] | None = Field(default=None, min_length=1)
    image: ImageConfig | None = None
    tensor_parallel_size: int = Field(ge=1, le=64)  # type: ignore[assignment]


class RayConfig(ConfigModel):
    """Ray's ports are all fixed (Ray picks random ones otherwise), so preflight can check them
    and the optional firewall can keep them off every interface but the fabric."""

    port: Port = 6379
    object_store_memory_bytes: int = Field(default=4 * 1024**3, ge=78_643_200)
    node_manager_port: Port = 6380
    object_manager_port: Port = 6381
    runtime_env_agent_port: Port = 6382
    dashboard_agent_grpc_port: Port = 6383
    dashboard_agent_listen_port: Port = 6384
    metrics_export_port: Port = 6385
    min_worker_port: Port = 10002
    max_worker_port: Port = 10999

    # The ports every node's Ray listens on besides the head's own (`port`), each with the
    # `ray start` flag that fixes it: the one table `ray start`'s arguments, the firewall's and
    # preflight's port lists and the keyed port checks are all read from.
    NODE_PORT_FLAGS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("node_manager_port", "--node-manager-port"),
        ("object_manager_port", "--object-manager-port"),
        ("runtime_env_agent_port", "--runtime-env-agent-port"),
        ("dashboard_agent_grpc_port", "--dashboard-agent-grpc-port"),
        ("dashboard_agent_listen_port", "--dashboard-agent-listen-port"),
        ("metrics_export_port", "--metrics-export-port"),
    )

    @property
    def node_port_flags(self) -> dict[str, int]:
        """`ray start`'s flag for each of NODE_PORT_FLAGS, and its port."""
        return {flag: getattr(self, name) for name, flag in self.NODE_PORT_FLAGS}

    @property
    def fixed_ports(self) -> dict[str, int]:
        """Every single port Ray listens on, by its config key."""
        return {
            "ray.port": self.port,
            **{f"ray.{to_camel(name)}": getattr(self, name) for name, _ in self.NODE_PORT_FLAGS},
            # Not a flag: passing it needs ray[client]; the head listens there when it has it.
            "Ray's client server port": RAY_CLIENT_SERVER_PORT,
        }

    @property
    def customized(self) -> tuple[str, ...]:
        """The keys whose value is not the default. Pulumi.yaml's project default lists every
        key with its default, so the CLI hands the program all of them: set means nothing."""
        fields = type(self).model_fields
        return tuple(
            sorted(
                to_camel(name)
                for name, field in fields.items()
                if getattr(self, name) != field.default
            )
        )

    @model_validator(mode="after")
    def _worker_range(self) -> RayConfig:
        if self.max_worker_port - self.min_worker_port < 15:
            raise ValueError("ray.minWorkerPort..maxWorkerPort must span at least 16 ports")
        return self


class DockerConfig(ConfigModel):
    request_gpus: bool = True
    container_prefix: str = Field(default="spark-vllm", pattern=NAME_PATTERN)
    shm_size_mb: int | None = Field(default=None, ge=64)
    # Deprecated, ignored: Docker counts retries per container lifetime, so a bound made a
    # container that had crashed N times over months stay down after the next reboot.
    max_restarts: int | None = Field(default=None, ge=0, le=20)


class FabricConfig(ConfigModel):
    # "managed": the program makes a key on the head and authorizes it on each worker.
    # "existing": the head's SSH user can already reach every worker's fabric IP.
    trust: Literal["managed", "existing"] = "managed"
    # Ray, vLLM and torch listen on every interface, and Ray runs code for whoever reaches it:
    # each host drops their ports on every interface but loopback and the fabric, IPv4 and IPv6,
    # kept by a container that needs no sudo (stacks/plan/firewall.py). false: a loud warning.
    firewall: bool = True
    # The head measures TCP throughput to each worker over the fabric before anything is copied;
    # below this floor the deployment stops (0: not measured). Why 20: README, Failures.
    min_link_gbps: float = Field(default=20.0, ge=0)
    # Every fabric interface must have this MTU (9000 for RoCE at full rate); unset: the head's
    # and each worker's must only agree.
    mtu: int | None = Field(default=None, ge=576, le=65536)
    # true: a fabric that is also the management network (a host's address is its fabricIp, or
    # SSH reaches a host through its fabric interface from outside the cluster). The firewall
    # then admits the whole LAN to Ray and vLLM's ports: only for a fabric no one else shares.
    shared_with_management: bool = False


class KnownBadVersion(ConfigModel):
    """A kernel or NVIDIA driver release users reported broken for this workload."""

    kind: Literal["kernel", "driver"]
    version: str = Field(pattern=r"^[\w.+~:*-]+$")  # exact, or a shell pattern (`*`)
    reason: str = Field(min_length=1, pattern=r"^[^|;\n]+$")
    source: str = Field(default="", pattern=r"^[^|;\n]*$")


class PreflightConfig(ConfigModel):
    unified_memory: bool = True
    min_free_memory_gib: float = Field(default=8.0, ge=0)
    min_free_disk_gib: float = Field(default=100.0, ge=0)
    require_nvidia_runtime: bool = True
    # Versions to refuse besides the ones spark-vllm ships (stacks/plan/known_bad.py).
    known_bad: list[KnownBadVersion] = Field(default_factory=list)
    # true: a known-bad kernel or driver is a warning, not an error.
    allow_known_bad: bool = False
    # true: drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches, needs root or
    # sudo -n) on each node right before its memory is measured for the server.
    drop_page_cache: bool = False


class TimeoutsConfig(ConfigModel):
    ray_join_seconds: int = Field(default=300, ge=10, le=7200)
    vllm_ready_seconds: int = Field(default=1800, ge=30, le=MAX_VLLM_READY_SECONDS)
    # How often the readiness wait reports the server's progress in the `pulumi up` output.
    vllm_progress_seconds: int = Field(default=30, ge=5, le=600)
    # How often the image and weights copies report bytes done, rate and ETA.
    copy_progress_seconds: int = Field(default=10, ge=1, le=600)
    # A copy whose stream moves nothing this long is stopped, naming the worker (a wedged
    # dockerd or disk there held it for the whole transfer timeout before). Judged at each
    # progress report, and only while a stream is in flight: a worker loading what it got is
    # not stalled.
    copy_stall_seconds: int = Field(default=180, ge=30, le=3600)
    image_transfer_minutes: int = Field(default=60, ge=1, le=1440)
    weights_transfer_minutes: int = Field(default=240, ge=1, le=2880)


class StackConfig(ConfigModel):
    hosts: list[HostConfig] = Field(min_length=1)
    bastion: BastionConfig | None = None
    ssh: SshConfig
    image: ImageConfig
    front: FrontConfig = Field(default_factory=FrontConfig)
    model: ModelConfig
    vllm: VllmConfig
    # The models to serve, when more than `model` + `vllm` name (stacks/fleet.py).
    models: list[ServedModelConfig] | None = Field(default=None, min_length=1)
    ray: RayConfig = Field(default_factory=RayConfig)
    docker: DockerConfig = Field(default_factory=DockerConfig)
    fabric: FabricConfig = Field(default_factory=FabricConfig)
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)

    @model_validator(mode="after")
    def _consistent(self) -> StackConfig:
        for check in (
            _unique_host_names,
            _unique_fabric_ips,
            _fabric_apart_from_management,
            _one_head,
            _via_targets_exist,
            _models_named_once,
            _model_hosts_exist,
            _gpus_match_parallelism,
            _executor_places_every_rank,
            _ports_distinct,
            _no_user_overrides,
            _cache_apart_from_state,
            _served_names_distinct,
            _benchmark_fits_the_context,
            _ray_servers_apart,
            _memory_budget_fits,
            _one_setting_per_image,
            _placement_deployable,
        ):
            check(self)
        return self

    @property
    def fleet(self) -> tuple[ServedModel, ...]:
        """Every model served, in one shape however the stack names them (stacks/fleet.py)."""
        return fleet_of(self)

    @property
    def head(self) -> HostConfig:
        marked = [h for h in self.hosts if h.head]
        return marked[0] if marked else self.hosts[0]


class ConfigError(ValueError):
    """One configuration problem, already phrased for the user (key path first)."""


def _unique_host_names(cfg: StackConfig) -> None:
    seen: set[str] = set()
    for index, host in enumerate(cfg.hosts):
        if host.name == BASTION:
            raise ConfigError(f"hosts[{index}].name: {BASTION!r} is reserved for the bastion")
        if host.name in seen:
            raise ConfigError(f"hosts[{index}].name: {host.name!r} is used by two hosts")
        seen.add(host.name)


def _unique_fabric_ips(cfg: StackConfig) -> None:
    seen: dict[ipaddress.IPv4Address, str] = {}
    for index, host in enumerate(cfg.hosts):
        if host.fabric_ip in seen:
            raise ConfigError(
                f"hosts[{index}].fabricIp: {host.fabric_ip} is also {seen[host.fabric_ip]}'s"
            )
        seen[host.fabric_ip] = host.name


def _fabric_apart_from_management(cfg: StackConfig) -> None:
    """A host whose SSH address is its own fabric IP, reached from outside the cluster (directly
    or through the bastion), is on a fabric that is the management network: the firewall admits
    everything that arrives on the fabric interface, the whole LAN. Through another host (`via`,
    the seeds' jump topology) SSH arrives over the fabric from a cluster member: fine."""
    if cfg.fabric.shared_with_management:
        return
    names = {host.name for host in cfg.hosts}
    for index, host in enumerate(cfg.hosts):
        if host.address == str(host.fabric_ip) and host.via not in names:
            raise ConfigError(
                f"hosts[{index}].address: {host.address} is {host.name}'s fabricIp, so SSH from "
                "outside the cluster reaches it over the fabric: the firewall admits whatever "
                "arrives there to Ray's and vLLM's ports, the whole LAN if the fabric is the "
                "management network. Use the host's management address, reach it `via` another "
                "host, or set fabric.sharedWithManagement: true if no one else is on that network"
            )


def _one_head(cfg: StackConfig) -> None:
    marked = [i for i, h in enumerate(cfg.hosts) if h.head]
    if len(marked) > 1:
        raise ConfigError(
            f"hosts[{marked[1]}].head: only one host can be the Ray head "
            f"(hosts[{marked[0]}] is marked too)"
        )


def _via_targets_exist(cfg: StackConfig) -> None:
    names = {h.name: h for h in cfg.hosts}
    for index, host in enumerate(cfg.hosts):
        if host.via is None:
            continue
        key = f"hosts[{index}].via"
        if host.via == host.name:
            raise ConfigError(f"{key}: {host.name} cannot be reached through itself")
        if host.via == BASTION:
            if cfg.bastion is None:
                raise ConfigError(f"{key}: says 'bastion' but no bastion is configured")
            continue
        if host.via not in names:
            raise ConfigError(
                f"{key}: {host.via!r} is neither a host name ({', '.join(names)}) nor 'bastion'"
            )
        jump = names[host.via]
        # pulumi-command allows exactly one ProxyJump hop, so a jump host must be direct.
        if jump.via is not None:
            raise ConfigError(
                f"{key}: {host.name} -> {jump.name} -> {jump.via} is a chain of two jump hosts; "
                "pulumi-command supports one hop. Reach the host through the bastion "
                "or a directly reachable host instead."
            )


def _models_named_once(cfg: StackConfig) -> None:
    """One model as `model` + `vllm`, or every model in `models`: never both."""
    per_server = set(ServerSettings.model_fields)
    if cfg.models is None:
        if cfg.model.id is None:
            raise ConfigError("model.id: is required (or list the models under `models`)")
        if cfg.vllm.tensor_parallel_size is None:
            raise ConfigError(
                "vllm.tensorParallelSize: is required (or list the models under `models`)"
            )
        return
    for field in ("id", "revision", "served_name"):
        if field in cfg.model.model_fields_set:
            raise ConfigError(
                f"model.{to_camel(field)}: `models` lists the models; set it on each entry "
                "there (model keeps cacheDir)"
            )
    for field in sorted(per_server & cfg.vllm.model_fields_set):
        raise ConfigError(
            f"vllm.{to_camel(field)}: `models` lists the models; set it on each entry there "
            "(vllm keeps the stack's port, listen, serverPort, masterPort and compileCache)"
        )


def _model_hosts_exist(cfg: StackConfig) -> None:
    names = [h.name for h in cfg.hosts]
    for index, entry in enumerate(cfg.models or ()):
        seen: set[str] = set()
        for at, name in enumerate(entry.hosts or ()):
            if name not in names:
                raise ConfigError(
                    f"models[{index}].hosts[{at}]: no host is named {name!r} "
                    f"(hosts: {', '.join(names)})"
                )
            if name in seen:
                raise ConfigError(f"models[{index}].hosts[{at}]: {name} is listed twice")
            seen.add(name)


def _gpus_match_parallelism(cfg: StackConfig) -> None:
    gpus = {h.name: h.gpus for h in cfg.hosts}
    for model in cfg.fleet:
        total = sum(gpus[name] for name in model.hosts)
        key, tp = model.settings_key, model.tensor_parallel_size
        pp = model.settings.pipeline_parallel_size
        whose = (
            "the hosts" if model.hosts == tuple(gpus) else f"its hosts ({', '.join(model.hosts)})"
        )
        if model.world_size != total:
            raise ConfigError(
                f"{key}.tensorParallelSize x {key}.pipelineParallelSize = {tp} x {pp} = "
                f"{model.world_size}, but {whose} declare {total} GPU(s) in all; they must be "
                "equal"
            )


def _executor_places_every_rank(cfg: StackConfig) -> None:
    """vLLM's mp executor starts world_size // nnodes workers on every node
    (v1/executor/multiproc_executor.py) and asserts that the world size divides evenly
    (engine/arg_utils.py): a node with more or fewer GPUs cannot be placed. Ray places any."""
    index_of = {h.name: i for i, h in enumerate(cfg.hosts)}
    for model in cfg.fleet:
        if model.settings.executor != "mp":
            continue
        key, world, nodes = model.settings_key, model.world_size, len(model.hosts)
        if world % nodes != 0:
            raise ConfigError(
                f"{key}.executor: mp places world_size / nnodes ranks on every node, and "
                f"{world} ranks (tensorParallelSize x pipelineParallelSize) do not divide evenly "
                f"across {nodes} hosts; use executor ray, or hosts with equal GPU counts"
            )
        per_node = world // nodes
        for name in model.hosts:
            host = cfg.hosts[index_of[name]]
            if host.gpus != per_node:
                raise ConfigError(
                    f"hosts[{index_of[name]}].gpus: {host.name} declares {host.gpus} GPU(s), but "
                    f"{key}.executor mp places {per_node} rank(s) on every node ({world} ranks "
                    f"over {nodes} hosts); mixed GPU counts need executor ray"
                )


def _benchmark_fits_the_context(cfg: StackConfig) -> None:
    """A benchmark request longer than the model's context is refused by vLLM (400), every one
    of them, after a whole deployment: say so before."""
    wanted = cfg.vllm.benchmark
    if wanted is None:
        return
    for model in cfg.fleet:
        limit = model.settings.max_model_len
        if limit is not None and wanted.input_tokens + wanted.output_tokens > limit:
            raise ConfigError(
                f"vllm.benchmark.inputTokens: {wanted.input_tokens} + outputTokens "
                f"{wanted.output_tokens} is more than {model.settings_key}.maxModelLen {limit}; "
                "vLLM refuses such requests"
            )


def _served_names_distinct(cfg: StackConfig) -> None:
    """Entries with one served name are replicas of one model (the same id and revision);
    one name for two different models would make requests for it land on either."""
    first: dict[str, ServedModel] = {}
    for model in cfg.fleet:
        other = first.setdefault(model.served_name, model)
        if (other.id, other.revision) != (model.id, model.revision):
            raise ConfigError(
                f"{model.model_key}.servedName: {model.served_name!r} is already "
                f"{other.model_key}'s name for {other.id}@{other.revision}, and this entry "
                f"serves {model.id}@{model.revision}; give it a servedName of its own (entries "
                "with one servedName are replicas of one model)"
            )


def _ray_servers_apart(cfg: StackConfig) -> None:
    """vLLM's Ray executor asks Ray for whole GPUs (a placement group of {"GPU": 1} bundles,
    vllm/v1/executor/ray_utils.py initialize_ray_cluster): on a node whose GPU one Ray server
    holds, a second finds none ("Current node has no GPU available"). mp servers and Ray's
    share a node (neither asks Ray for the GPU the other uses)."""
    ray_models = [m for m in cfg.fleet if m.settings.executor == "ray"]
    for index, model in enumerate(ray_models):
        for other in ray_models[:index]:
            shared = [h for h in model.hosts if h in other.hosts]
            if shared:
                raise ConfigError(
                    f"{model.settings_key}.executor: ray, like {other.settings_key}, on "
                    f"{', '.join(shared)}: vLLM's Ray executor takes each node's whole GPU, so "
                    "two Ray servers cannot share a node; use executor mp for one of them"
                )


def _one_setting_per_image(cfg: StackConfig) -> None:
    """Entries naming one ref share one copy of it (and image.ref's, its settings): the same
    ref with other settings (platform, keepOnDestroy, keepPrevious) would be ambiguous."""
    first: dict[str, tuple[str, ImageConfig]] = {cfg.image.ref: ("image", cfg.image)}
    for model in cfg.fleet:
        where, settings = first.setdefault(
            model.image.ref, (f"{model.model_key}.image", model.image)
        )
        if settings != model.image:
            raise ConfigError(
                f"{model.model_key}.image: {model.image.ref} is also {where}'s, with other "
                "settings (platform, keepOnDestroy, keepPrevious); give both the same, or "
                f"leave {model.model_key}.image out to use {where}'s"
            )


def _memory_budget_fits(cfg: StackConfig) -> None:
    problem = budget_problem(cfg.fleet, [h.name for h in cfg.hosts])
    if problem:
        raise ConfigError(problem)


def _placement_deployable(cfg: StackConfig) -> None:
    """What this release deploys: every model on the hosts it lists, each host serving some
    model; at most one of them with Ray (two Ray models sharing a node are refused
    above), its hosts the head's Ray cluster."""
    placed = {host for model in cfg.fleet for host in model.hosts}
    for index, host in enumerate(cfg.hosts):
        if host.name not in placed:
            raise ConfigError(
                f"hosts[{index}]: no model is placed on {host.name}; list it in a model's "
                "hosts, or remove it"
            )
    if len(cfg.fleet) == 1:
        return
    head = cfg.head.name
    for model in cfg.fleet:
        if model.settings.executor == "ray" and head not in model.hosts:
            raise ConfigError(
                f"{model.settings_key}.hosts: a Ray model runs on the head ({head}), where "
                "Ray's head and the model's server (its driver) run; add it to hosts, or set "
                "executor: mp"
            )


def _ports_distinct(cfg: StackConfig) -> None:
    check_ports(cfg, len(cfg.fleet))


def check_ports(cfg: StackConfig, slots: int) -> None:
    """The published port, Ray's and those of `slots` servers are distinct and outside each
    other's ranges. Server k takes serverPort + k and masterPort + k * (MP_PORT_SPAN + 1), its
    message queues the MP_PORT_SPAN ports after that (stacks/fleet.py ServerSlot)."""
    ray = cfg.ray
    owners: dict[int, str] = {}
    ports = {
        "vllm.port": cfg.vllm.port,
        "vllm.serverPort": cfg.vllm.server_port,
        "vllm.masterPort": cfg.vllm.master_port,
        "front.metricsPort": cfg.front.metrics_port,
        # Checked whether or not monitoring is on: the node exporter's port is always guarded.
        "monitoring.nodeExporter.port": cfg.monitoring.node_exporter.port,
        **(
            {
                "monitoring.prometheus.port": cfg.monitoring.prometheus.port,
                **(
                    {"monitoring.grafana.port": cfg.monitoring.grafana.port}
                    if cfg.monitoring.grafana.enabled
                    else {}
                ),
            }
            if cfg.monitoring.enabled
            else {}
        ),
    }
    queues = [(cfg.vllm.master_port + 1, cfg.vllm.master_port + MP_PORT_SPAN, "vllm.masterPort")]
    for k in range(1, slots):
        step = k * (MP_PORT_SPAN + 1)
        ports[f"vllm.serverPort + {k} (server {k + 1})"] = cfg.vllm.server_port + k
        master = f"vllm.masterPort + {step} (server {k + 1})"
        ports[master] = cfg.vllm.master_port + step
        queues.append((ports[master] + 1, ports[master] + MP_PORT_SPAN, master))
    first, last = queues[0][0], queues[-1][1]
    span = last - cfg.vllm.master_port
    own_ports = f"vllm.masterPort + 1 to + {span}: {first}-{last}"
    if last > MAX_PORT:
        raise ConfigError(
            f"vllm.masterPort: {cfg.vllm.master_port} puts vLLM's own ports ({own_ports}) past "
            f"{MAX_PORT}; use a masterPort of at most {MAX_PORT - span}"
        )
    if first <= ray.max_worker_port and ray.min_worker_port <= last:
        raise ConfigError(
            f"vllm.masterPort: vLLM's own ports ({own_ports}) overlap "
            f"ray.minWorkerPort..maxWorkerPort ({ray.min_worker_port}-{ray.max_worker_port}); "
            "move one of them"
        )
    ranges = [
        *((low, high, "vllm.masterPort", f"vLLM's message queues ({owner} + 1 to + "
           f"{MP_PORT_SPAN})") for low, high, owner in queues),
        (ray.min_worker_port, ray.max_worker_port, "ray.minWorkerPort", "Ray's worker ports "
         "(ray.minWorkerPort..maxWorkerPort)"),
    ]  # fmt: skip
    _ssh_ports_apart(cfg, {**ports, **ray.fixed_ports}, ranges)
    for key, port in {**ports, **ray.fixed_ports}.items():
        for low, high, owner in queues:
            if low <= port <= high:
                raise ConfigError(
                    f"{key}: {port} is inside the ports vLLM's message queues use ({owner} + 1 "
                    f"to + {MP_PORT_SPAN}: {low}-{high}); use another port, or move "
                    "vllm.masterPort"
                )
        if port in owners:
            raise ConfigError(f"{key}: {port} is also {owners[port]}")
        if ray.min_worker_port <= port <= ray.max_worker_port:
            raise ConfigError(
                f"{key}: {port} is inside ray.minWorkerPort..maxWorkerPort "
                f"({ray.min_worker_port}-{ray.max_worker_port})"
            )
        owners[port] = key


def ssh_ports(cfg: StackConfig) -> dict[int, str]:
    """Every port SSH may arrive on at a host of the stack, and whose it is: each host's, the
    bastion's (it may be one of the hosts), and 22 (the sshd a host's own console users reach,
    whatever port the stack dials)."""
    ports = {22: "SSH's own port 22"}
    if cfg.bastion is not None:
        ports.setdefault(cfg.bastion.port, "bastion.port (the bastion's SSH)")
    for index, host in enumerate(cfg.hosts):
        ports.setdefault(host.port, f"hosts[{index}].port ({host.name}'s SSH)")
    return ports


def _ssh_ports_apart(
    cfg: StackConfig, ports: dict[str, int], ranges: list[tuple[int, int, str, str]]
) -> None:
    """No port the stack listens on or the firewall drops is an SSH port: the guard drops its
    ports on every interface but loopback and the fabric, on every host, and comes back at each
    boot, so SSH inside them would be cut for good (only a console recovers)."""
    ssh = ssh_ports(cfg)
    for key, port in ports.items():
        if port in ssh:
            raise ConfigError(
                f"{key}: {port} is {ssh[port]}; the firewall would drop it on every host's "
                "management network, cutting SSH for good: use another port"
            )
    for low, high, key, what in ranges:
        inside = sorted(port for port in ssh if low <= port <= high)
        if inside:
            raise ConfigError(
                f"{key}: {what} cover {low}-{high}, which holds {ssh[inside[0]]} "
                f"({inside[0]}); the firewall drops that range on every host's management "
                "network, cutting SSH for good: move the range or SSH's port"
            )


# vLLM's parser (FlexibleArgumentParser.parse_args in vllm/utils/argparse_utils.py; before that
# vllm/utils/__init__.py) folds `_` into `-` in a long option's name up to its first `.`
# (`--api_key` is `--api-key`) and reads `--name.key v` as `--name '{"key": v}'`. The rest is
# argparse (Python 3.11 tried; 3.12's Lib/argparse.py read): a long option's unambiguous prefix
# (`--api-k`), a multi-letter short option's prefix (`-t` for `-tp`; `-t=2` on 3.12), a short
# option's `=value` (`-tp=2`) and a one-letter one's attached value (`-n2`) all reach the option.
# A multi-letter one's attached value (`-tp2`) does not.
GUARDED_FLAGS = OWNED_VLLM_FLAGS | {CONFIG_FILE_FLAG}
LISTENER_FLAG_NAMES = frozenset(LISTENER_FLAGS)
# What vllm.kvCache sets (vllm/engine/arg_utils.py, 0.10.2 on): a user's own is kept when unset.
KV_CACHE_FLAGS = frozenset({"--kv-cache-memory-bytes"})


def _flag_reached(
    arg: str, guarded: frozenset[str] = GUARDED_FLAGS
) -> tuple[str, list[str]] | None:
    """The flag name `arg` is read as (folded) and the `guarded` flags it reaches; None for a
    value (no leading `-`, a negative number, `-`, or `--` which ends the options)."""
    if not arg.startswith("-") or arg in ("-", "--") or re.match(r"-\d", arg):
        return None
    if arg.startswith("--"):
        name = arg.split("=", 1)[0].split(".", 1)[0]
        name = "--" + name[2:].replace("_", "-")
        if len(name) <= 2:
            return name, []
    else:
        name = arg.split("=", 1)[0]
        if arg[:2] in guarded and len(name) > 2:  # a one-letter option's attached value
            return name, [arg[:2]]
    if name in guarded:
        return name, [name]
    return name, sorted(flag for flag in guarded if flag.startswith(name))


def _no_user_overrides(cfg: StackConfig) -> None:
    for model in cfg.fleet:
        _no_user_overrides_of(model.settings, model.settings_key)


def _no_user_overrides_of(settings: ServerSettings, prefix: str) -> None:
    for key in settings.env:
        if key in DERIVED_ENV_KEYS:
            raise ConfigError(
                f"{prefix}.env.{key}: is derived per node by spark-vllm (from hosts[].fabricIp, "
                "fabricInterface, rdmaHcas, model, timeouts and secrets); remove it from "
                f"{prefix}.env"
            )
        if key in COMPILE_CACHE_ENV_KEYS:
            raise ConfigError(
                f"{prefix}.env.{key}: spark-vllm keeps this cache in each node's compile-cache "
                f"directory, so a replaced server starts warm; remove it from {prefix}.env"
            )
    for key in settings.env:
        if key in LISTENER_ENV:
            raise ConfigError(
                f"{prefix}.env.{key}: {LISTENER_ENV[key]}; spark-vllm's firewall cannot know "
                "what it opens, so a stack may not set it"
            )
    mp = settings.executor == "mp"
    for key in settings.env:
        if mp and key.startswith("RAY_"):
            raise ConfigError(
                f"{prefix}.env.{key}: no Ray runs with {prefix}.executor mp; remove it, or use "
                "executor ray"
            )
    for index, arg in enumerate(settings.extra_args):
        reached = _flag_reached(arg)
        if reached is None:
            continue
        name, flags = reached
        key = f"{prefix}.extraArgs[{index}]"
        written = arg.split("=", 1)[0]
        shown = (
            flags[0] if flags == [written] else f"{written} (vLLM reads it as {' or '.join(flags)})"
        )
        listener = (_flag_reached(arg, LISTENER_FLAG_NAMES) or ("", []))[1]
        if listener:
            raise ConfigError(
                f"{key}: {written} {LISTENER_FLAGS[listener[0]]}; spark-vllm's firewall cannot "
                "know what it opens, so a stack may not set it"
            )
        if CONFIG_FILE_FLAG in flags:
            raise ConfigError(
                f"{key}: {shown} makes vLLM read more arguments from a YAML file on the head, "
                "where any flag spark-vllm sets (--api-key, --port, ...) could be set past "
                f"these checks; write the flags in {prefix}.extraArgs instead"
            )
        if any(flag in MP_ONLY_FLAGS for flag in flags) and not mp:
            raise ConfigError(
                f"{key}: {shown} is for vLLM's multi-node mode without Ray, "
                f"which vLLM refuses with the Ray executor; set {prefix}.executor: mp instead "
                "(spark-vllm then sets it per node)"
            )
        if name.startswith("--ray-") and mp:
            raise ConfigError(
                f"{key}: {name} configures vLLM's Ray executor; "
                f"{prefix}.executor is mp (no Ray): remove it, or use executor ray"
            )
        if settings.kv_cache is not None and (_flag_reached(arg, KV_CACHE_FLAGS) or ("", []))[1]:
            raise ConfigError(
                f"{key}: {written} sizes the KV cache, as {prefix}.kvCache does: set one of them"
            )
        if flags:
            hint = (
                "set the apiKey secret instead (pulumi config set --secret apiKey ...)"
                if flags == ["--api-key"]
                else "it is set from the typed vllm/model settings"
            )
            raise ConfigError(f"{key}: {shown} is managed by spark-vllm; {hint}")


def _cache_apart_from_state(cfg: StackConfig) -> None:
    """The weights cache and a host's state directory must not hold one another: the program
    removes its state on destroy, and copies whole cache trees between hosts."""
    cache = cfg.model.cache_dir
    for index, host in enumerate(cfg.hosts):
        state = host.state_dir or default_state_dir(host.user)
        if not (_inside(cache, state) or _inside(state, cache)):
            continue
        if host.state_dir is not None:
            raise ConfigError(
                f"hosts[{index}].stateDir: {state} and model.cacheDir {cache} overlap (one is "
                "inside the other); give spark-vllm's state a directory of its own, apart from "
                "the weights"
            )
        raise ConfigError(
            f"model.cacheDir: {cache} overlaps {host.name}'s state directory {state} (the "
            f"default for user {host.user}, as hosts[{index}].stateDir is not set); use another "
            "cacheDir, e.g. /home/<user>/.cache/huggingface, or set hosts[].stateDir apart from it"
        )


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem, each starting with the config key as the user spells it."""
    lines = []
    for problem in error.errors():
        key = _key_path(problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "is not a known setting (check the spelling)"
        elif problem["type"] == "missing":
            message = "is required"
        lines.append(f"{key}: {message}" if key else message)
    return "\n".join(lines)


def _key_path(location: tuple[Any, ...]) -> str:
    key = ""
    for part in location:
        if isinstance(part, int):
            key += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][\w-]*", str(part)):
            key += ("." if key else "") + str(part)
        else:  # a mistyped key with odd characters: show it quoted and escaped
            key += f"[{str(part)!r}]"
    return key


def parse_stack_config(raw: dict[str, Any]) -> StackConfig:
    """Validate raw config values; raise ConfigError with every problem, keys first."""
    # A key set to nothing (`ray:` in YAML) means "the defaults", as if it were not set.
    raw = {key: value for key, value in raw.items() if value is not None}
    try:
        return StackConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error)) from None
