"""Every resource's name, spelled once: the spec builders, the graph (stacks/plan/graph.py) and
the components all take names from here.

A name is part of its resource's URN: renaming one is a new resource to the engine (an alias
keeps the old identity: graph.py `MovedFrom`). Slot 0's names are those of a stack of one model;
slot k's components are `<component>-s<k>` (stacks/fleet.py ServerSlot.named), and an entry's
own image's `image-i<8 hex>` (stacks/plan/image.py ImageStream.named).
"""

from __future__ import annotations

from stacks.fleet import ServerSlot

# The components, by the name their resources are registered under (part of every child's URN).
# A host's component is named after the host.
FABRIC, IMAGE, WEIGHTS, MEMORY = "fabric", "image", "weights", "memory"
FIREWALL, FRONT, COMPILE_CACHE, RAY, VLLM = "firewall", "front", "compile-cache", "ray", "vllm"
MONITORING = "monitoring"
MEMORY_GUARD = "memory-guard"
# The stack instance (stacks/plan/instance.py), and the local Command that drew its token.
INSTANCE = "instance"
INSTANCE_TOKEN = f"{INSTANCE}-token"


# A server's components (slot 0's keep the names of a stack of one model).
def weights_of(slot: ServerSlot) -> str:
    return slot.named(WEIGHTS)


def memory_of(slot: ServerSlot) -> str:
    return slot.named(MEMORY)


def vllm_of(slot: ServerSlot) -> str:
    return slot.named(VLLM)


# A host's resources.
def scripts_of(node: str) -> str:
    return f"{node}-scripts"


def mounts_of(node: str) -> str:
    """The receipt of the host directories containers bind (a recreated one replaces them)."""
    return f"{node}-mounts"


def preflight_of(node: str) -> str:
    return f"{node}-preflight"


def shares_of(node: str) -> str:
    """The head's step writing the fleet's memory shares (stacks/plan/hosts.py)."""
    return f"{node}-shares"


def docker_of(node: str) -> str:
    """The host's Docker provider."""
    return f"{node}-docker"


# The fabric's.
FABRIC_HEAD_KEY = f"{FABRIC}-head-key"


def authorize_of(worker: str) -> str:
    return f"{FABRIC}-{worker}-authorize"


def pin_of(worker: str) -> str:
    return f"{FABRIC}-{worker}-pin"


def link_of(worker: str) -> str:
    """The head's link test to `worker` (its stdout: the figures, hardware.parse_fabric_link)."""
    return f"{FABRIC}-{worker}-link"


# An image's (`component`: IMAGE, or an entry's own image's).
def image_pull_of(component: str) -> str:
    return f"{component}-pull"


def image_record_of(component: str) -> str:
    return f"{component}-head-record"


def image_sync_of(component: str, worker: str) -> str:
    return f"{component}-{worker}-sync"


def image_facts_of(node: str, component: str = IMAGE) -> str:
    """The image's check on `node` (its stdout: what the image carries)."""
    return f"{component}-{node}-facts"


def retained_on(node: str, component: str = IMAGE) -> str:
    """`node`'s image history step (its stdout: the images it keeps, image.parse_retained)."""
    return f"{component}-{node}-retain"


# A server's weights, memory check and server (`component`: its slot's).
def fetch_of(component: str) -> str:
    return f"{component}-fetch"


def weights_copy_of(component: str, worker: str) -> str:
    return f"{component}-{worker}-copy"


def check_of(component: str) -> str:
    return f"{component}-check"


def server_key_of(component: str) -> str:
    """The API key file where a server on a worker runs."""
    return f"{component}-api-key"


def headless_of(component: str, worker: str) -> str:
    return f"{component}-{worker}"


def container_of(component: str) -> str:
    return f"{component}-container"


def ready_of(component: str) -> str:
    return f"{component}-ready"


def benchmark_of(component: str) -> str:
    return f"{component}-benchmark"


# Each node's firewall and compile cache.
def guard_of(node: str) -> str:
    return f"{FIREWALL}-{node}-guard"


def rules_of(node: str) -> str:
    """The step that waits until the guard's rules hold on `node`."""
    return f"{FIREWALL}-{node}"


def compile_cache_of(node: str) -> str:
    return f"{COMPILE_CACHE}-{node}"


# The front's.
FRONT_KEY_FILE = f"{FRONT}-api-key"
FRONT_KEYS = f"{FRONT}-keys"  # the named keys' map (`keys`)
FRONT_TLS = f"{FRONT}-tls"  # the front's certificate and key (front.tls)
FRONT_CONFIG = f"{FRONT}-config"
FRONT_PULL = f"{FRONT}-pull"
FRONT_CONTAINER = f"{FRONT}-container"
FRONT_RELOAD = f"{FRONT}-reload"

# Ray's.
RAY_HEAD, RAY_JOINED = f"{RAY}-head", f"{RAY}-joined"


def ray_worker_of(node: str) -> str:
    return f"{RAY}-{node}"


# Monitoring's.
PROMETHEUS, GRAFANA = f"{MONITORING}-prometheus", f"{MONITORING}-grafana"
MONITORING_FILES = f"{MONITORING}-files"
MONITORING_DATA = f"{MONITORING}-data"
MONITORING_RAY_TARGETS = f"{MONITORING}-ray-targets"
MONITORING_READY = f"{MONITORING}-ready"
GRAFANA_PASSWORD = f"{GRAFANA}-password"


def memory_guard_of(node: str) -> str:
    return f"{MEMORY_GUARD}-{node}"


def docker_filter_of(node: str) -> str:
    """The memory guard's filtered Docker socket on `node` (its component's)."""
    return f"{MEMORY_GUARD}-docker-filter-{node}"


def node_exporter_of(node: str) -> str:
    return f"{MONITORING}-node-exporter-{node}"


def pull_of(container: str) -> str:
    """A monitoring container's image pull."""
    return f"{container}-pull"
