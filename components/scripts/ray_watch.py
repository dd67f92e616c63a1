"""Runs as a Ray container's main process (head and workers, executor ray): starts this node's
`ray start --block` and restarts it when the head's GCS has forgotten this node.

    ray_watch.py --gcs HEAD_IP:PORT --node-ip FABRIC_IP [--grace-seconds S]
                 [--interval-seconds S] [--check-seconds S] [--absent-checks N]
                 -- ray start --block ...

Why (issue 51): after the head's Ray restarts (its container, or a reboot of the head), a
worker's raylet can stay up without registering with the new GCS. `ray start --block` watches
only its own processes, so the container looks fine to Docker while the cluster lacks that
node's GPUs, and the next start of the server fails or is placed without them.

Every `--interval-seconds`, once this node's raylet has run for `--grace-seconds` (its time to
register), one check asks the head's GCS for its nodes (one GetAllNodeInfo call, bounded by
`--check-seconds`) and looks for an Alive node whose NodeManagerAddress is this node's fabric IP
(`--node-ip`, what `ray start --node-ip-address` registers). `decide` turns what each check saw
into what to do:

- listed and Alive: nothing;
- not listed (or only Dead) while the GCS answers, `--absent-checks` times in a row: stop this
  node's Ray (SIGKILL to its process group, as `ray stop --force` would, with nothing to drain
  since the GCS does not know the node) and exit 1, so that Docker's restart policy
  (on-failure) starts the container again and the node registers anew;
- the GCS does not answer: nothing. A raylet that cannot reach its GCS for
  `gcs_rpc_server_reconnect_timeout_s` (60 s by default: Ray's docs, "Ray system failure
  model"; the GCS client's server-unavailable callback in src/ray/gcs_rpc_client/rpc_client.h)
  ends itself, `ray start --block` then exits 1 and Docker restarts it (docs/design.md, "The
  Ray watch");
- this node's raylet is not running (`ray stop`, as ray_probe.py does on a host leaving the
  stack, ends it gracefully and `ray start --block` keeps waiting): nothing, so that a node
  stopped on purpose does not join again. (`ray stop` picks processes by name; this script's
  holds none it looks for: tests/standin/test_ray_watch.py.)

It prints one line when what it sees changes, and one when it acts. SIGTERM and SIGINT (docker
stop) go to `ray start`, as Docker's init passed them before (Ray 2.60 drains the node on
SIGTERM, node.py `_drain_node_before_shutdown`); what of this node's Ray outlives `ray start` is
then killed, and the exit code is `ray start`'s (128 + a signal's number). A watch that fails in
itself says so once and leaves Ray running: it never takes Ray down for its own fault.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Seen = Literal["alive", "absent", "unreachable", "no-raylet", "starting"]
RESTART_EXIT = 1  # non-zero: Docker's on-failure policy starts the container again
REAP_S = 10.0  # `ray start` after SIGKILL: it is gone at once, this only bounds the wait


@dataclass(frozen=True)
class Verdict:
    absent: int  # checks in a row that saw the GCS answer without this node
    restart: bool


def decide(seen: Seen, absent_before: int, absent_limit: int) -> Verdict:
    """What one check's result means, given how many checks before it in a row saw this node
    absent. Only absences the GCS itself reported count; any other result ends the run of them."""
    if seen == "absent":
        absent = absent_before + 1
        return Verdict(absent=absent, restart=absent >= absent_limit)
    return Verdict(absent=0, restart=False)


def say(message: str) -> None:
    print(f"spark-vllm ray-watch: {message}", file=sys.stderr, flush=True)


def parse_stat(stat: str) -> tuple[str, int]:
    """(command name, process group) from /proc/PID/stat: the name is between the first "(" and
    the last ")" (it may hold both); the group is the third field after it."""
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    return name, int(stat[stat.rindex(")") + 1 :].split()[2])


def raylet_running(group: int) -> bool:
    """A process named `raylet` runs in this node's Ray process group."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, process_group = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if name == "raylet" and process_group == group:
            return True
    return False


def port_open(gcs: str, timeout_s: float) -> bool:
    """The GCS's port accepts a connection: without one, the client would wait 40 s or more
    (its own connect and cluster-ID retries) to say so."""
    host, port = gcs.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


class Asked:
    """One question to the GCS, answered on its own thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.alive = False
        self.error: Exception | None = None


class GcsProbe:
    """One check at a time, each bounded: a call that outlives its check stays the one in
    flight (the next checks wait on it rather than stack up) and counts as no answer. Its
    thread is a daemon: a call still in flight never holds the watch's own exit."""

    def __init__(self, gcs: str, node_ip: str, check_s: float) -> None:
        # Only inside the Ray image; imported here, once (about 1 s), not inside a check.
        from ray._raylet import GcsClient
        from ray.core.generated.gcs_pb2 import GcsNodeInfo

        self.client, self.alive_state = GcsClient, GcsNodeInfo.ALIVE
        self.gcs, self.node_ip, self.check_s = gcs, node_ip, check_s
        self.pending: Asked | None = None
        self.why = ""  # why the last check had no answer

    def check(self) -> Seen:
        if self.pending is None:
            if not port_open(self.gcs, self.check_s):
                self.why = "its port refuses or does not answer"
                return "unreachable"
            self.pending = Asked()
            threading.Thread(target=self.ask, args=(self.pending,), daemon=True).start()
        if not self.pending.done.wait(self.check_s):
            self.why = f"no answer within {self.check_s:g}s"
            return "unreachable"
        asked, self.pending = self.pending, None
        if asked.error is not None:  # the GCS's own errors: RpcError, a timeout, a refusal
            self.why = f"{type(asked.error).__name__}: {asked.error}"
            return "unreachable"
        return "alive" if asked.alive else "absent"

    def ask(self, asked: Asked) -> None:
        try:
            asked.alive = self.listed_alive()
        except Exception as error:
            asked.error = error
        asked.done.set()

    def listed_alive(self) -> bool:
        """One GetAllNodeInfo call to the GCS: is an Alive node registered from this node's
        IP? A new client each time, so that a restarted GCS (a new cluster ID) is asked
        afresh (a client costs about 10 ms and leaves nothing behind)."""
        nodes = self.client(address=self.gcs).get_all_node_info(timeout=self.check_s)
        return any(
            info.node_manager_address == self.node_ip and info.state == self.alive_state
            for info in nodes.values()
        )


def describe(seen: Seen, node_ip: str, gcs: str, why: str) -> str:
    return {
        "alive": f"the head's GCS at {gcs} lists this node ({node_ip}) as alive",
        "absent": f"the head's GCS at {gcs} answers but lists no alive node at {node_ip}",
        "unreachable": f"the head's GCS at {gcs} did not answer ({why}): waiting, Ray's own "
        "limit (gcs_rpc_server_reconnect_timeout_s) ends a raylet whose GCS stays gone",
        "no-raylet": "this node's raylet is not running (Ray is starting, or was stopped on "
        "purpose, as `ray stop` does for a host leaving the stack): not watching until it runs",
        "starting": "this node's raylet started: watching once it has had time to register",
    }[seen]


class Watch:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        # Its own process group: everything of this node's Ray, and nothing else, even where
        # the container shares the host's PID namespace (the head's: HOST_PID_ROLES), where
        # `ray stop` would reach every Ray process of the host (another stack's too).
        self.ray = subprocess.Popen(args.command, start_new_session=True)
        self.probe: GcsProbe | None = None
        self.raylet_since: float | None = None  # when this raylet was first seen running
        self.signalled = False
        signal.signal(signal.SIGTERM, self._pass_on)
        signal.signal(signal.SIGINT, self._pass_on)

    def _pass_on(self, signum: int, _frame: object) -> None:
        self.signalled = True
        self.ray.send_signal(signum)

    def wait(self, seconds: float) -> int | None:
        """`ray start`'s exit code if it ends within `seconds`."""
        try:
            return self.ray.wait(timeout=max(seconds, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def kill_group(self) -> None:
        """SIGKILL to this node's Ray, `ray start` and what it started. After `ray start` has
        exited this kills what outlived it, as a container's end would (and outside one too)."""
        with contextlib.suppress(ProcessLookupError):  # the group is empty
            os.killpg(self.ray.pid, signal.SIGKILL)
        self.wait(REAP_S)

    def observe(self) -> Seen:
        if not raylet_running(self.ray.pid):
            self.raylet_since = None
            return "no-raylet"
        now = time.monotonic()
        if self.raylet_since is None:
            self.raylet_since = now
        if now - self.raylet_since < self.args.grace_seconds:
            return "starting"
        if self.probe is None:
            self.probe = GcsProbe(self.args.gcs, self.args.node_ip, self.args.check_seconds)
        return self.probe.check()

    def run(self) -> int:
        args = self.args
        absent, last = 0, None
        watching = True
        next_check = time.monotonic() + args.interval_seconds
        while True:
            code = self.wait(next_check - time.monotonic())
            if code is not None:
                self.kill_group()
                return 128 - code if code < 0 else code
            next_check = time.monotonic() + args.interval_seconds
            if self.signalled or not watching:
                continue
            try:
                seen = self.observe()
            except Exception as error:  # a fault of the watch itself never stops Ray
                say(f"the watch failed ({type(error).__name__}: {error}); Ray runs on unwatched")
                watching = False
                continue
            verdict = decide(seen, absent, args.absent_checks)
            if seen != last:
                why = self.probe.why if self.probe else ""
                say(describe(seen, args.node_ip, args.gcs, why))
                last = seen
            if verdict.restart:
                say(
                    f"the head's GCS at {args.gcs} answered {verdict.absent} checks in a row "
                    f"({args.interval_seconds:g}s apart) without this node ({args.node_ip}) "
                    "alive, while its raylet runs: stopping this node's Ray and exiting "
                    f"{RESTART_EXIT} so that Docker starts it again and it registers anew"
                )
                self.kill_group()
                return RESTART_EXIT
            absent = verdict.absent


def parse(argv: list[str]) -> argparse.Namespace:
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="ray_watch.py")
    parser.add_argument("--gcs", required=True)
    parser.add_argument("--node-ip", required=True)
    parser.add_argument("--grace-seconds", type=float, default=60.0)
    parser.add_argument("--interval-seconds", type=float, default=15.0)
    parser.add_argument("--check-seconds", type=float, default=10.0)
    parser.add_argument("--absent-checks", type=int, default=4)
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1 :]
    return args


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        say("ray_watch.py needs `-- ray start ...` (a bug in spark-vllm: please report it)")
        return 2
    return Watch(parse(argv)).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
