"""memory_plan.py: the memory check's decisions, facts in and decision out (as pyinfra tests its
operations): what each node gives the server, what later servers keep, the fraction chosen or
refused. memory-check.sh runs them end to end in test_hardware_scripts.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.program.scripting import load

plan = load("memory_plan")

GIB = 1 << 30
MARGIN, MIN_MARGIN = 0.05, GIB  # the plan's AUTO_MARGIN_FRACTION and AUTO_MIN_MARGIN_BYTES


def probe(free_gib: float, total_gib: float = 100, own_gib: float = 0) -> Any:
    return plan.Probe(total_gib * GIB, free_gib * GIB, own_gib * GIB, "meminfo", 0, 0)


def kept(fraction: float = 0.0, autos: int = 0, who: str = "") -> Any:
    return plan.Kept(fraction, autos, [who] if who else [])


@pytest.mark.parametrize(
    ("memory", "given_back", "later", "min_margin", "visible", "fits", "auto", "reserved"),
    [
        # 40 GiB free of 100: 0.40 fits, `auto` leaves the margin (5 GiB): 0.35.
        (probe(40), 0.0, kept(), MIN_MARGIN, 40, 0.40, 0.35, 0),
        # Our server runs here at 0.5: a restart gives its 50 GiB back.
        (probe(40, own_gib=1), 0.5, kept(), MIN_MARGIN, 90, 0.90, 0.85, 0),
        # Not here (another node in its --expect-ips): only what our cgroups hold comes back.
        (probe(40, own_gib=1), 0.0, kept(), MIN_MARGIN, 41, 0.41, 0.36, 0),
        # Our cgroups hold more than the server asked for: the larger comes back.
        (probe(40, own_gib=30), 0.1, kept(), MIN_MARGIN, 70, 0.70, 0.65, 0),
        # Never more than the node has.
        (probe(80), 0.5, kept(), MIN_MARGIN, 100, 1.0, 0.95, 0),
        # On a small node the least margin in bytes outweighs the fraction (8 GiB, not 5).
        (probe(40), 0.0, kept(), 8 * GIB, 40, 0.40, 0.32, 0),
        # A later fixed 0.2 (and the 0.05 beside it) keeps 25 GiB: 0.15 fits, auto 0.10.
        (probe(40), 0.0, kept(0.25, who="chat-b"), MIN_MARGIN, 40, 0.15, 0.10, 25),
        # A later fixed 0.1 (0.15 kept) and a later `auto` (its 0.05 beside it): this server
        # and the later `auto` split the 15 GiB left past the margin: 0.07 each; the later
        # `auto` counts at its least share (0.05) in what fits.
        (probe(40), 0.0, kept(0.2, autos=1), MIN_MARGIN, 40, 0.15, 0.07, 25),
        # Less than the later servers keep: 0, never a negative fraction.
        (probe(40), 0.0, kept(0.5), MIN_MARGIN, 40, 0.0, 0.0, 50),
    ],
)
def test_each_node_gives_the_server_what_is_free_and_what_ours_gives_back(
    memory: Any,
    given_back: float,
    later: Any,
    min_margin: int,
    visible: int,
    fits: float,
    auto: float,
    reserved: int,
) -> None:
    row = plan.node_row("spark1", memory, given_back, MARGIN, min_margin, later, 0.05)
    assert (row.visible, row.fits, row.auto, row.reserved) == (
        visible * GIB,
        fits,
        auto,
        reserved * GIB,
    )


def row(name: str, free_gib: float, later: Any = None, given_back: float = 0.0) -> Any:
    later = later or kept()
    return plan.node_row(name, probe(free_gib), given_back, MARGIN, MIN_MARGIN, later, 0.05)


@pytest.mark.parametrize(
    ("rows", "utilization", "running", "chosen", "mode", "kept_running"),
    [
        # auto: the highest every node can give less its margin (the node with the least).
        ([row("spark1", 40), row("spark2", 60)], "auto", "0", "0.35", "auto", False),
        # auto with our server running at 0.5, which still fits (0.85 allowed): kept, so a
        # re-run does not replace the server for a hundredth.
        ([row("spark1", 40, given_back=0.5)], "auto", "0.5", "0.5", "auto", True),
        # A running fraction that no longer fits is not kept: auto's own.
        ([row("spark1", 40)], "auto", "0.5", "0.35", "auto", False),
        # A fixed fraction that fits every node is taken as written.
        ([row("spark1", 40), row("spark2", 60)], "0.4", "0", "0.4", "fixed", False),
        # auto at exactly the floor (0.05) still starts.
        ([row("spark1", 10)], "auto", "0", "0.05", "auto", False),
    ],
)
def test_the_fraction_is_the_configured_one_or_the_highest_auto_finds(
    rows: list[Any], utilization: str, running: str, chosen: str, mode: str, kept_running: bool
) -> None:
    assert plan.choose(rows, utilization, running) == plan.Choice(chosen, mode, kept_running)


@pytest.mark.parametrize(
    ("rows", "utilization", "problem"),
    [
        # A fixed fraction short on one node: that node named, and what would fit.
        (
            [row("spark1", 40), row("spark2", 60)],
            "0.5",
            "vllm.gpuMemoryUtilization 0.5 does not fit: spark1: 0.50 x 100.0 GiB = 50.0 GiB "
            "asked, 40.0 GiB free (meminfo); the highest value that fits every node is 0.40 "
            "(auto would choose 0.35, with its safety margin)",
        ),
        # Short beside a later server: what is kept, and for whom.
        (
            [row("spark1", 40, kept(0.15, who="chat-b (0.1, not running yet)"))],
            "0.3",
            "vllm.gpuMemoryUtilization 0.3 does not fit: spark1: 0.30 x 100.0 GiB = 30.0 GiB "
            "asked, 40.0 GiB free (meminfo), 15.0 GiB kept for chat-b (0.1, not running yet); "
            "the highest value that fits every node is 0.25 (auto would choose 0.20, with its "
            "safety margin)",
        ),
        # auto below the floor: every node's memory and margin named.
        (
            [row("spark1", 9), row("spark2", 60)],
            "auto",
            "vllm.gpuMemoryUtilization auto: too little memory free for the server: spark1: 9.0 "
            "GiB free of 100.0 GiB (margin 5.0 GiB); spark2: 60.0 GiB free of 100.0 GiB (margin "
            "5.0 GiB)",
        ),
    ],
)
def test_memory_short_of_the_fraction_is_refused_naming_each_node(
    rows: list[Any], utilization: str, problem: str
) -> None:
    with pytest.raises(plan.StepFailed) as refused:
        plan.choose(rows, utilization, "0")
    assert refused.value.what == problem
    assert refused.value.cause.startswith("other processes or containers hold the memory")


SHARES = "spark-vllm-shares 0.05 0.05\n"


def share(name: str, container: str, value: str, hosts: str) -> str:
    return f"{name}|{container}|-|{value}|{hosts}\n"


@pytest.mark.parametrize(
    ("lines", "later"),
    [
        # The servers after this one, each with only the nodes it shares with this check.
        (
            [share("a", "ours", "auto", "spark1"), share("b", "s1", "0.2", "spark1,spark9")],
            [("b", "s1", ("spark1",))],
        ),
        # One before this one started first: what it holds is not free, nothing is kept.
        ([share("z", "s3", "0.2", "spark1"), share("a", "ours", "auto", "spark1")], []),
        # One on other nodes only keeps nothing here.
        ([share("a", "ours", "auto", "spark1"), share("b", "s1", "0.2", "spark3")], []),
        # Shares that do not list this server (a stack going back to one model): nothing.
        ([share("b", "s1", "0.2", "spark1")], []),
    ],
)
def test_the_later_servers_are_those_after_this_one_on_its_nodes(
    lines: list[str], later: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    shares = plan.parse_shares(SHARES + "".join(lines), "shares")
    mine = [plan.Node("spark1", "10.0.0.1"), plan.Node("spark2", "10.0.0.2")]
    found = plan.later_servers(shares, mine, "ours")
    assert [(s.name, s.container, s.hosts) for s in found] == later


def test_shares_that_are_not_ours_are_refused_and_none_keep_nothing() -> None:
    with pytest.raises(plan.StepFailed, match=r"the fleet's memory shares \(f\) are not ours"):
        plan.parse_shares("edited by hand\n", "f")
    assert plan.parse_shares(None, "f") == plan.Shares()


RUNNING = 'running ["--expect-ips","10.0.0.1","--gpu-memory-utilization","{}"]'


@pytest.mark.parametrize(
    ("value", "inspect", "fraction", "waiting_auto", "how"),
    [
        # Not running yet: its fraction and the overhead beside it.
        ("0.2", "", 0.25, False, "not running yet"),
        # An `auto` one not running yet: only the overhead; it will split with this one.
        ("auto", "exited []", 0.05, True, "not running yet"),
        # Running at its fraction: it holds its memory already, nothing more is kept.
        ("0.2", RUNNING.format("0.2"), 0.0, False, "running at 0.2"),
        # Raised since it started (0.2 to 0.3): only the difference.
        ("0.3", RUNNING.format("0.2"), 0.1, False, "running at 0.2"),
        # Lowered since: nothing, never a negative keep.
        ("0.1", RUNNING.format("0.2"), 0.0, False, "running at 0.2"),
        # A running `auto` one holds its own and shares nothing.
        ("auto", RUNNING.format("0.3"), 0.0, False, "running at 0.3"),
        # Running without the flag (another release's server): the whole fraction, `?` said.
        ("0.2", "running []", 0.2, False, "running at ?"),
    ],
)
def test_a_later_server_keeps_its_share_unless_it_holds_it_already(
    value: str, inspect: str, fraction: float, waiting_auto: bool, how: str
) -> None:
    server = plan.Share("b", "s1", "-", value, ("spark1",))
    keep = plan.keep_for_later(server, plan.seen(inspect), 0.05)
    assert keep == plan.Keep(fraction, waiting_auto, how)


def test_what_several_later_servers_keep_adds_up_per_node() -> None:
    b = plan.Share("b", "s1", "-", "0.2", ("spark1", "spark2"))
    c = plan.Share("c", "s2", "-", "auto", ("spark1",))
    per_node = plan.kept_per_node(
        [(b, plan.Keep(0.25, False, "not running yet")), (c, plan.Keep(0.05, True, "n"))]
    )
    assert per_node["spark1"] == plan.Kept(0.3, 1, ["b (0.2, not running yet)", "c (auto, n)"])
    assert per_node["spark2"] == plan.Kept(0.25, 0, ["b (0.2, not running yet)"])


def test_the_decision_from_the_facts_memory_check_sh_hands_over(tmp_path: Any) -> None:
    """The facts as memory-check.sh writes them on stdin: our server running at 0.5 on spark1,
    a later server not running yet; the sizing line as the program reads it."""
    (tmp_path / "shares").write_text(
        SHARES + share("a", "ours", "auto", "spark1,spark2") + share("b", "s1", "0.1", "spark2")
    )
    flags = {
        "nodes": "spark1|-|/b|ours|10.0.0.1\nspark2|ssh://w|/b|ours|10.0.0.2",
        "server_container": "ours", "shares": str(tmp_path / "shares"), "utilization": "auto",
        "margin_fraction": "0.05", "min_margin_bytes": str(GIB),
    }  # fmt: skip
    facts = plan.parse_facts(
        f"server {RUNNING.format('0.5')}\nlater s1 \n"
        f"probe spark1 {100 * GIB} {40 * GIB} 0 cuda 1 2\n"
        f"probe spark2 {100 * GIB} {80 * GIB} 0 meminfo 1 2\n"
    )
    assert plan.decide(flags, facts) == (
        'spark-vllm-memory-sizing {"gpuMemoryUtilization":"0.5","mode":"auto","kept":true,'
        '"nodes":{"spark1":{"totalGib":100.0,"freeGib":90.0,"fits":0.90,"basis":"cuda"},'
        '"spark2":{"totalGib":100.0,"freeGib":80.0,"fits":0.65,"basis":"meminfo"}}}'
    )


def test_the_kv_cache_is_sized_from_the_node_with_the_least() -> None:
    rows = [row("spark1", 40), plan.node_row("spark2", probe(40, 50), 0, MARGIN, GIB, kept(), 0)]
    assert plan.kv_budget(rows, "0.4") == 20 * GIB


def test_a_refusal_goes_to_memory_check_sh_as_problem_and_cause(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "shares").write_text("edited by hand\n")
    argv = ["later", "--nodes", "spark1|-|/b|ours|10.0.0.1", "--server-container", "ours",
            "--shares", str(tmp_path / "shares")]  # fmt: skip
    assert plan.main(argv) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"problem: the fleet's memory shares ({tmp_path / 'shares'}) are not ours",
        "cause: the file was changed by hand; run pulumi up again",
    ]
