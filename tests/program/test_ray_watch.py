"""The Ray watch (issue 51): its decision as a table, the Ray containers that run it, and the
watch's own safety without Ray. Against a real Ray: tests/standin/test_ray_watch.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stacks.plan.containers import ContainerSpec, ray_container
from stacks.plan.server_plan import per_server
from tests.program.conftest import ConfigFactory
from tests.program.planning import SCRIPTS, plan_of

SCRIPT = Path(__file__).resolve().parents[2] / "components" / "scripts" / "ray_watch.py"
sys.path.insert(0, str(SCRIPT.parent))
import ray_watch  # noqa: E402

LIMIT = 3


@pytest.mark.parametrize(
    ("seen", "absent_before", "absent", "restart"),
    [
        # Listed and Alive: any run of absences before it ends.
        ("alive", 0, 0, False),
        ("alive", 2, 0, False),
        # The GCS answered without this node: counted, and acted on at the limit only.
        ("absent", 0, 1, False),
        ("absent", 1, 2, False),
        ("absent", 2, 3, True),
        # Past the limit (a restart that did not happen yet): still acted on.
        ("absent", 5, 6, True),
        # No answer: the head is away (restarting); its raylet's own limit applies, and the
        # absences before it no longer count as "in a row".
        ("unreachable", 0, 0, False),
        ("unreachable", 2, 0, False),
        # This node's raylet is not running: stopped on purpose (`ray stop`), or starting.
        ("no-raylet", 2, 0, False),
        # It runs, but has not had its time to register yet.
        ("starting", 2, 0, False),
    ],
)
def test_only_absences_the_gcs_reports_in_a_row_restart_the_node(
    seen: ray_watch.Seen, absent_before: int, absent: int, restart: bool
) -> None:
    verdict = ray_watch.decide(seen, absent_before, LIMIT)
    assert verdict == ray_watch.Verdict(absent=absent, restart=restart)


def test_a_limit_of_one_acts_on_the_first_absence() -> None:
    assert ray_watch.decide("absent", 0, 1) == ray_watch.Verdict(absent=1, restart=True)


@pytest.mark.parametrize(
    ("stat", "name", "group"),
    [
        ("4599 (raylet) S 4443 4443 4443 0 -1 4194560", "raylet", 4443),
        # A name may hold spaces and parentheses: fields count from the last ")".
        ("4622 (ray::Dashboard) A) S 4443 4443 4443 0", "ray::Dashboard) A", 4443),
        ("77 (python3) S 1 77 77 0 -1", "python3", 77),
    ],
)
def test_a_processs_name_and_group_are_read_from_its_stat(stat: str, name: str, group: int) -> None:
    assert ray_watch.parse_stat(stat) == (name, group)


def ray_specs(config: dict) -> tuple[ContainerSpec, ContainerSpec]:
    plan = plan_of(config)
    server = per_server(plan)[0]
    return (
        ray_container(server, plan.head, "m1", SCRIPTS),
        ray_container(server, plan.workers[0], "m2", SCRIPTS),
    )


def test_every_ray_container_runs_ray_under_the_watch_of_its_own_address(
    make_config: ConfigFactory,
) -> None:
    nodes = (("10.241.0.11", "--head"), ("10.241.0.12", "--address=10.241.0.11:6379"))
    for spec, (ip, joins) in zip(ray_specs(make_config(hosts=2)), nodes, strict=True):
        entrypoint = spec.entrypoint[spec.entrypoint.index("--", 4) + 1 :]  # behind the gate
        assert entrypoint[:2] == ("python3", "/spark-vllm/bin/ray_watch.py")
        # The script's own parser reads what the plan wrote: flags and script cannot drift.
        args = ray_watch.parse([*entrypoint[2:], *spec.command])
        assert (args.gcs, args.node_ip) == ("10.241.0.11:6379", ip)
        assert (args.grace_seconds, args.interval_seconds) == (60, 15)
        assert (args.check_seconds, args.absent_checks) == (10, 4)
        assert args.command[:3] == ["ray", "start", joins]
        assert f"--node-ip-address={ip}" in args.command
        # Docker restarts what the watch exits non-zero from; the scripts are mounted.
        assert spec.restart == "on-failure"
        assert any(m.target == "/spark-vllm/bin" and m.read_only for m in spec.mounts)


def test_without_the_watch_ray_is_the_main_process_as_before(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2, fabric={"firewall": False}, ray={"watchNodes": False})
    head, worker = ray_specs(config)
    assert head.entrypoint == worker.entrypoint == ("ray",)
    assert head.command[:2] == ("start", "--head")
    watched = ray_specs(make_config(hosts=2, fabric={"firewall": False}))
    # Only the entrypoint differs: `ray start`'s arguments are the same command.
    assert [s.command for s in watched] == [head.command, worker.command]


def fake_raylet(tmp_path: Path) -> str:
    """A process the watch takes for this node's raylet: a `sleep` named raylet."""
    raylet = tmp_path / "raylet"
    raylet.write_bytes(Path("/bin/sleep").read_bytes())
    raylet.chmod(0o755)
    return str(raylet)


def test_a_watch_that_cannot_ask_the_gcs_leaves_ray_running(tmp_path: Path) -> None:
    """The project's venv has no Ray: the GCS client cannot be imported. The watch says so
    once and keeps `ray start` (here a stand-in raylet) running; docker stop still ends it."""
    assert subprocess.run([sys.executable, "-c", "import ray"], capture_output=True).returncode
    watch = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--gcs=127.0.0.1:9", "--node-ip=192.0.2.123",
         "--grace-seconds=0.2", "--interval-seconds=0.2", "--check-seconds=1",
         "--absent-checks=1", "--", fake_raylet(tmp_path), "60"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(2.5)
    assert watch.poll() is None
    watch.send_signal(signal.SIGTERM)
    _, log = watch.communicate(timeout=10)
    assert watch.returncode == 128 + signal.SIGTERM
    assert log.count("the watch failed (ModuleNotFoundError") == 1, log
    assert "Ray runs on unwatched" in log
    assert "stopping this node's Ray" not in log


def test_the_watch_needs_a_command() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--gcs=127.0.0.1:9", "--node-ip=192.0.2.1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "needs `-- ray start ...`" in done.stderr
