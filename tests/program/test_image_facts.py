"""image-facts.sh and image_facts.py: what an image carries, read before anything starts from it.

image_facts.py runs for real with python3 against a fake site (dist-info metadata and a `vllm`
command that prints its help); image-facts.sh runs with a stand-in `docker` that runs the probe
on this machine, as `docker run` would inside the image."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from stacks.plan.image import parse_image_facts
from tests.program.scripting import SCRIPTS, load, run

HELP = """usage: vllm serve [model_tag] [options]
options:
  --host HOST  --port PORT  --api-key API_KEY  --max-model-len MAX_MODEL_LEN
  --max-num-seqs MAX_NUM_SEQS  --enable-prefix-caching, --no-enable-prefix-caching
  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE
  --kv-cache-dtype {auto,fp8}  --quantization QUANTIZATION, -q QUANTIZATION
"""


def fake_site(
    tmp_path: Path,
    *,
    ray: str | None = "2.60.0",
    requires: str = "ray[cgraph]>=2.48.0",
    vllm: str = "0.16.0rc1",
) -> dict[str, str]:
    """A site with a `vllm` distribution (its console script, its Ray requirement) and Ray."""
    site, bin_dir = tmp_path / "site", tmp_path / "bin"
    info = site / f"vllm-{vllm}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {vllm}\nRequires-Dist: {requires}\n"
        'Requires-Dist: ray>=9.9; extra == "never"\n'
    )
    (info / "entry_points.txt").write_text("[console_scripts]\nvllm = vllm.cli:main\n")
    if ray is not None:
        ray_info = site / f"ray-{ray}.dist-info"
        ray_info.mkdir()
        (ray_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ray\nVersion: {ray}\n")
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "vllm").write_text(f"#!/bin/sh\ncat <<'EOF'\n{HELP}EOF\n")
    (bin_dir / "vllm").chmod(0o755)
    return {"PYTHONPATH": str(site), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def probe(env: dict[str, str], extra: list[str], *more: str) -> subprocess.CompletedProcess[str]:
    # -S: no site-packages, so only the fake site's distributions are seen.
    argv = ["python3", "-S", str(SCRIPTS / "image_facts.py"), json.dumps(extra), "yes", *more]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


def test_a_vllm_image_with_ray_reports_its_versions(tmp_path: Path) -> None:
    done = probe(fake_site(tmp_path), ["--max-num-seqs", "8", "--no-enable-prefix-caching"])
    assert done.returncode == 0, done.stderr
    facts = parse_image_facts(done.stdout)
    assert facts["vllm"] == "0.16.0rc1" and facts["ray"] == "2.60.0"
    assert facts["rayRequired"] == ">=2.48.0" and facts["machine"] == platform.machine()


def test_an_unknown_extra_arg_names_its_index_and_the_closest_flag(tmp_path: Path) -> None:
    done = probe(fake_site(tmp_path), ["--max_model_len=4096", "--max-num-seq", "8", "-tp=2"])
    assert done.returncode == 3
    assert done.stderr.strip() == (
        "problem: vllm.extraArgs[1]: --max-num-seq is not a flag of this image's `vllm serve` "
        "(vllm 0.16.0rc1); did you mean --max-num-seqs?"
    )


@pytest.mark.parametrize(
    ("ray", "requires", "problem"),
    [
        (
            None,
            "ray>=2.48",
            "image.ref: has no `ray` package, which vllm.executor ray needs (vLLM's images ship "
            "without Ray since about 0.18): set vllm.executor: mp (vLLM's own multi-node mode, "
            "the default), or use an image with Ray",
        ),
        ("2.40.0", "ray[cgraph]>=2.48.0", "ray 2.40.0 does not satisfy vllm 0.16.0rc1's ray>=2.48"),
    ],
)
def test_an_image_without_a_fit_ray_is_refused(
    tmp_path: Path, ray: str | None, requires: str, problem: str
) -> None:
    done = probe(fake_site(tmp_path, ray=ray, requires=requires), [])
    assert done.returncode == 3 and problem in done.stderr


def test_kv_cache_needs_a_vllm_that_takes_its_bytes(tmp_path: Path) -> None:
    """vllm.kvCache sets --kv-cache-memory-bytes (vLLM 0.10.2 on): an image without it is refused
    before any container starts; asked only when the stack sets vllm.kvCache."""
    env = fake_site(tmp_path)
    done = probe(env, [], "mp", "yes")
    assert done.returncode == 3
    assert (
        "vllm 0.16.0rc1 has no --kv-cache-memory-bytes: vllm.kvCache needs vLLM 0.10.2 or newer"
        in done.stderr
    )
    assert "kv-cache-memory" not in probe(env, [], "ray", "no").stderr


def test_an_image_without_vllm_is_refused(tmp_path: Path) -> None:
    env = fake_site(tmp_path)
    (Path(env["PYTHONPATH"]) / "vllm-0.16.0rc1.dist-info" / "entry_points.txt").write_text("")
    done = probe(env, [])
    assert done.returncode == 3 and "has no `vllm` command" in done.stderr


def test_requirements_under_extras_do_not_count() -> None:
    module = load("image_facts")

    dist = SimpleNamespace(requires=['ray>=9; extra == "cluster"', "ray (>=2.9)", "numpy"])
    assert module.ray_requirement(dist) == ">=2.9"
    assert module.satisfies("2.60.0", ">=2.48.0") and not module.satisfies("2.40.0", ">=2.48")


FAKE_DOCKER = """#!/bin/bash
# docker image inspect --format ... ID | docker run --rm ... -v SRC:DST:ro ... IMAGE DST ARGS...
# A variable naming a mount's destination (`-e KEY=DST`) is given its source: no mount here.
case "$1" in
  image) [ -n "${FAKE_NO_IMAGE:-}" ] && exit 1; echo "${FAKE_ARCH}" ;;
  info) echo "${FAKE_SECURITY:-[name=seccomp,profile=builtin]}" ;;
  run)
    shift; declare -A mounts
    while [ $# -gt 0 ]; do
      case "$1" in
        -v) IFS=: read -r src dst _ <<<"$2"; mounts[$dst]="$src"; shift 2 ;;
        -e) value="${2#*=}"; export "${2%%=*}=${mounts[$value]:-$value}"; shift 2 ;;
        --entrypoint|--network) shift 2 ;;
        --*) shift ;;
        *) break ;;
      esac
    done
    shift  # the image
    script="${mounts[$1]}"; shift
    exec python3 -S "$script" "$@" ;;
esac
"""


def facts_script(
    tmp_path: Path, arch: str, extra: list[str], linger: str = "yes", **more_env: str
) -> subprocess.CompletedProcess[str]:
    env = fake_site(tmp_path)
    env.update(more_env)
    (tmp_path / "bin" / "docker").write_text(FAKE_DOCKER)
    (tmp_path / "bin" / "docker").chmod(0o755)
    env["FAKE_ARCH"] = arch
    flags = ["--image", "sha256:abc", "--ref", "example/vllm:1", "--extra-args"]
    flags += [json.dumps(extra), "--check-flags", "yes", "--executor", "ray"]
    flags += ["--timeout-seconds", "60", "--enable-linger", linger]
    return run("image-facts.sh", "--host", "spark1", *flags, env=env)


HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def test_the_script_prints_the_facts_line(tmp_path: Path) -> None:
    done = facts_script(tmp_path, HOST_ARCH, ["--max-num-seqs", "4"])
    assert done.returncode == 0, done.stderr
    assert parse_image_facts(done.stdout)["vllm"] == "0.16.0rc1"


def test_the_script_refuses_another_architecture_before_running_it(tmp_path: Path) -> None:
    other = "amd64" if HOST_ARCH == "arm64" else "arm64"
    done = facts_script(tmp_path, other, [])
    assert done.returncode == 1
    assert f"image.ref example/vllm:1 is built for {other}, but this host is {HOST_ARCH}" in (
        done.stderr
    )
    assert f"set image.platform to linux/{HOST_ARCH}" in done.stderr


def test_the_script_names_the_bad_flag_host_and_step(tmp_path: Path) -> None:
    done = facts_script(tmp_path, HOST_ARCH, ["--max-num-seq", "4"])
    first = done.stderr.splitlines()[0]
    assert first.startswith("spark-vllm: spark1: image-facts: the image cannot serve this stack: ")
    assert "vllm.extraArgs[0]: --max-num-seq is not a flag" in first
    assert "did you mean --max-num-seqs?" in first


FAKE_LOGINCTL = """#!/bin/bash
echo "$*" >> "$LOGINCTL_CALLS"
[ -z "${LOGINCTL_DENIED:-}" ] || { echo "Access denied" >&2; exit 1; }
"""


def linger_run(tmp_path: Path, root: Path, linger: str, denied: str
               ) -> tuple[subprocess.CompletedProcess[str], list[str]]:  # fmt: skip
    """image-facts.sh on rootless Docker (its root is the SSH user) with a stand-in loginctl;
    what it asked loginctl."""
    tmp_path.mkdir(exist_ok=True)
    loginctl = tmp_path / "bin" / "loginctl"
    loginctl.parent.mkdir(parents=True, exist_ok=True)
    loginctl.write_text(FAKE_LOGINCTL)
    loginctl.chmod(0o755)
    calls = tmp_path / "calls"
    env = {"SPARK_VLLM_ROOT": str(root), "FAKE_SECURITY": "[name=seccomp name=rootless]",
           "LOGINCTL_CALLS": str(calls), "LOGINCTL_DENIED": denied}  # fmt: skip
    done = facts_script(tmp_path, HOST_ARCH, [], linger, **env)
    return done, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize(
    ("linger", "denied", "refused"),
    [("yes", "", False), ("no", "", True), ("yes", "1", True)],
)
def test_the_script_enables_linger_or_refuses_where_logout_would_stop_the_servers(
    tmp_path: Path, linger: str, denied: str, refused: bool
) -> None:
    """Rootless Docker without linger: the SSH user's logout would stop the daemon and remove
    the servers' shared memory."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    done, asked = linger_run(tmp_path / "first", root, linger, denied)
    assert done.returncode == (1 if refused else 0), done.stderr
    assert asked == ([] if linger == "no" else ["enable-linger"])
    if refused:
        first, second = done.stderr.strip().splitlines()[-2:]
        assert first.startswith("spark-vllm: spark1: image-facts: Docker runs rootless as ")
        assert "loginctl enable-linger " in second
    else:
        assert "enabled linger for" in done.stderr
    # Lingering already: nothing to do.
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout
    (root / "var/lib/systemd/linger").mkdir(parents=True)
    (root / "var/lib/systemd/linger" / user.strip()).write_text("")
    again, asked = linger_run(tmp_path / "again", root, linger, denied)
    assert again.returncode == 0, again.stderr
    assert asked == []
