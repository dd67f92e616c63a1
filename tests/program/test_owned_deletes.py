"""No delete can name a directory the program did not create: every path a step's delete names
lies inside a node's own state leaf (`<stateDir>/<project>.<stack>`, made and marked by the
scripts step) or is a mark file the program wrote, and every delete that names the leaf runs
only while the leaf's owner file names this deployment (stacks/plan/steps.py `owned`)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate, unwrap

OWNER_FILE = ".spark-vllm-owner"


def configs(make_config: ConfigFactory) -> dict[str, dict[str, Any]]:
    odd = make_config(hosts=3)
    for host in odd["hosts"]:
        host["stateDir"] = f"/srv/spark vllm/{host['name']}"  # quotes: test_steps runs them
    odd["model"]["cacheDir"] = "/data/hf cache"
    mp = make_config(hosts=2)
    mp["vllm"] = {**mp["vllm"], "executor": "mp"}
    removable = make_config(hosts=2, image={"ref": "example/vllm-gb10:1.0", "keepOnDestroy": False})
    return {"defaults": make_config(hosts=2), "odd paths": odd, "mp": mp, "rmi": removable}


def leaves(config: dict[str, Any]) -> list[str]:
    """Each host's leaf, as the plan derives it (stacks/plan/cluster.py state_leaf)."""
    found = []
    for host in config["hosts"]:
        home = "/root" if host["user"] == "root" else f"/home/{host['user']}"
        base = host.get("stateDir", f"{home}/.spark-vllm")
        found.append(f"{base}/spark-vllm.dev")
    return found


@pytest.mark.parametrize("case", ["defaults", "odd paths", "mp", "rmi"])
def test_every_delete_stays_inside_a_marked_leaf(make_config: ConfigFactory, case: str) -> None:
    config = configs(make_config)[case]
    own = leaves(config)
    cache = config["model"]["cacheDir"]
    ev = evaluate(config, SECRETS)
    deletes = {
        r.name: unwrap(r.inputs["delete"])
        for r in ev.by_type("command:remote:Command")
        if r.inputs.get("delete")
    }
    assert len(deletes) >= 8, deletes
    named_a_leaf = 0
    for name, delete in deletes.items():
        words = [w.rstrip(";") for w in shlex.split(delete)]
        paths = [w for w in words if w.startswith("/")]
        for path in paths:
            in_leaf = any(path == leaf or path.startswith(f"{leaf}/") for leaf in own)
            mark = path.startswith(f"{cache}/.spark-vllm-mark.")
            assert in_leaf or mark, f"{name}: its delete names {path}, which is not ours"
        deletes_there = [p for p in paths if not p.endswith(".sh")]
        if deletes_there and not name.startswith("firewall-"):
            # The firewall's delete only writes a flag in its own directory and takes the rules
            # down (that must happen even when the leaf is gone); every other one is owned.
            owner = [w for w in words if w.startswith("$(cat") and OWNER_FILE in w]
            owner += ["--owner"] if "--owner" in words else []  # checked on the worker
            assert owner, f"{name}: deletes in {deletes_there} without checking the owner"
            named_a_leaf += 1
    assert named_a_leaf >= 5


def test_the_leaf_is_per_stack_and_marked_at_install(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(hosts=2), SECRETS)
    create = unwrap(ev.named("spark1-scripts").inputs["create"])
    leaf = "/home/aurora/.spark-vllm/spark-vllm.dev"
    assert f"mkdir -p -m 700 {leaf}" in create
    assert f"echo spark-vllm/dev > {leaf}/{OWNER_FILE}" in create
    # A leaf with files but no mark, or another deployment's mark, is refused.
    assert "holds files spark-vllm did not make" in create and "belongs to deployment" in create


# --- lib.sh `empty`: the destroy's emptying, on real directories ----------------------------------

LIB = Path(__file__).resolve().parents[2] / "components" / "scripts" / "lib.sh"


def empty(directory: Path) -> subprocess.CompletedProcess[str]:
    """lib.sh's `empty DIR` with bash, as compile-cache.sh and monitoring-data.sh call it; a
    `docker` that fails, so only what the user may delete goes."""
    script = 'ARG_HOST=spark1; ARG_IMAGE=sha256:0; . "$0"; empty "$1"'
    return subprocess.run(
        ["bash", "-c", script, str(LIB), str(directory)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": f"/nonexistent:{os.environ['PATH']}"},
    )


def precious(directory: Path) -> Path:
    """A directory of someone else's, with a file in it that no delete of ours may reach."""
    directory.mkdir(parents=True)
    (directory / "keep").write_text("theirs")
    return directory / "keep"


def test_empty_removes_what_is_inside_and_links_not_what_they_name(host_tmp: Path) -> None:
    kept = precious(host_tmp / "elsewhere")
    cache = host_tmp / "leaf" / "compile-cache"
    (cache / "vllm").mkdir(parents=True)
    (cache / "vllm" / "a.so").write_text("x")
    (cache / "link").symlink_to(host_tmp / "elsewhere")  # a link inside: it goes, not its target
    done = empty(cache)
    assert done.returncode == 0, done.stderr
    assert cache.is_dir() and list(cache.iterdir()) == []
    assert kept.read_text() == "theirs"


def test_empty_refuses_a_symlinked_leaf(host_tmp: Path) -> None:
    kept = precious(host_tmp / "elsewhere")
    (host_tmp / "leaf").mkdir()
    cache = host_tmp / "leaf" / "compile-cache"
    cache.symlink_to(host_tmp / "elsewhere")
    done = empty(cache)
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"spark-vllm: spark1: lib: {cache} is a symbolic link (to {host_tmp / 'elsewhere'}), "
        "not the directory spark-vllm made: nothing deleted"
    ), done.stderr
    assert f"remove the link (rm {cache})" in done.stderr
    assert kept.read_text() == "theirs" and cache.is_symlink()


def test_empty_refuses_a_path_a_symlinked_ancestor_leads_elsewhere(host_tmp: Path) -> None:
    kept = precious(host_tmp / "elsewhere" / "compile-cache")
    (host_tmp / "leaf").symlink_to(host_tmp / "elsewhere")  # the leaf replaced by a link
    cache = host_tmp / "leaf" / "compile-cache"
    done = empty(cache)
    assert done.returncode == 1
    assert (
        f"{cache} leads to {host_tmp / 'elsewhere' / 'compile-cache'} (a link on its way), not "
        "the directory spark-vllm made: nothing deleted"
    ) in done.stderr, done.stderr
    assert kept.read_text() == "theirs"


def test_empty_refuses_a_link_to_the_root(host_tmp: Path) -> None:
    """The issue's worst case: the leaf a link to /. Nothing is even listed."""
    (host_tmp / "leaf").mkdir()
    cache = host_tmp / "leaf" / "ray"
    cache.symlink_to("/")
    done = empty(cache)
    assert done.returncode == 1 and "is a symbolic link (to /)" in done.stderr
    assert Path("/etc/passwd").exists()
