"""The stack configuration's shape: every key, its type, default, bounds and description.

Keys are camelCase as they appear in `Pulumi.<stack>.yaml` (`spark-vllm:hosts`, ...). Every model
forbids unknown keys, so a typo is an error naming the key instead of a silently ignored setting.
The descriptions are the reference: docs/configuration.md is generated from them
(stacks/reference.py) and Pulumi.yaml's top-level descriptions are tested equal to them. What
spans several keys is checked by stacks/config_rules.py, run by stacks/config.py's StackConfig.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from stacks.config_types import (
    IFNAME_PATTERN,
    NAME_PATTERN,
    USER_PATTERN,
    CacheDirectory,
    GpuShare,
    GuardFloor,
    HostKey,
    HubId,
    HubRevision,
    KvCacheSize,
    Port,
    PrometheusDuration,
    PrometheusSize,
    ServedName,
    SshAddress,
    StateDirectory,
    WeightsPattern,
)

# timeouts.vllmReadySeconds' ceiling, and vLLM's own engine-ready wait: never the shorter.
MAX_VLLM_READY_SECONDS = 21600
# Not a flag of `ray start`: the head listens there when its image has ray[client].
RAY_CLIENT_SERVER_PORT = 10001

# The secrets, read by stacks/settings.py beside the typed config (never in it).
SECRETS = {
    "apiKey": (
        "The API key the front requires from clients on every route: one bearer token "
        "(letters, digits, `-._~+/` and a trailing `=`) of at least 24 characters. Required; "
        "set it with `pulumi config set --secret apiKey ...` (a plain-text value is refused)."
    ),
    "hfToken": (
        "A Hugging Face token, only for gated models; set it with `pulumi config set --secret "
        "hfToken ...` (a plain-text value is refused)."
    ),
}


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


class HostConfig(ConfigModel):
    name: str = Field(
        pattern=NAME_PATTERN,
        description=(
            "The host's name in resource and container names, `via` and `models[].hosts`: "
            "lowercase letters, digits and `-`, at most 32 characters. `bastion` is reserved."
        ),
    )
    address: SshAddress = Field(
        description=(
            "How SSH reaches the host from this machine (or from the jump host of `via`): an IP "
            "address or a DNS name. Not the host's own `fabricIp` unless it is reached `via` "
            "another host, or `fabric.sharedWithManagement` is true."
        )
    )
    port: Port = Field(default=22, description="The host's SSH port.")
    user: str = Field(
        pattern=USER_PATTERN,
        description="The SSH user; it must be in the host's `docker` group.",
    )
    via: str | None = Field(
        default=None,
        description=(
            "Reach the host through a jump host: another host's `name` (one reached directly) "
            "or `bastion`. Unset: directly. One hop at most."
        ),
    )
    fabric_interface: str = Field(
        pattern=IFNAME_PATTERN,
        description=(
            "The network interface of the fabric, the link between the hosts that NCCL, Gloo, "
            "Ray and vLLM use (names can differ between hosts)."
        ),
    )
    fabric_ip: ipaddress.IPv4Address = Field(
        description="The host's IPv4 address on its fabric interface; no two hosts share one."
    )
    rdma_hcas: list[str] = Field(
        default_factory=list,
        description=(
            "The RDMA devices NCCL uses over the fabric (`NCCL_IB_HCA`); with any, the "
            "containers get `/dev/infiniband` and unlimited locked memory. Empty: NCCL's TCP "
            "sockets."
        ),
    )
    gpus: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "The GPUs the host contributes: a model's tensorParallelSize x pipelineParallelSize "
            "equals the sum over its hosts."
        ),
    )
    host_key: HostKey = Field(
        default=None,
        description=(
            "The host's SSH public key (`ssh-ed25519 AAAA...`), pinned. Unset: the line for it "
            "in `ssh.knownHostsFile`; with neither, the host is refused unless "
            "`ssh.allowUnpinned` is true."
        ),
    )
    head: bool = Field(
        default=False,
        description=(
            "This host is the head: it runs the front, and Ray's head with executor ray. At "
            "most one host; none marked: the first host."
        ),
    )
    # Unset: default_state_dir(user).
    state_dir: StateDirectory | None = Field(
        default=None,
        description=(
            "Where spark-vllm keeps its scripts, receipts and secrets on the host (absolute): a "
            "directory of its own, never a system or shared directory, apart from "
            "`model.cacheDir`. Unset: `~/.spark-vllm` in `user`'s home."
        ),
    )


class BastionConfig(ConfigModel):
    address: SshAddress = Field(
        description="How SSH reaches the bastion from this machine: an IP address or a DNS name."
    )
    port: Port = Field(default=22, description="The bastion's SSH port.")
    user: str = Field(pattern=USER_PATTERN, description="The SSH user on the bastion.")
    host_key: HostKey = Field(
        default=None,
        description=(
            "The bastion's SSH public key (`ssh-ed25519 AAAA...`), pinned. Unset: the line for "
            "it in `ssh.knownHostsFile`; with neither, refused unless `ssh.allowUnpinned` is "
            "true."
        ),
    )


class SshConfig(ConfigModel):
    private_key_path: str | None = Field(
        default=None,
        description=(
            "The private key file on this machine that the hosts and the bastion authorize. "
            "Set exactly one of privateKeyPath or `useAgent: true`."
        ),
    )
    use_agent: bool = Field(
        default=False,
        description=(
            "Authenticate with the running ssh-agent (`SSH_AUTH_SOCK`) instead of a key file."
        ),
    )
    known_hosts_file: str | None = Field(
        default=None,
        description=(
            "A known_hosts file on this machine whose lines pin the keys of the hosts and the "
            "bastion that `hostKey` does not."
        ),
    )
    dial_error_limit: int = Field(
        default=4,
        ge=1,
        le=50,
        description="The failed dials one SSH connection allows before its step fails.",
    )
    per_dial_timeout_seconds: int = Field(
        default=15,
        ge=1,
        le=300,
        description="How long one SSH dial may take, in seconds.",
    )
    allow_unpinned: bool = Field(
        default=False,
        description=(
            "true: talk to a host or bastion whose key is neither pinned nor in "
            "`knownHostsFile`, accepting the key it presents, with a warning on every run; "
            "false: refuse to deploy to it."
        ),
    )

    @model_validator(mode="after")
    def _one_auth_method(self) -> SshConfig:
        if (self.private_key_path is None) == (not self.use_agent):
            raise ValueError("set exactly one of privateKeyPath or useAgent: true")
        return self


class ImageConfig(ConfigModel):
    ref: str = Field(
        min_length=1,
        description=(
            "The serving image, e.g. `vllm/vllm-openai:v0.34.0` (one with Ray for executor "
            "ray); pin a digest (`...@sha256:`) so that every run means the same image."
        ),
    )
    platform: str | None = Field(
        default=None,
        description=(
            "The platform to pull, e.g. `linux/arm64` for DGX Spark. Unset: the head Docker's own."
        ),
    )
    keep_on_destroy: bool = Field(
        default=True,
        description=(
            "true: `pulumi destroy` leaves the image on the hosts (it is large); false: it "
            "removes the head's."
        ),
    )
    keep_previous: int = Field(
        default=1,
        ge=0,
        le=10,
        description=(
            "How many images a change replaced every node keeps (newest first), so that "
            "setting `ref` back to one copies nothing; older ones lose their pinned name, and "
            "their data where nothing else names them."
        ),
    )


class FrontImageConfig(ConfigModel):
    ref: str = Field(
        default="haproxy:3.2",
        min_length=1,
        description=(
            "HAProxy's official image (multi-arch, arm64 included); pin the digest of the "
            "`frontImageDigest` output, as `haproxy:3.2@sha256:...`."
        ),
    )
    platform: str | None = Field(
        default=None, description="The platform to pull. Unset: the head Docker's own."
    )


class FrontTlsConfig(ConfigModel):
    """The front's TLS (off by default): the API key and the prompts cross the network
    encrypted, with a certificate the user gives or one the head makes for itself."""

    enabled: bool = Field(
        default=False,
        description=(
            "true: the front serves HTTPS only on `vllm.port` (TLS 1.2 or newer, HTTP/1.1), and "
            "`endpointUrl` is `https://...`; on a LAN others share, set it, or anyone on the "
            "path reads the API key and the prompts."
        ),
    )
    certificate_file: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "A PEM certificate (its chain after it) on this machine, read at each run; its "
            "names must cover the address clients use (`endpointUrl`'s). With `keyFile`."
        ),
    )
    key_file: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "The certificate's PEM private key on this machine (unencrypted), read at each run "
            "and sent to the head on a step's stdin only, kept in the front's secrets there "
            "and as a secret in the state. With `certificateFile`."
        ),
    )
    self_signed: bool = Field(
        default=False,
        description=(
            "true (instead of `certificateFile`/`keyFile`): the head makes a key pair and a "
            "self-signed certificate for `endpointUrl`'s address once, with openssl; clients "
            "trust the `frontCertificate` output (or pin `frontCertificateSha256`)."
        ),
    )

    @model_validator(mode="after")
    def _one_certificate_source(self) -> FrontTlsConfig:
        given = (self.certificate_file is not None, self.key_file is not None)
        if given[0] != given[1]:
            raise ValueError("set certificateFile and keyFile together (a certificate and its key)")
        if self.self_signed and given[0]:
            raise ValueError("set either selfSigned: true or certificateFile and keyFile, not both")
        if self.enabled and not (self.self_signed or given[0]):
            raise ValueError("enabled: true needs certificateFile and keyFile, or selfSigned: true")
        return self

    @property
    def user_certificate(self) -> bool:
        """TLS on, with the user's certificate and key (sent to the head on stdin)."""
        return self.enabled and self.certificate_file is not None

    @property
    def made_on_head(self) -> bool:
        """TLS on, with a self-signed pair the head makes once."""
        return self.enabled and self.self_signed


class FrontConfig(ConfigModel):
    image: FrontImageConfig = Field(
        default_factory=FrontImageConfig, description="The front's image."
    )
    tls: FrontTlsConfig = Field(
        default_factory=FrontTlsConfig,
        description="HTTPS on `vllm.port` (off by default; docs/security.md, Shared LANs).",
    )
    metrics_port: Port = Field(
        default=8404,
        description=(
            "The front's own Prometheus metrics (requests, errors, response times per model), "
            "on the head's loopback only: for a Prometheus on the head, or an `ssh -L` tunnel."
        ),
    )
    max_connections_per_client: int = Field(
        default=64,
        ge=1,
        le=4096,
        description=(
            "The connections one client address may hold at once, counted before any header "
            "is read, so that clients without the key cannot hold all of the front's; a "
            "gateway that pools its connections (LiteLLM) stays well below it."
        ),
    )


# A named key's requests, counted over a sliding minute (stacks/plan/front.py KEY_WINDOW_SECONDS).
MAX_REQUESTS_PER_MINUTE = 1_000_000


class UserKeyConfig(ConfigModel):
    """One entry of `keys`: a named key beside `apiKey`, its models and its request rate. Its
    value is the entry's `key`, a secret (`pulumi config set --path --secret 'keys[0].key'
    ...`), read beside the typed config (stacks/settings.py) and never part of it."""

    name: str = Field(
        pattern=NAME_PATTERN,
        description=(
            "The key's name, as the front's metrics label its requests and bytes (lowercase "
            "letters, digits and `-`, at most 32 characters)."
        ),
    )
    models: list[ServedName] | None = Field(
        default=None,
        min_length=1,
        description=(
            "The served names (`models[].servedName`, or the `id`) this key may use; any other "
            "is a 403 and `/v1/models` lists only these. Unset: every model."
        ),
    )
    requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REQUESTS_PER_MINUTE,
        description=(
            "The requests this key may make in a sliding minute; one more is a 429 with "
            "`Retry-After`. Unset: no limit (as `apiKey`)."
        ),
    )


class MonitoringImageConfig(ConfigModel):
    ref: str = Field(
        min_length=1,
        description="The image; pin its digest (the `monitoring` output shows the one pulled).",
    )
    platform: str | None = Field(
        default=None, description="The platform to pull. Unset: the Docker daemon's own."
    )


class PrometheusConfig(ConfigModel):
    image: MonitoringImageConfig = Field(
        default_factory=lambda: MonitoringImageConfig(ref="prom/prometheus:v3.5.0"),
        description="Prometheus's image (upstream, multi-arch).",
    )
    port: Port = Field(default=9090, description="Prometheus's port on the head's loopback.")
    retention_time: PrometheusDuration = Field(
        default="15d",
        description=(
            "How long Prometheus keeps its samples, as Prometheus reads a duration (`15d`, "
            "`12h`); the first retention reached applies."
        ),
    )
    retention_size: PrometheusSize = Field(
        default="10GB",
        description=(
            "How much disk Prometheus's samples may take, as Prometheus reads a size (`10GB`, "
            "`512MB`); the first retention reached applies."
        ),
    )
    scrape_interval_seconds: int = Field(
        default=15, ge=1, le=300, description="How often Prometheus scrapes every target."
    )


class GrafanaConfig(ConfigModel):
    enabled: bool = Field(
        default=True,
        description=(
            "Run Grafana beside Prometheus, with the shipped dashboards (read-only for "
            "anonymous viewers; `admin`'s password is the API key)."
        ),
    )
    image: MonitoringImageConfig = Field(
        default_factory=lambda: MonitoringImageConfig(ref="grafana/grafana:12.2.0"),
        description="Grafana's image (upstream, multi-arch).",
    )
    port: Port = Field(default=3000, description="Grafana's port on the head's loopback.")


class NodeExporterConfig(ConfigModel):
    enabled: bool = Field(
        default=True,
        description=(
            "With monitoring on, run Prometheus's node_exporter on every node: its memory, "
            "CPU, disks and network."
        ),
    )
    image: MonitoringImageConfig = Field(
        default_factory=lambda: MonitoringImageConfig(ref="prom/node-exporter:v1.9.1"),
        description="node_exporter's image, pulled by each node's own Docker daemon (it is small).",
    )
    port: Port = Field(
        default=19100,
        description=(
            "The exporter's port on each node's fabric IP, firewalled whether or not "
            "monitoring is on (turning it on changes no guard). Not node_exporter's usual 9100, "
            "which a host's own exporter often holds."
        ),
    )


class MonitoringConfig(ConfigModel):
    enabled: bool = Field(
        default=False,
        description=(
            "Run Prometheus and Grafana on the head's loopback (the `monitoring` output says "
            "how to tunnel to them) and the exporter on every node."
        ),
    )
    prometheus: PrometheusConfig = Field(
        default_factory=PrometheusConfig,
        description=(
            "Prometheus on the head's loopback: it scrapes every server, the front, Ray and "
            "each node's exporter, and keeps its data in the stack's directory on the head."
        ),
    )
    grafana: GrafanaConfig = Field(
        default_factory=GrafanaConfig, description="Grafana on the head's loopback."
    )
    node_exporter: NodeExporterConfig = Field(
        default_factory=NodeExporterConfig,
        description="Each node's exporter, on its fabric IP.",
    )


class ModelConfig(ConfigModel):
    id: HubId | None = Field(
        default=None,
        description=(
            "The model on the Hugging Face Hub (`org/name`). Required unless `models` lists "
            "the models."
        ),
    )
    revision: HubRevision = Field(
        default="main",
        description=(
            "The model's branch, tag or commit on the Hub (without `models`). A branch or tag is "
            "resolved at the first fetch and that commit is kept; `up` names it to write here."
        ),
    )
    include: list[WeightsPattern] = Field(
        default_factory=list,
        description=(
            "Hugging Face glob patterns (`snapshot_download`'s allow_patterns: `*` matches "
            "across `/`, a pattern ending in `/` is a directory) of the files to fetch and copy "
            "(without `models`); unset or empty: every file."
        ),
    )
    exclude: list[WeightsPattern] = Field(
        default_factory=list,
        description=(
            "Hugging Face glob patterns (its ignore_patterns) of the files neither fetched nor "
            "copied (without `models`), applied after `include`, e.g. `original/*` and "
            "`*.gguf`. Files already on a host are left there."
        ),
    )
    served_name: ServedName | None = Field(
        default=None,
        description=(
            "The name clients put in a request's `model` (without `models`). Unset: the `id`."
        ),
    )
    cache_dir: CacheDirectory = Field(
        description=(
            "The Hugging Face cache the weights are downloaded to and copied into: an absolute "
            "path, the same on every host, a directory of its own apart from the hosts' "
            "`stateDir`."
        )
    )


class BenchmarkConfig(ConfigModel):
    concurrencies: list[Annotated[int, Field(ge=1, le=512)]] = Field(
        default_factory=lambda: [1, 4],
        min_length=1,
        max_length=8,
        description="The concurrent streams of each run, one run after another.",
    )
    input_tokens: int = Field(
        default=1024, ge=1, le=131072, description="Each request's random prompt, in tokens."
    )
    output_tokens: int = Field(
        default=128, ge=2, le=32768, description="The tokens each request asks for."
    )
    requests_per_stream: int = Field(
        default=4, ge=1, le=64, description="The requests each stream sends in one run."
    )
    timeout_minutes: int = Field(
        default=30, ge=1, le=720, description="How long the whole benchmark may take."
    )


class CompileCacheConfig(ConfigModel):
    keep_on_destroy: bool = Field(
        default=False,
        description=(
            "true: `pulumi destroy` keeps each node's compile caches (and the stack's "
            "directory) for a later deployment of this stack; false: it removes them."
        ),
    )


_TENSOR_PARALLEL = (
    "The GPUs each pipeline stage shards the model over (vLLM's --tensor-parallel-size); "
    "tensorParallelSize x pipelineParallelSize is the model's GPUs."
)


class ServerSettings(ConfigModel):
    """What each vLLM server is given: under `vllm` for the one model of a stack without
    `models`, or per entry of `models`."""

    tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=f"{_TENSOR_PARALLEL} Required (under `vllm`, unless `models` is set).",
    )
    pipeline_parallel_size: int = Field(
        default=1,
        ge=1,
        le=64,
        description="The pipeline stages (vLLM's --pipeline-parallel-size).",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        description="The context length in tokens (vLLM's --max-model-len). Unset: the model's.",
    )
    gpu_memory_utilization: GpuShare = Field(
        default=0.8,
        description=(
            "The fraction of each node's total memory the server may use (vLLM's "
            "--gpu-memory-utilization); or `auto`: derived from what each node has free when "
            "the server starts (the memory check), less 5% of its memory, at least 2 GiB."
        ),
    )
    kv_cache: KvCacheSize = Field(
        default=None,
        description=(
            "The KV cache per GPU (vLLM's --kv-cache-memory-bytes): a size (`24GiB`, `1.5 TB` "
            "or bytes), checked to fit; `auto`: what the memory budget leaves beside the "
            "weights and a reserve. Unset: vLLM's profiler sizes it from gpuMemoryUtilization "
            "(on unified memory it can starve it)."
        ),
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description=(
            "More arguments of `vllm serve`, one word per item; none may set what spark-vllm "
            "sets or guards (see the rules)."
        ),
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "More environment variables of the server's containers; none may set what "
            "spark-vllm derives or guards (see the rules)."
        ),
    )
    # mp by default: current vLLM images ship without Ray (not a vLLM dependency since about
    # 0.18), and the two-Spark references serve with mp (eugr/spark-vllm-docker,
    # vllm-project/recipes PR #414).
    executor: Literal["ray", "mp"] = Field(
        default="mp",
        description=(
            "`mp`: vLLM's own multi-node mode, a vLLM container per node and no Ray; every "
            "node holds the same number of GPUs. `ray`: a Ray cluster with the server on the "
            "head as its driver, for images that carry Ray and hosts with unequal GPU counts."
        ),
    )
    measure_completions: int = Field(
        default=3,
        ge=0,
        le=10,
        description=(
            "Once the server is ready, this many streamed completions measure time to first "
            "token and decode speed (the `readiness` output; 2 minutes at most in all). 0: "
            "none."
        ),
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return value


class VllmConfig(ServerSettings):
    """The stack-wide serving settings; and the one model's (ServerSettings) without `models`."""

    port: Port = Field(default=8000, description="The port the front publishes the API on.")
    listen: Literal["all", "fabric", "loopback"] = Field(
        default="all",
        description=(
            "Where the front listens on the head: `all` its addresses, the `fabric` IP only, or "
            "`loopback` only (reached through an `ssh -L` tunnel). The key is required on every "
            "path either way."
        ),
    )
    server_port: Port = Field(
        default=8001,
        description=(
            "vLLM's own port, on the head's loopback only: the front forwards to it (vLLM "
            "checks the key on /v1 only). Each further model takes the next port."
        ),
    )
    compile_cache: CompileCacheConfig = Field(
        default_factory=CompileCacheConfig,
        description=(
            "Each node's compile caches (vLLM's torch.compile artifacts, FlashInfer's, "
            "Triton's, Inductor's and CUDA's), kept in the stack's directory so that a replaced "
            "server starts warm."
        ),
    )
    benchmark: BenchmarkConfig | None = Field(
        default=None,
        description=(
            "Once the server is ready, vLLM's own load generator (`vllm bench serve`) at each "
            "concurrency in turn; tokens/s and time to first token per concurrency are the "
            "`benchmark` output. Unset: none (it loads the server for minutes)."
        ),
    )
    master_port: Port = Field(
        default=29501,
        description=(
            "With executor mp, the head's torch.distributed rendezvous (vLLM's --master-port). "
            "With either executor, vLLM's message queues take the next 32 ports on every node; "
            "each further model takes masterPort + 33 x its slot."
        ),
    )
    host_nccl: bool = Field(
        default=False,
        description=(
            "true: every Ray and vLLM container loads the host's own NCCL (`libnccl.so.2` of "
            "the host's libnccl2 package, mounted read-only) instead of the image's; each host "
            "must have it (`sudo apt install libnccl2`). A pip-bundled NCCL wedged TP=2 on two "
            "Sparks where the host's build of the same version did not (vllm#42354). false: "
            "the image's."
        ),
    )


class ServedModelConfig(ServerSettings):
    """One entry of `models`: the model (as `model` names it), where it runs (`hosts`: host
    names; every host when unset), its server's settings (as `vllm` holds them for one model)
    and optionally its own image."""

    id: HubId = Field(description="The model on the Hugging Face Hub (`org/name`).")
    revision: HubRevision = Field(
        default="main",
        description=(
            "The model's branch, tag or commit on the Hub. A branch or tag is resolved at the "
            "first fetch and that commit is kept; `up` names it to write here."
        ),
    )
    include: list[WeightsPattern] = Field(
        default_factory=list,
        description=(
            "Hugging Face glob patterns (`snapshot_download`'s allow_patterns: `*` matches "
            "across `/`, a pattern ending in `/` is a directory) of the files to fetch and "
            "copy; unset or empty: every file."
        ),
    )
    exclude: list[WeightsPattern] = Field(
        default_factory=list,
        description=(
            "Hugging Face glob patterns (its ignore_patterns) of the files neither fetched nor "
            "copied, applied after `include`, e.g. `original/*` and `*.gguf`. Files already on "
            "a host are left there."
        ),
    )
    served_name: ServedName | None = Field(
        default=None,
        description=(
            "The name clients put in a request's `model`. Unset: the `id`. Entries sharing one "
            "are replicas of one model, balanced by the front."
        ),
    )
    hosts: list[str] | None = Field(
        default=None,
        min_length=1,
        description="The names of the hosts that serve this model. Unset: every host.",
    )
    image: ImageConfig | None = Field(
        default=None,
        description="This model's own serving image (the keys of `image`). Unset: `image`.",
    )
    tensor_parallel_size: int = Field(  # type: ignore[assignment]
        ge=1, le=64, description=f"{_TENSOR_PARALLEL} Required."
    )


class RayConfig(ConfigModel):
    port: Port = Field(default=6379, description="The head's Ray port (its GCS).")
    object_store_memory_bytes: int = Field(
        default=4 * 1024**3,
        ge=78_643_200,
        description="Each node's Ray object store, in bytes.",
    )
    node_manager_port: Port = Field(
        default=6380, description="Each node's Ray node manager (`--node-manager-port`)."
    )
    object_manager_port: Port = Field(
        default=6381, description="Each node's Ray object manager (`--object-manager-port`)."
    )
    runtime_env_agent_port: Port = Field(
        default=6382,
        description="Each node's Ray runtime env agent (`--runtime-env-agent-port`).",
    )
    dashboard_agent_grpc_port: Port = Field(
        default=6383,
        description="Each node's Ray dashboard agent, gRPC (`--dashboard-agent-grpc-port`).",
    )
    dashboard_agent_listen_port: Port = Field(
        default=6384,
        description="Each node's Ray dashboard agent, HTTP (`--dashboard-agent-listen-port`).",
    )
    metrics_export_port: Port = Field(
        default=6385, description="Each node's Ray metrics (`--metrics-export-port`)."
    )
    min_worker_port: Port = Field(
        default=10002,
        description=(
            "The first of the ports Ray's workers take on each node; the range up to "
            "maxWorkerPort spans at least 16 ports."
        ),
    )
    max_worker_port: Port = Field(
        default=10999, description="The last of the ports Ray's workers take on each node."
    )
    watch_nodes: bool = Field(
        default=True,
        description=(
            "true: every Ray container (head and workers) runs its `ray start` under a watch "
            "that restarts it when the head's GCS answers but has not listed this node's "
            "fabric IP as alive for about a minute (after a restart of the head, a raylet can "
            "stay up without registering again). false: `ray start` alone, unwatched "
            "(docs/upgrading.md says when to choose it)."
        ),
    )

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
    request_gpus: bool = Field(
        default=True,
        description=(
            "Give the Ray and vLLM containers the host's GPUs, and check in preflight that it "
            "has `hosts[].gpus` of them; false: neither."
        ),
    )
    container_prefix: str = Field(
        default="spark-vllm",
        pattern=NAME_PATTERN,
        description=(
            "The first word of every container's name (`<prefix>-vllm`, ...); two stacks on one "
            "host need different ones."
        ),
    )
    shm_size_mb: int | None = Field(
        default=None,
        ge=64,
        description=(
            "What each Ray and vLLM container needs of /dev/shm, in MiB. They share the host's "
            "(--ipc=host): preflight refuses a host whose /dev/shm is smaller than the sum over "
            "its containers. Unset: at least 1024 per node."
        ),
    )
    max_restarts: int | None = Field(
        default=None,
        ge=0,
        le=20,
        description=(
            "Ignored, with a warning (accepted so that stacks that set it still parse): Docker "
            "counts restarts over a container's lifetime, so a bound would keep a container "
            "down after a later reboot."
        ),
    )


class FabricConfig(ConfigModel):
    trust: Literal["managed", "existing"] = Field(
        default="managed",
        description=(
            "`managed`: spark-vllm makes a key on the head and authorizes it on each worker "
            "(removed on destroy); `existing`: the head's SSH user already reaches every "
            "worker's fabric IP."
        ),
    )
    firewall: bool = Field(
        default=True,
        description=(
            "true: each host drops the cluster's ports, and every port of the fabric's "
            "addresses, on every interface but loopback and the fabric, IPv4 and IPv6, kept by "
            "a container on each host (no sudo needed): Ray, vLLM and torch listen on every "
            "interface, and Ray runs code for whoever reaches it. false: off, with a warning on "
            "every run."
        ),
    )
    # Why 20: docs/troubleshooting.md, "The link".
    min_link_gbps: float = Field(
        default=20.0,
        ge=0,
        description=(
            "The head measures TCP throughput to each worker over the fabric before anything "
            "is copied; below this many Gbit/s nothing is deployed. 0: not measured."
        ),
    )
    compress: Literal["auto", "zstd", "none"] = Field(
        default="auto",
        description=(
            "How the image and weights copies cross the fabric. `auto`: before each copy the "
            "head measures the link through the copy's SSH path and zstd -1 on a sample of "
            "what it sends, and compresses only when that is faster (the link, not the CPU, is "
            "the limit); `zstd`: always, where every receiving host has zstd; `none`: never."
        ),
    )
    mtu: int | None = Field(
        default=None,
        ge=576,
        le=65536,
        description=(
            "The MTU every fabric interface must have (9000 for RoCE at full rate). Unset: the "
            "head's and each worker's must only agree."
        ),
    )
    shared_with_management: bool = Field(
        default=False,
        description=(
            "true: accept a fabric that is also the management network (a host's `address` is "
            "its `fabricIp`, or SSH reaches a host over its fabric interface from outside the "
            "cluster), with a warning; the firewall then admits that whole network to Ray's and "
            "vLLM's ports. Only for a fabric no one else is on."
        ),
    )


class KnownBadVersion(ConfigModel):
    """A kernel, NVIDIA driver or NCCL release users reported broken for this workload."""

    kind: Literal["kernel", "driver", "nccl"] = Field(
        description=(
            "What the version is of: the kernel or the NVIDIA driver (preflight refuses the "
            "host), or NCCL (the image check refuses the NCCL the servers would load, the "
            "image's or with vllm.hostNccl the host's, as MAJOR.MINOR.PATCH)."
        )
    )
    version: str = Field(
        pattern=r"^[\w.+~:*-]+$",
        description="The release: exact, or a shell pattern (`*`).",
    )
    reason: str = Field(
        min_length=1,
        pattern=r"^[^|;\n]+$",
        description="Why it is refused, shown in the error.",
    )
    source: str = Field(
        default="",
        pattern=r"^[^|;\n]*$",
        description="Where the problem was reported (a URL), shown with the reason.",
    )


class PreflightConfig(ConfigModel):
    unified_memory: bool = Field(
        default=True,
        description=(
            "The hosts' GPUs share the system's memory (DGX Spark): with one model, each "
            "node's free memory must cover its fixed gpuMemoryUtilization of the total."
        ),
    )
    min_free_memory_gib: float = Field(
        default=8.0, ge=0, description="The least free memory each host needs, in GiB."
    )
    min_free_disk_gib: float = Field(
        default=100.0,
        ge=0,
        description=(
            "The least free disk under `model.cacheDir` each host needs for the image and the "
            "weights, in GiB."
        ),
    )
    require_nvidia_runtime: bool = Field(
        default=True,
        description="Each host's Docker must have the NVIDIA runtime (the Container Toolkit).",
    )
    known_bad: list[KnownBadVersion] = Field(
        default_factory=list,
        description=(
            "Kernel, NVIDIA driver or NCCL releases to refuse, besides the ones spark-vllm "
            "ships (stacks/plan/known_bad.py, stacks/nccl_versions.py)."
        ),
    )
    allow_known_bad: bool = Field(
        default=False,
        description="true: a known-bad kernel or driver is a warning, not an error.",
    )
    enable_linger: bool = Field(
        default=True,
        description=(
            "true: where systemd-logind's RemoveIPC=yes would delete the servers' shared memory "
            "when the SSH user's last session ends (their segments are that user's, or Docker "
            "runs rootless as that user), run `loginctl enable-linger` for the user before any "
            "container starts; false: refuse, naming the command."
        ),
    )
    drop_page_cache: bool = Field(
        default=False,
        description=(
            "true: drop the page cache on each node (`sync; echo 3 > "
            "/proc/sys/vm/drop_caches`, which needs root or `sudo -n`) right before its memory "
            "is measured for the server."
        ),
    )


class MemoryGuardConfig(ConfigModel):
    enabled: bool | Literal["auto"] = Field(
        default="auto",
        description=(
            "A guard on every node that stops this stack's server that is starting (never a "
            "ready one) before the host runs out of memory (on unified memory vLLM takes more "
            "than gpuMemoryUtilization while it starts, and the host stops answering). auto: "
            "on when preflight.unifiedMemory."
        ),
    )
    min_available_gib: GuardFloor = Field(
        default="auto",
        description=(
            "The guard acts when the host's available memory (MemAvailable) falls below this "
            "many GiB. auto: 3% of the host's memory, at least 1 GiB (3.6 GiB on a DGX Spark), "
            "below what the memory check keeps free beside a server it sized."
        ),
    )
    max_pressure_percent: float = Field(
        default=60,
        ge=0,
        le=100,
        description=(
            "The guard also acts when the kernel's memory pressure (PSI `full avg10`: the share "
            "of time every runnable task waited for memory) reaches this percent, the default "
            "of systemd-oomd. 0: memory pressure alone never acts."
        ),
    )


class TimeoutsConfig(ConfigModel):
    ray_join_seconds: int = Field(
        default=300,
        ge=10,
        le=7200,
        description=(
            "How long the nodes have to meet: the workers to join Ray's head, or with executor "
            "mp the nodes at the rendezvous."
        ),
    )
    vllm_ready_seconds: int = Field(
        default=1800,
        ge=30,
        le=MAX_VLLM_READY_SECONDS,
        description=(
            "How long the server may take to be ready. vLLM's own engine-ready wait is set to "
            "this key's ceiling, so vLLM never gives up first."
        ),
    )
    vllm_execute_cold_seconds: int = Field(
        default=1800,
        ge=60,
        le=MAX_VLLM_READY_SECONDS,
        description=(
            "vLLM's limit on one step of the model (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 300 in "
            "vLLM) when the server starts on a node whose compile cache is empty: the first "
            "requests then compile kernels (FlashInfer, Triton, torch.compile) and a step can "
            "take many minutes. The launcher picks this or vllmExecuteWarmSeconds at each start."
        ),
    )
    vllm_execute_warm_seconds: int = Field(
        default=600,
        ge=60,
        le=MAX_VLLM_READY_SECONDS,
        description=(
            "vLLM's limit on one step of the model when the node's compile cache holds a "
            "previous start's kernels: a wedged step is given up sooner. At most "
            "vllmExecuteColdSeconds."
        ),
    )

    vllm_progress_seconds: int = Field(
        default=30,
        ge=5,
        le=600,
        description="How often the wait for the server prints its progress in `pulumi up`.",
    )
    copy_progress_seconds: int = Field(
        default=10,
        ge=1,
        le=600,
        description="How often the image and weights copies print bytes done, rate and ETA.",
    )
    copy_stall_seconds: int = Field(
        default=180,
        ge=30,
        le=3600,
        description=(
            "A copy whose stream moves nothing this long is stopped, naming the worker. Judged "
            "at each progress report, and only while a stream is in flight: a worker loading "
            "what it got is not stalled."
        ),
    )
    image_transfer_minutes: int = Field(
        default=60,
        ge=1,
        le=1440,
        description="How long getting the image onto the nodes may take.",
    )
    weights_transfer_minutes: int = Field(
        default=240,
        ge=1,
        le=2880,
        description="How long getting the weights onto the nodes may take.",
    )

    @model_validator(mode="after")
    def _warm_within_cold(self) -> TimeoutsConfig:
        if self.vllm_execute_warm_seconds > self.vllm_execute_cold_seconds:
            raise ValueError(
                "vllmExecuteWarmSeconds must not exceed vllmExecuteColdSeconds: a first start "
                "compiles what a warm one finds in its cache"
            )
        return self


class StackSchema(ConfigModel):
    """The top-level keys. stacks/config.py's StackConfig adds the checks across them."""

    hosts: list[HostConfig] = Field(
        min_length=1,
        description=(
            "The GPU hosts, each reached over SSH. The head (the one with `head: true`, else "
            "the first) runs the front, and Ray's head with executor ray."
        ),
    )
    bastion: BastionConfig | None = Field(
        default=None,
        description="A jump host for the hosts with `via: bastion`. Unset (`{}`): no bastion.",
    )
    ssh: SshConfig = Field(
        description=(
            "How this machine authenticates to the hosts and the bastion, where it finds their "
            "keys, and how it dials them."
        )
    )
    image: ImageConfig = Field(
        description=(
            "The serving image every node runs, and what a change or a destroy keeps of it."
        )
    )
    front: FrontConfig = Field(
        default_factory=FrontConfig,
        description=(
            "The front on the head (HAProxy): it publishes `vllm.port` and admits only requests "
            "with the API key, on every path."
        ),
    )
    keys: list[UserKeyConfig] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Named keys beside `apiKey` (which stays admitted for every model, with no limit): "
            "each a `name`, its value `key` (a secret, like `apiKey`: `pulumi config set --path "
            "--secret 'keys[0].key' ...`; a plain-text value is refused), the `models` it may "
            "use and its `requestsPerMinute`. Adding, changing or revoking one reloads the "
            "front and nothing else."
        ),
    )
    model: ModelConfig = Field(
        description=(
            "The weights cache on every host and, without `models`, the one model to serve."
        )
    )
    vllm: VllmConfig = Field(
        description=(
            "The vLLM servers' stack-wide settings (ports, listen, compile cache, benchmark) "
            "and, without `models`, the one model's server settings."
        )
    )
    models: list[ServedModelConfig] | None = Field(
        default=None,
        min_length=1,
        description=(
            "The models to serve, instead of `model.id` and `vllm`'s per-model keys: each entry "
            "is a model, the hosts that serve it and its server's settings. Every host serves "
            "some model."
        ),
    )
    ray: RayConfig = Field(
        default_factory=RayConfig,
        description=(
            "Ray (executor ray): its object store, and its ports, all fixed so that preflight "
            "can check them and the firewall can keep them on the fabric."
        ),
    )
    docker: DockerConfig = Field(
        default_factory=DockerConfig, description="The containers' settings on every host."
    )
    fabric: FabricConfig = Field(
        default_factory=FabricConfig,
        description=(
            "The fabric between the hosts: how the head reaches the workers over it, the "
            "firewall that keeps the cluster's ports on it, the check of its links, and whether "
            "copies over it are compressed."
        ),
    )
    preflight: PreflightConfig = Field(
        default_factory=PreflightConfig,
        description="The checks of each host before anything starts on it.",
    )
    memory_guard: MemoryGuardConfig = Field(
        default_factory=MemoryGuardConfig,
        description=(
            "The memory guard on every node: it stops this stack's server that is starting "
            "before the host runs out of memory, and the readiness wait says so."
        ),
    )
    timeouts: TimeoutsConfig = Field(
        default_factory=TimeoutsConfig,
        description=(
            "The deadlines of the deployment's waits and copies, and how often they report "
            "their progress."
        ),
    )
    monitoring: MonitoringConfig = Field(
        default_factory=MonitoringConfig,
        description=(
            "Off unless `enabled`: Prometheus and Grafana on the head's loopback, reached "
            "through an SSH tunnel (the `monitoring` output), scraping every server, the front, "
            "Ray and each node's exporter."
        ),
    )

    @property
    def head(self) -> HostConfig:
        marked = [h for h in self.hosts if h.head]
        return marked[0] if marked else self.hosts[0]
