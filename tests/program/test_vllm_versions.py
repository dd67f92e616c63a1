"""vLLM 0.33/0.34: the variables a release removed, refused by the image facts of an image whose
vLLM removed them (keyed, with the release and the fix), and the KV cache's default block size
(16, 64 from 0.34) followed by the memory check's whole blocks (stacks/vllm_versions.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stacks.vllm_versions import at_least, default_block_size, release, removed_env
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import FakeHosts, evaluate
from tests.program.scripting import SCRIPTS, load, run
from tests.program.test_image_facts import FAKE_DOCKER, HOST_ARCH, fake_site

VERSIONS = [
    # (version, release numbers, 0.33 or later, default block size)
    ("0.32.2", (0, 32, 2), False, 16),
    ("0.33.0", (0, 33, 0), True, 16),
    ("0.33.1.dev12+g0a1b2c3", (0, 33, 1), True, 16),
    ("0.34.0rc1", (0, 34, 0), True, 64),  # a release candidate of 0.34 already has 0.34's default
    ("v0.34.1", (0, 34, 1), True, 64),
    ("1.0.0", (1, 0, 0), True, 64),
    ("0.9", (0, 9, 0), False, 16),  # not 0.90
    ("unknown", None, False, 16),
]  # fmt: skip


@pytest.mark.parametrize(("version", "numbers", "since_033", "block"), VERSIONS)
def test_versions_are_read_by_their_release_numbers(
    version: str, numbers: tuple[int, ...] | None, since_033: bool, block: int
) -> None:
    assert release(version) == numbers
    # image_facts.py runs in the image, importing nothing of ours: it reads versions the same way.
    assert load("image_facts").release(version) == numbers
    assert at_least(version, "0.33") == since_033
    assert default_block_size(version) == block


REMOVED = [
    ("VLLM_USE_RAY_COMPILED_DAG", "0.33"),
    ("VLLM_USE_RAY_SPMD_WORKER", "0.33"),
    ("VLLM_USE_RAY_WRAPPED_PP_COMM", "0.33"),
    ("VLLM_USE_V1", "0.34"),
    ("VLLM_USE_V1_EXTRA", None),  # a name, not a prefix
    ("RAY_DEDUP_LOGS", None),
    ("VLLM_USE_RAY", None),  # the family's prefix ends in `_`
]


@pytest.mark.parametrize(("key", "version"), REMOVED)
def test_the_table_names_the_release_that_removed_each_variable(
    key: str, version: str | None
) -> None:
    row = removed_env(key)
    assert (row.version if row else None) == version


# -- image_facts.py, run for real against a fake site --------------------------------------------

ROW = {
    "key": "vllm.env.VLLM_USE_RAY_COMPILED_DAG",
    "version": "0.33",
    "what": "a switch of the legacy Ray executor",
    "fix": "remove it; remove it from vllm.env",
}


def facts_of(tmp_path: Path, vllm: str, removed: list[dict[str, str]]) -> Any:
    env = fake_site(tmp_path, vllm=vllm)
    argv = ["python3", "-S", str(SCRIPTS / "image_facts.py"), "[]", "yes", "ray", "no"]
    return subprocess.run(
        [*argv, json.dumps(removed)], capture_output=True, text=True, timeout=60,
        env={**os.environ, **env},
    )  # fmt: skip


@pytest.mark.parametrize(("vllm", "refused"), [("0.32.2", False), ("0.33.0", True)])
def test_the_image_refuses_a_variable_its_vllm_removed(
    tmp_path: Path, vllm: str, refused: bool
) -> None:
    done = facts_of(tmp_path, vllm, [ROW])
    problem = (
        f"problem: vllm.env.VLLM_USE_RAY_COMPILED_DAG: vLLM 0.33 removed it (a switch of the "
        f"legacy Ray executor; this image has vllm {vllm}): remove it; remove it from vllm.env"
    )
    assert (done.returncode, problem in done.stderr) == ((3, True) if refused else (0, False))


def test_the_script_fails_the_step_naming_the_key_and_the_release(tmp_path: Path) -> None:
    env = fake_site(tmp_path, vllm="0.34.0")
    (tmp_path / "bin" / "docker").write_text(FAKE_DOCKER)
    (tmp_path / "bin" / "docker").chmod(0o755)
    row = {**ROW, "key": "models[1].env.VLLM_USE_V1", "version": "0.34", "what": "V1's switch"}
    done = run(
        "image-facts.sh", "--host", "spark1", "--image", "sha256:abc", "--ref", "example/vllm:1",
        "--extra-args", "[]", "--check-flags", "yes", "--executor", "ray",
        "--timeout-seconds", "60", "--enable-linger", "yes", "--removed", json.dumps([row]),
        env={**env, "FAKE_ARCH": HOST_ARCH},
    )  # fmt: skip
    assert done.returncode == 1
    first = done.stderr.splitlines()[0]
    assert first.startswith(
        "spark-vllm: spark1: image-facts: the image cannot serve this stack: "
        "models[1].env.VLLM_USE_V1: vLLM 0.34 removed it (V1's switch; this image has vllm 0.34.0)"
    ), first


# -- the plan ------------------------------------------------------------------------------------


def facts_flags(ev: Any, node: str) -> dict[str, str]:
    words = shlex.split(ev.named(f"image-{node}-facts").inputs["create"])
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}


def test_the_head_is_given_the_variables_a_release_removed_keyed_as_written(
    make_config: ConfigFactory,
) -> None:
    config = make_config()
    config["vllm"]["env"] = {"VLLM_USE_RAY_COMPILED_DAG": "1", "NCCL_DEBUG": "WARN"}
    ev = evaluate(config, SECRETS)
    rows = json.loads(facts_flags(ev, "spark1")["--removed"])
    assert [(r["key"], r["version"]) for r in rows] == [
        ("vllm.env.VLLM_USE_RAY_COMPILED_DAG", "0.33")
    ]
    assert "remove it from vllm.env" in rows[0]["fix"]
    assert "--removed" not in facts_flags(ev, "spark2")  # the head checks the image's vLLM


def test_a_stack_that_sets_none_keeps_the_image_check_it_had(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(), SECRETS)
    assert "--removed" not in facts_flags(ev, "spark1")


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_our_own_env_never_sets_a_removed_variable(
    make_config: ConfigFactory, executor: str
) -> None:
    ev = evaluate(make_config(hosts=3, executor=executor), SECRETS)
    containers = [r for r in ev.registrations if r.inputs.get("envs")]
    assert any(r.name == "vllm-container" for r in containers)
    for container in containers:
        keys = [entry.split("=", 1)[0] for entry in container.inputs["envs"]]
        assert not [key for key in keys if removed_env(key)], (executor, container.name)


# -- the memory check's block size, from the head's image facts ----------------------------------


class HostsWithVllm(FakeHosts):
    """image-facts.sh answering for an image whose vLLM is `vllm`."""

    def __init__(self, vllm: str) -> None:
        super().__init__()
        self.vllm = vllm

    def new_resource(self, args):  # type: ignore[no-untyped-def]
        resource_id, outputs = super().new_resource(args)
        if args.name.endswith("-facts"):
            facts = {"machine": "aarch64", "python": "3.12.3", "vllm": self.vllm}
            outputs["stdout"] = "spark-vllm-image-facts " + json.dumps(facts) + "\n"
        return resource_id, outputs


@pytest.mark.parametrize(
    ("vllm", "extra", "block"),
    [("0.33.2", [], "16"), ("0.34.0", [], "64"), ("0.34.0", ["--block-size", "32"], "32")],
)
def test_the_memory_check_counts_whole_blocks_of_the_images_vllm(
    make_config: ConfigFactory, vllm: str, extra: list[str], block: str
) -> None:
    config = make_config(executor=None)
    config["vllm"] = {**config["vllm"], "kvCache": "auto", "extraArgs": extra}
    ev = evaluate(config, SECRETS, mocks=HostsWithVllm(vllm))
    words = shlex.split(ev.named("memory-check").inputs["create"])
    assert words[words.index("--block-size") + 1] == block


def test_without_kv_cache_the_memory_check_has_no_block_size(make_config: ConfigFactory) -> None:
    ev = evaluate(make_config(), SECRETS, mocks=HostsWithVllm("0.34.0"))
    assert "--block-size" not in ev.named("memory-check").inputs["create"]
