"""copy_relay.py, the relay: its call taken apart by the workers' own relay.sh, the agent's
limits, and the one skeleton both payloads run, with a payload of its own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.program.scripting import FAKE_SSH, SCRIPTS, load, watch

pump = load("copy_pump")

transport = load("copy_transport")
relay = load("copy_relay")


# --- the relay chain -----------------------------------------------------------------------------


@pytest.mark.parametrize("down", ["", "ssh://u@10.0.0.4:22"], ids=["whole", "last-hop-down"])
def test_a_relay_chain_stores_the_same_bytes_on_every_worker(tmp_path: Path, down: str) -> None:
    """The engine's stream to the first member's relay.sh passes worker to worker (the fake ssh
    runs each hop here): each stores it with the sink and reports its status, passed back up
    the chain. The members' scripts live in a directory with a space and a quote (one quoting
    level per hop); a hop that fails leaves the workers before it their copy."""
    bin_dir = tmp_path / "it's bin"
    shutil.copytree(SCRIPTS, bin_dir)
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "ssh").write_text(FAKE_SSH)
    (fake / "ssh").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    payload = tmp_path / "payload"
    payload.write_bytes(os.urandom(3 * 1024 * 1024))
    members = [relay.Member(name, dest, str(bin_dir)) for name, dest in
               (("spark2", "ssh://u@10.0.0.2:22"), ("spark3", "ssh://u@10.0.0.3:22"),
                ("spark4", "ssh://u@10.0.0.4:22"))]  # fmt: skip
    fabric = transport.Fabric()
    call = relay.relay_call(
        'cat > "$RELAY_OUT/stored.$$"', members, "known hosts", "ssh-ed25519 AAAA"
    )
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "RELAY_OUT": str(out),
           "DOWN": down}  # fmt: skip
    try:
        sink = transport.ssh_sink(fabric, members[0].destination, call, forward=True)
        outcome = pump.transfer(f"cat {payload}", sink, watch(stall=10), 3 * 1024 * 1024, env)
    finally:
        fabric.close()
    assert outcome.status == 0, outcome
    statuses = {m.name: relay.relayed_status(outcome.output, m.name) for m in members}
    assert statuses == {"spark2": "0", "spark3": "0", "spark4": "none" if down else "0"}
    stored = sorted(out.iterdir())
    assert len(stored) == (2 if down else 3)
    assert all(path.read_bytes() == payload.read_bytes() for path in stored)


def test_the_agent_signs_only_for_the_chains_hops() -> None:
    chain = [relay.Member("spark2", "ssh://root@10.0.0.2:22", "/b"),
             relay.Member("spark3", "ssh://root@10.0.0.3:2222", "/b")]  # fmt: skip
    assert relay.relay_limits(chain) == ["-h", "root@10.0.0.2", "-h", "10.0.0.2>root@10.0.0.3"]


# --- the skeleton both payloads run --------------------------------------------------------------


class Payload:
    """A payload of the test's own: each member's fact given (`raises`: its probe fails), a
    stream for the members that lack it when there are two of them, and the members it reached."""

    what = "weights"
    missed, left = "did not take the chain's blobs", "its own step sends what it lacks"
    fabric = None  # the stream is the test's own (run_chain below): nothing reaches a worker

    def __init__(self, facts: dict[str, str], served: set[str]) -> None:
        self.facts, self.served = facts, served

    def watch(self, label: str) -> Any:
        return watch()

    def chain_fact(self, member: Any) -> str:
        if self.facts[member.name] == "raises":
            raise OSError("no route to host")
        return self.facts[member.name]

    def chain_stream(self, chain: list[Any], facts: list[str]) -> Any:
        members = [m for m, fact in zip(chain, facts, strict=True) if fact == "lacks"]
        if len(members) < 2:
            return None
        return relay.Stream(members=members, source="true", sink="cat", zstd=False, size=10,
                            announcement=f"relaying it to {relay.member_names(members)}",
                            subject="it")  # fmt: skip

    def arrived(self, member: Any, outcome: Any) -> bool:
        return member.name in self.served


@pytest.mark.parametrize(
    ("facts", "served", "expected", "notes"),
    [
        # Those that lack it get the stream; one that has it is no member.
        ({"spark2": "lacks", "spark3": "lacks", "spark4": "has"}, {"spark2", "spark3"}, (10, 2),
         ["relaying it to spark2,spark3", "relayed it to 2 of 2 workers in 0s"]),
        # A member the stream missed is said, with what relay.sh reported for it.
        ({"spark2": "lacks", "spark3": "lacks", "spark4": "has"}, {"spark2"}, (10, 1),
         ["relaying it to spark2,spark3",
          "spark3 did not take the chain's blobs (relay status 1, stream exit 0): its own step "
          "sends what it lacks",
          "relayed it to 1 of 2 workers in 0s"]),
        # Unreachable, or a probe that failed: said, and no chain of one member.
        ({"spark2": "lacks", "spark3": "unreachable", "spark4": "raises"}, set(), (0, 0),
         ["spark3 cannot be reached over the fabric: its own step copies the weights",
          "spark4 cannot be reached over the fabric: its own step copies the weights"]),
    ],
    ids=["served", "one-missed", "too-few"],
)  # fmt: skip
def test_the_relay_streams_to_those_that_lack_it_and_says_whom_it_missed(
    facts: dict[str, str],
    served: set[str],
    expected: tuple[int, int],
    notes: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    said = "spark-vllm-relayed spark2 0\nspark-vllm-relayed spark3 1\n"
    monkeypatch.setattr(relay, "run_chain", lambda *_: pump.Outcome(0, 10, False, said))
    chain = [relay.Member(name, f"ssh://u@{name}:22", "/b") for name in facts]
    assert relay.relay(Payload(facts, served), chain) == expected
    assert capsys.readouterr().err.splitlines() == notes
