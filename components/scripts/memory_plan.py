"""The memory check's decisions, apart from the facts (memory-check.sh reads them on the nodes,
then runs this): the memory the server will find on each node (what this deployment's own
server holds counted as given back), what the servers after this one in the fleet's order keep
free, and the fraction: the configured one if it fits every node, or with `auto` the highest
every node can give less the safety margin. Facts in, decision out, so they are table-tested
(tests/program/test_memory_plan.py). Standard library only: it runs with the head's own python3.

    memory_plan.py later --nodes LINES --server-container NAME --shares FILE
        prints `container|dest` for each later server to inspect.
    memory_plan.py decide --nodes LINES --server-container NAME --shares FILE --utilization F|auto
        --margin-fraction F --min-margin-bytes N [--kv-cache auto|BYTES --snapshot DIR
        --tensor-parallel N --pipeline-parallel N --max-model-len N --kv-cache-dtype D
        --reserve-bytes N [--block-size N] [--load-format F] [--include JSON] [--exclude JSON]]
        reads the facts on stdin, a line each: `server INSPECT`, `later CONTAINER INSPECT`,
        `probe NODE TOTAL FREE OWN BASIS MEMFREE MEMAVAILABLE` (INSPECT: `STATUS [ARGS JSON]` as
        `docker inspect` says it, empty when it did not answer); notes on stderr, then
        `spark-vllm-memory-sizing {json}` on stdout.

A refusal is `problem: ...` and `cause: ...` on stdout and exit status 1: memory-check.sh fails
the step with them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import kv_sizing
import weights_filter
from hostlib import BUG, StepFailed, note, parse_flags, require

GIB = 1073741824
# Below this, `auto` leaves too little to be worth starting a server.
AUTO_FLOOR = 0.05


def fraction(value: float) -> float:
    """A fraction kept to 4 decimals, so that float noise in a sum (0.2 + 0.05) cannot cost a
    hundredth when the result is truncated to two."""
    return float(f"{value:.4f}")


def gib(value: float) -> str:
    return f"{value / GIB:.1f}"


# -- facts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """A server's container as `docker inspect` shows it: running or not, with its arguments."""

    running: bool = False
    args: tuple[str, ...] = ()

    def arg(self, flag: str) -> str:
        """The value after `flag` in its arguments ("" without it)."""
        for at, word in enumerate(self.args[:-1]):
            if word == flag:
                return self.args[at + 1]
        return ""


def seen(inspect: str) -> Seen:
    """`running ["--flag","value",...]` (docker inspect's status and JSON arguments)."""
    status, _, args = inspect.strip().partition(" ")
    if status != "running":
        return Seen()
    try:
        parsed = json.loads(args) if args else []
    except ValueError:
        parsed = []
    words = tuple(str(w) for w in parsed) if isinstance(parsed, list) else ()
    return Seen(running=True, args=words)


@dataclass(frozen=True)
class Probe:
    """One node's memory (memory-probe.sh, bytes): total, free for the server, what our own
    containers' cgroups hold, where free was read (`cuda` or `meminfo`), and the kernel's view."""

    total: float
    free: float
    own: float
    basis: str
    mem_free: float
    mem_available: float


def probe(fields: list[str]) -> Probe:
    total, free, own, basis, mem_free, mem_available = (fields + [""] * 6)[:6]
    number = [float(x or 0) for x in (total, free, own, mem_free, mem_available)]
    return Probe(number[0], number[1], number[2], basis, number[3], number[4])


@dataclass(frozen=True)
class Node:
    """A node of this check (memory-check.sh --nodes: `name|dest|bin|containers|fabricip`)."""

    name: str
    fabric_ip: str


def nodes(text: str) -> list[Node]:
    found = []
    for line in text.splitlines():
        name, _, _, _, fabric_ip = (line.split("|", 4) + [""] * 5)[:5]
        if name:
            found.append(Node(name, fabric_ip))
    return found


# -- the fleet's shares --------------------------------------------------------------------------


SHARES_HEADER = "spark-vllm-shares"


@dataclass(frozen=True)
class Share:
    """A server of the fleet's shares file: `servedName|container|dest|share|host,...`."""

    name: str
    container: str
    dest: str
    share: str  # its gpuMemoryUtilization: a fraction or `auto`
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class Shares:
    overhead: float = 0.0  # what a server takes beside its fraction
    min_auto: float = 0.0  # the least share of an `auto` server
    servers: tuple[Share, ...] = ()


def parse_shares(text: str | None, path: str) -> Shares:
    """The shares file (none: a single server, nothing kept for others)."""
    if text is None:
        return Shares()
    lines = text.splitlines()
    header = (lines[0].split() if lines else []) + ["", "", ""]
    if header[0] != SHARES_HEADER:
        raise StepFailed(
            f"the fleet's memory shares ({path}) are not ours",
            "the file was changed by hand; run pulumi up again",
        )
    servers = []
    for line in lines[1:]:
        name, container, dest, share, hosts = (line.split("|", 4) + [""] * 5)[:5]
        servers.append(Share(name, container, dest, share, tuple(hosts.replace(",", " ").split())))
    return Shares(float(header[1] or 0), float(header[2] or 0), tuple(servers))


def later_servers(shares: Shares, mine: list[Node], container: str) -> list[Share]:
    """The servers after this one (`container`) in the fleet's order, each with only the nodes
    it shares with this check; none when the shares do not list this server."""
    names = {node.name for node in mine}
    found, later = False, []
    for server in shares.servers:
        if server.container == container:
            found = True
            continue
        shared = tuple(host for host in server.hosts if host in names)
        if found and shared:
            later.append(Share(server.name, server.container, server.dest, server.share, shared))
    return later


@dataclass(frozen=True)
class Keep:
    """What a later server keeps free on the nodes it shares with this one."""

    fraction: float  # of each node's total
    waiting_auto: bool  # an `auto` server not running yet: it splits what is left with this one
    how: str  # for the messages


def keep_for_later(server: Share, now: Seen, overhead: float) -> Keep:
    """One that runs holds its memory already: a fixed fraction raised since keeps the difference.
    One not running yet keeps its fraction (an `auto` one: none of its own) and its overhead."""
    auto = server.share == "auto"
    if now.running:
        running = now.arg("--gpu-memory-utilization")
        rise = 0.0 if auto else float(server.share) - float(running or 0)
        return Keep(fraction(max(rise, 0.0)), False, f"running at {running or '?'}")
    own = 0.0 if auto else float(server.share)
    return Keep(fraction(own + overhead), auto, "not running yet")


@dataclass
class Kept:
    """What the later servers keep on one node: a fraction of its total, how many `auto` ones
    share with this server, and who (for the messages)."""

    fraction: float = 0.0
    autos: int = 0
    who: list[str] = field(default_factory=list)


def kept_per_node(later: list[tuple[Share, Keep]]) -> dict[str, Kept]:
    kept: dict[str, Kept] = {}
    for server, keep in later:
        for host in server.hosts:
            node = kept.setdefault(host, Kept())
            node.fraction = fraction(node.fraction + keep.fraction)
            node.autos += 1 if keep.waiting_auto else 0
            node.who.append(f"{server.name} ({server.share}, {keep.how})")
    return kept


# -- each node -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One node's figures (bytes, whole): what the server finds there once ours is given back
    (`visible`), the highest fraction that fits beside the later servers (`fits`, the later
    `auto` ones at their least share), what `auto` takes there (`auto`, split with the later
    `auto` ones, past the margin), and the bytes reserved for the later servers."""

    name: str
    total: float
    visible: float
    fits: float
    auto: float
    basis: str
    margin: float
    reserved: float
    kept_for: str


def hundredths(value: float) -> float:
    """Truncated to a hundredth (toward zero), never below 0."""
    return max(int(value * 100) / 100, 0.0)


def node_row(
    name: str,
    memory: Probe,
    given_back: float,
    margin_fraction: float,
    min_margin_bytes: float,
    kept: Kept,
    min_auto: float,
) -> Row:
    """`given_back`: the fraction our running server asked for, when it runs on this node; at
    least what our containers' cgroups hold comes back (GPU allocations may not be charged)."""
    total = memory.total
    visible = min(memory.free + max(given_back * total, memory.own), total)
    margin = max(margin_fraction * total, min_margin_bytes)
    kept_bytes = kept.fraction * total
    least_autos = kept.autos * min_auto * total
    return Row(
        name=name,
        total=float(round(total)),
        visible=float(round(visible)),
        fits=hundredths((visible - kept_bytes - least_autos) / total),
        auto=hundredths((visible - margin - kept_bytes) / (1 + kept.autos) / total),
        basis=memory.basis,
        margin=float(round(margin)),
        reserved=float(round(kept_bytes + least_autos)),
        kept_for=", ".join(kept.who),
    )


def kept_suffix(row: Row) -> str:
    return f", {gib(row.reserved)} GiB kept for {row.kept_for}" if row.kept_for else ""


# -- the fraction --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    utilization: str  # as the server is given it
    mode: str  # auto | fixed
    kept: bool  # `auto` kept the running server's fraction


def choose(rows: list[Row], utilization: str, running: str) -> Choice:
    """The fraction for `utilization` (`auto` or a fixed one) on these nodes, or StepFailed
    naming each node short of memory. `running`: the running server's fraction ("0": none)."""
    auto = min((row.auto for row in rows), default=0.0)
    if utilization == "auto":
        choice = Choice(f"{auto:.2f}", "auto", False)
        # A running server whose fraction still fits keeps it: a re-run of this check (a changed
        # connection, a new image) must not resize, and so replace, a server for a hundredth.
        if 0 < float(running) <= auto:
            choice = Choice(running, "auto", True)
        if auto < AUTO_FLOOR:
            problems = "; ".join(
                f"{row.name}: {gib(row.visible)} GiB free of {gib(row.total)} GiB (margin "
                f"{gib(row.margin)} GiB{kept_suffix(row)})"
                for row in rows
            )
            raise StepFailed(
                f"vllm.gpuMemoryUtilization auto: too little memory free for the server: "
                f"{problems}",
                "other processes or containers hold the memory (an embeddings server, a stale "
                "vLLM?), or the page cache (set preflight.dropPageCache: true)",
            )
        return choice
    asked = float(utilization)
    short = [row for row in rows if asked * row.total + row.reserved > row.visible]
    if short:
        problems = "; ".join(
            f"{row.name}: {asked:.2f} x {gib(row.total)} GiB = {gib(asked * row.total)} GiB "
            f"asked, {gib(row.visible)} GiB free ({row.basis}){kept_suffix(row)}"
            for row in short
        )
        fits = min(row.fits for row in rows)
        raise StepFailed(
            f"vllm.gpuMemoryUtilization {utilization} does not fit: {problems}; the highest value "
            f"that fits every node is {fits:.2f} (auto would choose {auto:.2f}, with its safety "
            "margin)",
            "other processes or containers hold the memory, or the page cache "
            "(preflight.dropPageCache: true); lower vllm.gpuMemoryUtilization or set it to auto",
        )
    return Choice(utilization, "fixed", False)


def kv_budget(rows: list[Row], utilization: str) -> int:
    """The server's bytes on the node with the least: what the KV cache is sized from."""
    return round(min(float(utilization) * row.total for row in rows))


def sizing_line(choice: Choice, rows: list[Row], kv_cache: dict[str, object] | None) -> str:
    """`spark-vllm-memory-sizing {json}`, the fractions as the server is given them."""
    per_node = ",".join(
        f'{json.dumps(row.name)}:{{"totalGib":{row.total / GIB:.1f},"freeGib":'
        f'{row.visible / GIB:.1f},"fits":{row.fits:.2f},"basis":{json.dumps(row.basis)}}}'
        for row in rows
    )
    kv = f',"kvCache":{json.dumps(kv_cache, separators=(",", ":"))}' if kv_cache else ""
    return (
        f'spark-vllm-memory-sizing {{"gpuMemoryUtilization":"{choice.utilization}","mode":'
        f'"{choice.mode}","kept":{"true" if choice.kept else "false"},"nodes":{{{per_node}}}{kv}}}'
    )


# -- the command line ----------------------------------------------------------------------------


@dataclass
class Facts:
    """What memory-check.sh read: our server's container, each later server's, each node's
    memory."""

    server: Seen = field(default_factory=Seen)
    later: dict[str, Seen] = field(default_factory=dict)  # container -> what it is
    probes: dict[str, Probe] = field(default_factory=dict)  # node -> its memory


def parse_facts(text: str) -> Facts:
    facts = Facts()
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "server":
            facts.server = seen(rest)
        elif kind == "later":
            container, _, inspect = rest.partition(" ")
            facts.later[container] = seen(inspect)
        elif kind == "probe":
            name, *fields = rest.split()
            facts.probes[name] = probe(fields)
    return facts


def read_shares(path: str) -> Shares:
    try:
        text: str | None = Path(path).read_text()
    except OSError:
        text = None
    return parse_shares(text, path)


def later_of(flags: dict[str, str]) -> list[Share]:
    shares = read_shares(flags["shares"])
    return later_servers(shares, nodes(flags["nodes"]), flags["server_container"])


def decide(flags: dict[str, str], facts: Facts) -> str:
    """The notes on stderr, then the sizing line (returned)."""
    shares = read_shares(flags["shares"])
    later = later_servers(shares, nodes(flags["nodes"]), flags["server_container"])
    keeps = []
    for server in later:
        keep = keep_for_later(server, facts.later.get(server.container, Seen()), shares.overhead)
        keeps.append((server, keep))
        note(
            f"memory: {server.name} ({server.share}) comes after this server on "
            f"{', '.join(server.hosts)}: {keep.how}"
        )
    kept = kept_per_node(keeps)
    # Our server, when it runs, gives back what it asked for on the nodes it runs on.
    running = facts.server.arg("--gpu-memory-utilization") or "0"
    running_ips = facts.server.arg("--expect-ips").split(",")
    rows = []
    for node in nodes(flags["nodes"]):
        memory = facts.probes[node.name]
        given_back = float(running) if node.fabric_ip in running_ips else 0.0
        rows.append(
            node_row(
                node.name,
                memory,
                given_back,
                float(flags["margin_fraction"]),
                float(flags["min_margin_bytes"]),
                kept.get(node.name, Kept()),
                shares.min_auto,
            )
        )
        note(
            f"memory on {node.name}: {gib(memory.free)} GiB free of {gib(memory.total)} GiB "
            f"({memory.basis}; MemFree {gib(memory.mem_free)} GiB, MemAvailable "
            f"{gib(memory.mem_available)} GiB)"
        )
    choice = choose(rows, flags["utilization"], running)
    if choice.kept:
        auto = min(row.auto for row in rows)
        note(
            f"memory: the running server's {running} still fits every node (auto allows "
            f"{auto:.2f}): kept"
        )
    kv_cache = None
    if flags.get("kv_cache"):
        try:
            kv_cache = kv_sizing.size_snapshot(
                snapshot=Path(flags["snapshot"]),
                budget_bytes=kv_budget(rows, choice.utilization),
                reserve_bytes=int(flags["reserve_bytes"]),
                requested=flags["kv_cache"],
                tensor_parallel=int(flags["tensor_parallel"]),
                pipeline_parallel=int(flags["pipeline_parallel"]),
                max_model_len=int(flags["max_model_len"]),
                kv_cache_dtype=flags["kv_cache_dtype"],
                block_size=block_size_of(flags),
                load_format=flags.get("load_format") or "auto",
                kept=kept_by(flags),
            )
        except kv_sizing.Refused as refused:
            raise StepFailed(refused.problem, refused.cause) from refused
        note(kv_sizing.summary(kv_cache))
    return sizing_line(choice, rows, kv_cache)


def block_size_of(flags: dict[str, str]) -> int:
    """The KV cache's block size: extraArgs' --block-size or the image's default (the plan's)."""
    given = flags.get("block_size") or str(kv_sizing.DEFAULT_BLOCK_SIZE)
    if not given.isdigit() or int(given) < 1:
        raise StepFailed(
            f"vllm.extraArgs: --block-size {given} is not a whole number of tokens",
            "write it as vLLM takes it (e.g. --block-size 64), or leave it to the image",
        )
    return int(given)


def kept_by(flags: dict[str, str]) -> Callable[[str], bool]:
    """The model's include/exclude (JSON lists, as the weights steps take them): what the
    workers hold of the snapshot."""
    try:
        include = weights_filter.patterns(flags.get("include", ""))
        exclude = weights_filter.patterns(flags.get("exclude", ""))
    except ValueError as exc:
        raise StepFailed(f"the model's patterns cannot be read: {exc}", BUG) from exc
    return lambda name: weights_filter.kept(name, include, exclude)


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    try:
        flags = parse_flags(argv[1:])
        require(flags, "nodes", "server-container", "shares")
        if command == "later":
            for server in later_of(flags):
                print(f"{server.container}|{server.dest}")
        elif command == "decide":
            require(flags, "utilization", "margin-fraction", "min-margin-bytes")
            print(decide(flags, parse_facts(sys.stdin.read())))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except StepFailed as failure:
        print(f"problem: {failure.what}")
        print(f"cause: {failure.cause}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
