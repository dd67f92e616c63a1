"""What a replacement does to a serving host. The engine replaces create-before-delete unless a
resource (or its provider) says delete-before-replace: the new resource is created, and the old
one's delete runs at the end of the deployment (ENGINE-NOTES.md; tests/engine/diff.py). A delete
that undoes what the replacement just created leaves the host broken, as the first version's
`rm -rf <stateDir>/bin` did after every change of a script."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.engine.diff import TYPE_COMMAND, TYPE_CONTAINER, TYPE_REMOTE_IMAGE
from tests.mockvalues import unwrap_secrets
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import REPO, Registration, evaluate, load_stack_config

# The steps run here with a Docker that does not answer: their host claim (a Docker volume,
# stacks/plan/instance.py) is skipped, never made on this machine's daemon.
_NO_DOCKER_BIN = Path(tempfile.mkdtemp(prefix="spark-vllm-no-docker-"))
(_NO_DOCKER_BIN / "docker").write_text("#!/bin/sh\nexit 1\n")
(_NO_DOCKER_BIN / "docker").chmod(0o755)
NO_DOCKER = {**os.environ, "PATH": f"{_NO_DOCKER_BIN}:{os.environ['PATH']}"}


def replaceable(reg: Registration) -> bool:
    """pulumi-command replaces only on `triggers` (or replaceOnChanges); a Docker container or
    image has ForceNew fields (its image, its name), so any of them can be replaced."""
    if reg.typ == TYPE_COMMAND:  # the SDK registers every Command with ["triggers[*]"]
        others = [p for p in reg.replace_on_changes if not p.startswith("triggers")]
        return bool(reg.inputs.get("triggers")) or bool(others)
    return reg.typ in (TYPE_CONTAINER, TYPE_REMOTE_IMAGE) or bool(reg.replace_on_changes)


def has_delete(reg: Registration) -> bool:
    if reg.typ == TYPE_COMMAND:
        return bool(reg.inputs.get("delete"))
    if reg.typ == TYPE_REMOTE_IMAGE:
        return not reg.inputs.get("keepLocally", False)
    return reg.typ == TYPE_CONTAINER


def deletes_first(reg: Registration) -> bool:
    # pulumi-docker's provider/resources.go: docker_container is DeleteBeforeReplace.
    return reg.delete_before_replace or reg.typ == TYPE_CONTAINER


def variants(make_config: ConfigFactory) -> dict[str, dict[str, Any]]:
    base = make_config(hosts=3)
    return {
        "dev": load_stack_config("dev"),
        "bastion, 3 hosts": base,
        "images removed on destroy": {**base, "image": {**base["image"], "keepOnDestroy": False}},
        "firewall": {**base, "fabric": {"firewall": True}},
        "existing trust": {**base, "fabric": {"trust": "existing"}},
    }


def test_no_replacement_can_undo_itself(make_config: ConfigFactory, tmp_path: Path) -> None:
    for label, config in variants(make_config).items():
        if label == "dev":
            # Its knownHostsFile is the operator's: without it no key is pinned.
            config = {
                **config,
                "ssh": {"privateKeyPath": str(tmp_path / "k"), "allowUnpinned": True},
            }
            (tmp_path / "k").write_text("key")
        ev = evaluate(config, SECRETS)
        unsafe = [
            r.name
            for r in ev.registrations
            if replaceable(r) and has_delete(r) and not deletes_first(r)
        ]
        assert unsafe == [], f"{label}: replaced create-before-delete, then deleted: {unsafe}"


def test_an_upgrade_that_changes_a_script_updates_only_the_scripts(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preview of the next `up` after a new spark-vllm release edited a host script."""
    import composition.deployment
    from components.bundle import ScriptsBundle, scripts_bundle

    config = make_config(hosts=2)
    up = evaluate(config, SECRETS)
    edited = ScriptsBundle(scripts_bundle().archive_b64 + "Cg==", "f" * 64)
    monkeypatch.setattr(composition.deployment, "scripts_bundle", lambda: edited)
    preview = evaluate(config, SECRETS, preview=True, prior=up)
    assert {n: s for n, s in preview.steps.items() if s != "same"} == {
        "spark1-scripts": "update",
        "spark2-scripts": "update",
    }


def test_the_scripts_delete_spares_a_newer_bundle(
    make_config: ConfigFactory, host_tmp: Path
) -> None:
    """Run the install and its delete for real with bash: the delete of an older bundle (what a
    create-before-delete replacement runs last) leaves the newer bundle's scripts in place."""
    config = make_config(hosts=2)
    config["hosts"][0]["stateDir"] = str(host_tmp / "state dir's")  # a space and a quote
    config["model"]["cacheDir"] = str(host_tmp / "hf")
    ev = evaluate(config, SECRETS)
    inputs = unwrap_secrets(ev.named("spark1-scripts").inputs)
    cache_delete = unwrap_secrets(ev.named("compile-cache-spark1").inputs)["delete"]
    base = host_tmp / "state dir's"
    leaf = base / "spark-vllm.dev"  # the deployment's own directory under stateDir
    bin_dir = leaf / "bin"

    def bash(command: str, stdin: str = "") -> None:
        subprocess.run(["bash", "-c", command], input=stdin, text=True, check=True, timeout=30,
                       env=NO_DOCKER)  # fmt: skip

    bash(inputs["create"], inputs["stdin"])
    assert (bin_dir / "preflight.sh").is_file()
    assert (leaf / ".spark-vllm-owner").read_text() == "spark-vllm/dev\n"
    marker = bin_dir / ".bundle-digest"
    installed = marker.read_text()
    marker.write_text("0" * 64 + "\n")  # a newer bundle was installed over it
    bash(inputs["delete"])
    assert (bin_dir / "preflight.sh").is_file(), "the old delete removed the new scripts"
    marker.write_text(installed)
    (leaf / ".spark-vllm-owner").write_text("someone/else\n")  # not ours: nothing is deleted
    bash(inputs["delete"])
    assert (bin_dir / "preflight.sh").is_file(), "a delete ran in a leaf that is not ours"
    (leaf / ".spark-vllm-owner").write_text("spark-vllm/dev\n")
    (base / "users-own-file").write_text("kept")
    (leaf / "compile-cache" / "vllm").mkdir()  # what a server compiled
    # destroy: the compile cache's step goes first (the containers and it ran after the
    # scripts step), then the scripts step, whose bundle is still there
    bash(cache_delete)
    assert not (leaf / "compile-cache").exists()
    bash(inputs["delete"])
    assert not leaf.exists(), "the leaf holds nothing else: it goes, with its mark"
    assert (base / "users-own-file").read_text() == "kept"


def test_a_kept_compile_cache_keeps_the_leaf_for_the_next_deployment(
    make_config: ConfigFactory, host_tmp: Path
) -> None:
    """vllm.compileCache.keepOnDestroy: a destroy leaves the cache and the leaf it is in (with
    the owner file, so the same stack deployed again claims it and starts warm)."""
    config = make_config(hosts=2)
    config["hosts"][0]["stateDir"] = str(host_tmp / "state")
    config["model"]["cacheDir"] = str(host_tmp / "hf")
    config["vllm"] = {**config["vllm"], "compileCache": {"keepOnDestroy": True}}
    ev = evaluate(config, SECRETS)
    scripts = unwrap_secrets(ev.named("spark1-scripts").inputs)
    cache = unwrap_secrets(ev.named("compile-cache-spark1").inputs)
    leaf = host_tmp / "state" / "spark-vllm.dev"

    def bash(command: str, stdin: str = "") -> str:
        done = subprocess.run(
            ["bash", "-c", command], input=stdin, text=True, check=True, timeout=30,
            capture_output=True, env=NO_DOCKER,
        )  # fmt: skip
        return done.stdout

    bash(scripts["create"], scripts["stdin"])
    (leaf / "compile-cache" / "vllm" / "torch_compile_cache").mkdir(parents=True)
    assert bash(cache["create"]).startswith("compile cache: ")
    assert "compile cache kept in" in bash(cache["delete"])
    bash(scripts["delete"])
    assert (leaf / "compile-cache" / "vllm" / "torch_compile_cache").is_dir()
    assert (leaf / ".spark-vllm-owner").read_text() == "spark-vllm/dev\n"
    assert not (leaf / "bin").exists()
    bash(scripts["create"], scripts["stdin"])  # deployed again: the leaf is claimed again
    assert (leaf / "compile-cache" / "vllm" / "torch_compile_cache").is_dir()


@pytest.mark.parametrize("keep", [True, False])
def test_the_image_deletes_first_only_when_its_delete_removes_it(
    make_config: ConfigFactory, keep: bool
) -> None:
    config = make_config(hosts=2)
    config["image"] = {**config["image"], "keepOnDestroy": keep}
    pull = evaluate(config, SECRETS).named("image-pull")
    assert pull.delete_before_replace is (not keep)


def test_pins_of_a_removed_host_stay_for_its_deletes(tmp_path: Path) -> None:
    """A host removed from the stack is deleted after the program: its Docker provider still
    dials it through the derived known_hosts, so its pin must survive the run that removed it."""
    from stacks.known_hosts import write_known_hosts
    from stacks.plan.cluster import SshEndpoint

    path = tmp_path / "known_hosts"
    one = SshEndpoint("spark1", "10.0.0.1", 22, "u", "ssh-ed25519 AAAAone")
    three = SshEndpoint("spark3", "10.0.0.3", 2222, "u", "ssh-ed25519 AAAAthree")
    write_known_hosts(path, [one, three])
    with path.open("a") as accepted:  # what OpenSSH's accept-new appends for an unpinned host
        accepted.write("10.0.0.9 ssh-ed25519 AAAAnine\n")
    write_known_hosts(path, [SshEndpoint("spark1", "10.0.0.1", 22, "u", "ssh-ed25519 AAAAnew")])
    assert path.read_text().splitlines() == [
        "10.0.0.1 ssh-ed25519 AAAAnew",
        "[10.0.0.3]:2222 ssh-ed25519 AAAAthree",
    ]
    # Configured again but unpinned (a reinstalled host): no old pin may contradict it.
    write_known_hosts(path, [SshEndpoint("spark3", "10.0.0.3", 2222, "u", None)])
    assert path.read_text().splitlines() == ["10.0.0.1 ssh-ed25519 AAAAnew"]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_a_compile_cache_the_ssh_user_cannot_empty_fails_naming_what_to_do(
    tmp_path: Path,
) -> None:
    """The containers write the cache as root; an SSH user who is not root cannot remove it,
    and without the serving image (gone, or no Docker for this user) the delete says what to do
    instead of leaving a half-removed directory silently."""
    scripts = Path(tempfile.mkdtemp(dir="/tmp"))  # where `nobody` can read and reach
    try:
        scripts.chmod(0o755)
        for name in ("compile-cache.sh", "lib.sh"):
            shutil.copy(REPO / "components" / "scripts" / name, scripts / name)
        cache, ray = scripts / "compile-cache", scripts / "ray"
        (cache / "vllm" / "torch_compile_cache").mkdir(parents=True)
        (cache / "vllm" / "torch_compile_cache" / "graph.bin").write_text("root's")
        (ray / "session_latest" / "sockets").mkdir(parents=True)  # Ray's, written as root
        for directory in (cache, ray):
            directory.chmod(0o777)

        def remove(*flags: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                 "bash", str(scripts / "compile-cache.sh"), "remove", "--host", "spark2",
                 "--dir", str(cache), "--ray-dir", str(ray), "--image", "sha256:gone",
                 *flags],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip

        ray_first = remove("--keep", "yes")  # Ray's session files go even when the cache stays
        shutil.rmtree(ray / "session_latest")
        done = remove("--keep", "no")
        left = (cache / "vllm" / "torch_compile_cache" / "graph.bin").exists()
    finally:
        shutil.rmtree(scripts)
    assert ray_first.returncode == 1, ray_first
    assert ray_first.stderr.startswith(
        f"spark-vllm: spark2: compile-cache: could not remove what is in {ray}"
    )
    assert done.returncode == 1, done
    assert done.stderr.startswith(
        f"spark-vllm: spark2: compile-cache: could not remove what is in {cache}: it holds "
        "files of the containers' user (root), and emptying it from the serving image "
        "sha256:gone failed: "
    )
    assert f"likely cause: remove it by hand as root (sudo rm -rf {cache})" in done.stderr
    assert left
