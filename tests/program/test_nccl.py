"""Issue 51's NCCL: which NCCL a server loads (the image facts name it), the host's own in every
Ray and vLLM container with vllm.hostNccl, and the known-bad releases refused unless the models
set their neutraliser (stacks/nccl_versions.py, stacks/plan/nccl.py, image_facts.py,
image-facts.sh, facts.sh). The scripts run for real on fake trees: a fake site with torch's NCCL
wheel, a host's loader cache (a stand-in `ldconfig`), libraries built here with the C compiler."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
from base64 import b64decode
from gzip import decompress
from pathlib import Path
from typing import Any

import pytest

from components.bundle import NCCL_KNOWN_BAD_FILE, scripts_bundle
from components.facts import HostFacts, parse_facts
from stacks.nccl_versions import KNOWN_BAD_NCCL, known_bad_rows, neutralised
from stacks.plan import image
from stacks.plan.container_paths import CONTAINER_HOST_NCCL
from stacks.plan.image import image_streams, parse_image_facts
from stacks.plan.known_bad import known_bad_flag
from stacks.plan.nccl import HostNccl, host_nccl_problems, nccl_file_version, parse_host_nccl
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.goldens import steady_token
from tests.program.harness import FakeHosts, evaluate
from tests.program.planning import plan_of
from tests.program.scripting import SCRIPTS, load
from tests.program.test_image_facts import FAKE_DOCKER, HOST_ARCH, fake_site
from tests.program.test_scripts import facts

BAD = "2.30.4"  # nccl#2167's NVLS hang
ROWS = known_bad_rows()

# --- the decisions, table-tested -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "version"),
    [
        ("/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9", "2.28.9"),  # libnccl2's file
        ("/usr/lib/x86_64-linux-gnu/libnccl.so.2.30.4", "2.30.4"),
        ("/usr/lib/aarch64-linux-gnu/libnccl.so.2", ""),  # the soname link, unresolved
        ("/site/nvidia/nccl/lib/libnccl.so.2", ""),  # a wheel's file names no release
        ("/opt/libnccl.so.2.28.9.bak", ""),
    ],
)
def test_a_host_librarys_release_is_its_files_name(path: str, version: str) -> None:
    assert nccl_file_version(path) == version


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        (
            "/usr/lib/aarch64-linux-gnu/libnccl.so.2 /usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9",
            HostNccl("/usr/lib/aarch64-linux-gnu/libnccl.so.2", "2.28.9"),
        ),
        ("/usr/lib/libnccl.so.2", HostNccl("/usr/lib/libnccl.so.2", "")),  # no readlink
        ("", None),
        ("garbage", None),
    ],
)
def test_the_hosts_nccl_line_is_parsed(line: str, parsed: HostNccl | None) -> None:
    assert parse_host_nccl(line) == parsed


@pytest.mark.parametrize(
    ("envs", "expected"),
    [
        ([{"NCCL_NVLS_ENABLE": "0"}], {"NCCL_NVLS_ENABLE": "0"}),
        (
            [{"NCCL_NVLS_ENABLE": "0"}, {"NCCL_NVLS_ENABLE": "0", "X": "1"}],
            {"NCCL_NVLS_ENABLE": "0"},
        ),
        ([{"NCCL_NVLS_ENABLE": "0"}, {}], {}),  # one model of the image does not: refused
        ([{"NCCL_NVLS_ENABLE": "1"}], {}),  # on is not the neutraliser
        ([{}], {}),
        ([], {}),
    ],
)
def test_a_neutraliser_counts_when_every_model_of_the_image_sets_it(
    envs: list[dict[str, str]], expected: dict[str, str]
) -> None:
    assert neutralised(envs) == expected


def test_the_shipped_list_holds_nccl_2_30_4_with_its_neutraliser() -> None:
    row = next(row for row in KNOWN_BAD_NCCL if row.version == BAD)
    assert row.source == "NVIDIA/nccl#2167" and row.neutraliser == ("NCCL_NVLS_ENABLE", "0")


@pytest.mark.parametrize(
    ("code", "version"),
    [(22809, "2.28.9"), (23004, "2.30.4"), (21805, "2.18.5"), (2708, "2.7.8"), (2804, "2.8.4")],
)
def test_nccl_get_versions_code_is_read_as_nccl_h_encodes_it(code: int, version: str) -> None:
    assert load("image_facts").version_from_code(code) == version


IMAGE = {"path": "/site/nvidia/nccl/lib/libnccl.so.2", "version": BAD, "from": "wheel"}
HOST = "/usr/lib/aarch64-linux-gnu/libnccl.so.2"


@pytest.mark.parametrize(
    ("nccl", "env", "mounted", "problem"),
    [
        # The image's 2.30.4: refused, keyed to the image, the fixes named.
        (
            IMAGE,
            {},
            "",
            f"image.ref: the image's NCCL {BAD} (/site/nvidia/nccl/lib/libnccl.so.2) is known to "
            "break this workload: its NVLS path hangs collectives silently on Sparks (no "
            'NVLink), with no error logged (NVIDIA/nccl#2167): set NCCL_NVLS_ENABLE: "0" in '
            "vllm.env (or each models[].env), or use an image with another NCCL, or set "
            "vllm.hostNccl: true",
        ),
        # Neutralised by the models' env: served.
        (IMAGE, {"NCCL_NVLS_ENABLE": "0"}, "", None),
        # The host's 2.30.4 (vllm.hostNccl): keyed to the setting, the host's path named.
        (
            {**IMAGE, "path": CONTAINER_HOST_NCCL},
            {},
            HOST,
            f"vllm.hostNccl: the host's NCCL {BAD} ({HOST}) is known to break this workload: its "
            "NVLS path hangs collectives silently on Sparks (no NVLink), with no error logged "
            '(NVIDIA/nccl#2167): set NCCL_NVLS_ENABLE: "0" in vllm.env (or each models[].env), '
            "or install another libnccl2 release on the host, or set vllm.hostNccl: false",
        ),
        ({**IMAGE, "version": "2.30.3"}, {}, "", None),  # the release before works
        ({**IMAGE, "version": ""}, {}, "", None),  # unknown: nothing to hold it to
    ],
)
def test_a_known_bad_nccl_is_refused_where_it_was_found_unless_neutralised(
    nccl: dict[str, str], env: dict[str, str], mounted: str, problem: str | None
) -> None:
    found = load("image_facts").nccl_problems(nccl, ROWS, env, mounted)
    assert found == ([problem] if problem else [])


# --- image_facts.py on a fake site, and image-facts.sh with a stand-in docker ---------------------


def build_nccl(path: Path, code: int, banner: str | None) -> Path:
    """A shared library that answers ncclGetVersion with `code` and carries NCCL's banner (as
    src/init.cc builds it into the library) unless `banner` is None."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in libnccl")
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / f"{path.name}.c"
    text = f"int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n"
    if banner is not None:
        text += f'const char nccl_banner[] = "{banner}";\n'
    source.write_text(text)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(path), str(source)], check=True, timeout=60)
    return path


def wheel_site(tmp_path: Path, banner: str) -> dict[str, str]:
    """A fake site whose torch NCCL wheel is a file holding `banner` (read as bytes, not run)."""
    env = fake_site(tmp_path)
    wheel = tmp_path / "site" / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"\x7fELF" + b"\0" * 4096 + banner.encode() + b"\0" * 64)
    return env


def probe(env: dict[str, str], *nccl_args: str) -> subprocess.CompletedProcess[str]:
    argv = ["python3", "-S", str(SCRIPTS / "image_facts.py"), "[]", "yes", "ray", "no", "[]"]
    return subprocess.run([*argv, *nccl_args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})  # fmt: skip


def test_the_facts_name_the_wheels_nccl_read_from_its_banner(tmp_path: Path) -> None:
    env = wheel_site(tmp_path, "NCCL version 2.28.9+cuda13.0")
    done = probe(env, "[]", "{}", HOST)
    assert done.returncode == 0, done.stderr
    found = parse_image_facts(done.stdout)
    assert found["ncclPath"] == str(tmp_path / "site/nvidia/nccl/lib/libnccl.so.2")
    assert (found["ncclVersion"], found["ncclFrom"]) == ("2.28.9", "torch's nvidia-nccl wheel")
    assert found["hostNccl"] == HOST


def test_the_image_refuses_its_known_bad_nccl_unless_the_models_neutralise_it(
    tmp_path: Path,
) -> None:
    env = wheel_site(tmp_path, f"NCCL version {BAD}+cuda13.2")
    refused = probe(env, json.dumps(ROWS), "{}", "")
    assert refused.returncode == 3
    assert f"problem: image.ref: the image's NCCL {BAD} (" in refused.stderr
    served = probe(env, json.dumps(ROWS), json.dumps({"NCCL_NVLS_ENABLE": "0"}), "")
    assert served.returncode == 0, served.stderr


def test_vllm_nccl_so_path_wins_and_a_library_without_banner_answers_nccl_get_version(
    tmp_path: Path,
) -> None:
    env = wheel_site(tmp_path, "NCCL version 2.28.9+cuda13.0")
    library = build_nccl(tmp_path / "lib" / "libnccl.so.2", 22703, banner=None)
    done = probe({**env, "VLLM_NCCL_SO_PATH": str(library)}, "[]", "{}", "")
    assert done.returncode == 0, done.stderr
    found = parse_image_facts(done.stdout)
    assert (found["ncclPath"], found["ncclVersion"]) == (str(library), "2.27.3")
    assert found["ncclFrom"] == "VLLM_NCCL_SO_PATH"


def test_a_host_library_that_does_not_load_in_the_image_is_refused(tmp_path: Path) -> None:
    env = wheel_site(tmp_path, "NCCL version 2.28.9+cuda13.0")
    broken = tmp_path / "host" / "libnccl.so.2"
    broken.parent.mkdir()
    broken.write_text("NCCL version 2.28.9+cuda13.0 but not a library\n")
    done = probe({**env, "VLLM_NCCL_SO_PATH": str(broken)}, "[]", "{}", str(broken), str(broken))
    assert done.returncode == 3
    assert f"problem: vllm.hostNccl: the host's NCCL ({broken}) does not load in this image: " in (
        done.stderr
    )


def host_library(root: Path, version: str, code: int) -> Path:
    """libnccl2's layout: the soname link to the file named after its release."""
    real = build_nccl(root / f"libnccl.so.{version}", code, f"NCCL version {version}+cuda13.0")
    link = root / "libnccl.so.2"
    link.symlink_to(real.name)
    return link


def fake_ldconfig(bin_dir: Path, library: Path | None) -> None:
    """`ldconfig -p` as glibc prints it, listing `library` as libnccl.so.2 (none: no NCCL)."""
    listed = f"\tlibnccl.so.2 (libc6,AArch64) => {library}\n" if library else ""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "ldconfig").write_text(
        f"#!/bin/sh\nprintf '%s' '{len(listed.splitlines())} libs found in cache\n"
        f"\tlibc.so.6 (libc6,AArch64) => /lib/libc.so.6\n{listed}'\n"
    )
    (bin_dir / "ldconfig").chmod(0o755)


def bundle_dir(tmp_path: Path) -> Path:
    """The scripts as a host installs them: the bundle, known-bad list included."""
    target = tmp_path / "state-bin"
    packed = decompress(b64decode(scripts_bundle().archive_b64))
    with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
        tar.extractall(target, filter="data")
    return target


def image_facts_sh(tmp_path: Path, env: dict[str, str], *flags: str) -> Any:
    (tmp_path / "bin" / "docker").write_text(FAKE_DOCKER)
    (tmp_path / "bin" / "docker").chmod(0o755)
    argv = ["bash", str(bundle_dir(tmp_path) / "image-facts.sh"), "--host", "spark2",
            "--image", "sha256:abc", "--ref", "example/vllm:1", "--extra-args", "[]",
            "--check-flags", "no", "--executor", "mp", "--timeout-seconds", "60",
            "--enable-linger", "yes", *flags]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env, "FAKE_ARCH": HOST_ARCH})  # fmt: skip


def test_the_step_reports_the_hosts_nccl_and_refuses_the_images_known_bad_one(
    tmp_path: Path,
) -> None:
    env = wheel_site(tmp_path, f"NCCL version {BAD}+cuda13.2")
    host = host_library(tmp_path / "usr-lib", "2.28.9", 22809)
    fake_ldconfig(tmp_path / "bin", host)
    refused = image_facts_sh(tmp_path, env)
    assert refused.returncode == 1
    first = refused.stderr.splitlines()[0]
    assert first.startswith(
        "spark-vllm: spark2: image-facts: the image cannot serve this stack: image.ref "
        f"example/vllm:1: the image's NCCL {BAD} ("
    ), first
    assert '(NVIDIA/nccl#2167): set NCCL_NVLS_ENABLE: "0" in vllm.env' in first
    served = image_facts_sh(tmp_path, env, "--nccl-env", '{"NCCL_NVLS_ENABLE": "0"}')
    assert served.returncode == 0, served.stderr
    found = parse_image_facts(served.stdout)
    assert (found["ncclVersion"], found["hostNccl"]) == (BAD, str(host))


def test_with_host_nccl_the_step_loads_the_hosts_library_as_the_servers_will(
    tmp_path: Path,
) -> None:
    env = wheel_site(tmp_path, f"NCCL version {BAD}+cuda13.2")
    host = host_library(tmp_path / "usr-lib", "2.28.9", 22809)
    fake_ldconfig(tmp_path / "bin", host)
    flags = ("--host-nccl", str(host), "--nccl-target", CONTAINER_HOST_NCCL)
    done = image_facts_sh(tmp_path, env, *flags)
    assert done.returncode == 0, done.stderr  # the image's bad wheel is not what loads
    found = parse_image_facts(done.stdout)
    assert (found["ncclVersion"], found["ncclFrom"]) == ("2.28.9", "VLLM_NCCL_SO_PATH")
    # A host whose own is the bad release: refused, keyed to the setting.
    bad_host = host_library(tmp_path / "bad-lib", BAD, 23004)
    refused = image_facts_sh(tmp_path, env, "--host-nccl", str(bad_host),
                             "--nccl-target", CONTAINER_HOST_NCCL)  # fmt: skip
    assert refused.returncode == 1
    assert f"vllm.hostNccl: the host's NCCL {BAD} ({bad_host}) is known to break" in (
        refused.stderr
    )


def test_the_bundle_ships_the_known_bad_list_the_plan_holds() -> None:
    packed = decompress(b64decode(scripts_bundle().archive_b64))
    with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
        member = tar.extractfile(NCCL_KNOWN_BAD_FILE)
        assert member is not None
        assert json.loads(member.read()) == known_bad_rows()


# --- facts.sh: the host's own NCCL, read on every run ---------------------------------------------


def test_host_facts_name_the_hosts_nccl_and_its_release(host_tmp: Path) -> None:
    host = host_library(host_tmp / "usr-lib", "2.28.9", 22809)
    fake_ldconfig(host_tmp / "bin", host)
    path = f"{host_tmp / 'bin'}:{os.environ['PATH']}"
    found = facts(host_tmp / "state", env={"PATH": path})
    assert found["nccl"] == f"{host} {host.parent / 'libnccl.so.2.28.9'}"
    parsed = parse_facts("spark1", f"spark-vllm-facts 1\nnccl {found['nccl']}\n")
    assert parsed.nccl == HostNccl(str(host), "2.28.9")
    fake_ldconfig(host_tmp / "bin", None)
    assert "nccl" not in facts(host_tmp / "state", env={"PATH": path})


# --- the plan: vllm.hostNccl ----------------------------------------------------------------------


class HostsWithNccl(FakeHosts):
    """Hosts whose facts list their own NCCL (libnccl2 `version`): those of `having` (their
    addresses)."""

    def __init__(self, having: set[str], version: str = "2.28.9") -> None:
        super().__init__()
        self.having, self.version = having, version

    def call(self, args):  # type: ignore[no-untyped-def]
        answer, failures = super().call(args)
        command = args.args["command"]
        if any(f"@{address} " in command for address in self.having):
            resolved = f"/usr/lib/aarch64-linux-gnu/libnccl.so.{self.version}"
            answer["stdout"] += f"nccl {HOST} {resolved}\n"
        return answer, failures


EVERY_HOST = {"10.240.1.11", "10.240.1.12"}


def host_nccl_config(make_config: ConfigFactory, executor: str = "ray") -> dict[str, Any]:
    config = make_config(executor=executor)
    config["vllm"]["hostNccl"] = True
    return config


def test_host_nccl_refuses_a_host_without_its_own_naming_the_fix(
    make_config: ConfigFactory,
) -> None:
    with pytest.raises(Exception) as caught:
        evaluate(host_nccl_config(make_config), SECRETS, mocks=HostsWithNccl({"10.240.1.11"}))
    assert type(caught.value).__name__ == "RunError", repr(caught.value)
    assert str(caught.value) == (
        "invalid spark-vllm configuration:\nvllm.hostNccl: spark2 has no NCCL of its own (no "
        "libnccl.so.2 in its loader cache, `ldconfig -p`): install it there (`sudo apt install "
        "libnccl2`, NVIDIA's CUDA repository on DGX OS), or set vllm.hostNccl: false to use the "
        "image's"
    )


def test_host_nccl_refuses_a_hosts_known_bad_release_unless_the_models_neutralise_it(
    make_config: ConfigFactory,
) -> None:
    """Read from the host's facts on every run: an `apt upgrade` to it is refused by the next
    `up`, before anything is declared."""
    config = host_nccl_config(make_config)
    with pytest.raises(Exception) as caught:
        evaluate(config, SECRETS, mocks=HostsWithNccl(EVERY_HOST, BAD))
    assert str(caught.value).splitlines()[1:] == [
        f"vllm.hostNccl: {node}'s NCCL {BAD} ({HOST}) is known to break this workload: its NVLS "
        "path hangs collectives silently on Sparks (no NVLink), with no error logged "
        '(NVIDIA/nccl#2167): set NCCL_NVLS_ENABLE: "0" in vllm.env (or each models[].env), or '
        "install another libnccl2 release there, or set vllm.hostNccl: false"
        for node in ("spark1", "spark2")
    ]
    config["vllm"]["env"] = {"NCCL_NVLS_ENABLE": "0"}
    evaluate(config, SECRETS, mocks=HostsWithNccl(EVERY_HOST, BAD))  # neutralised: planned


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_host_nccl_mounts_the_hosts_library_into_every_ray_and_vllm_container(
    make_config: ConfigFactory, executor: str
) -> None:
    ev = evaluate(host_nccl_config(make_config, executor), SECRETS, mocks=HostsWithNccl(EVERY_HOST))
    served = [r for r in ev.registrations if r.typ == "docker:index/container:Container"
              and r.name.startswith(("ray-", "vllm"))]  # fmt: skip
    expected = {"ray": ["ray-head", "ray-spark2", "vllm-container"],
                "mp": ["vllm-container", "vllm-spark2"]}  # fmt: skip
    assert sorted(r.name for r in served) == expected[executor]
    for container in served:
        envs = container.inputs["envs"]
        assert f"VLLM_NCCL_SO_PATH={CONTAINER_HOST_NCCL}" in envs, container.name
        assert f"LD_PRELOAD={CONTAINER_HOST_NCCL}" in envs, container.name
        mounts = {(m["source"], m["target"], m.get("readOnly")) for m in container.inputs["mounts"]}
        assert (HOST, CONTAINER_HOST_NCCL, True) in mounts, container.name
    for node in ("spark1", "spark2"):  # each node's image check loads it as the servers will
        flags = facts_flags(ev, node)
        assert (flags["--host-nccl"], flags["--nccl-target"]) == (HOST, CONTAINER_HOST_NCCL)


def facts_flags(ev: Any, node: str) -> dict[str, str]:
    words = shlex.split(ev.named(f"image-{node}-facts").inputs["create"])
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}


def test_without_host_nccl_nothing_changes_even_where_the_host_has_one(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HostFacts, "token", steady_token)  # the same receipts' tokens both runs
    plain = evaluate(make_config(), SECRETS)
    with_library = evaluate(make_config(), SECRETS, mocks=HostsWithNccl(EVERY_HOST))
    inputs = {r.urn: r.inputs for r in plain.registrations}
    assert {r.urn: r.inputs for r in with_library.registrations} == inputs
    for container in (r for r in plain.registrations if r.inputs.get("envs")):
        assert not [e for e in container.inputs["envs"] if e.startswith("LD_PRELOAD=")]
    assert not {"--host-nccl", "--nccl-env"} & set(facts_flags(plain, "spark1"))


def test_the_models_neutraliser_reaches_every_nodes_image_check(make_config: ConfigFactory) -> None:
    config = make_config()
    config["vllm"]["env"] = {"NCCL_NVLS_ENABLE": "0"}
    ev = evaluate(config, SECRETS)
    for node in ("spark1", "spark2"):
        assert json.loads(facts_flags(ev, node)["--nccl-env"]) == {"NCCL_NVLS_ENABLE": "0"}


@pytest.mark.parametrize("key", ["VLLM_NCCL_SO_PATH", "LD_PRELOAD"])
def test_host_nccl_refuses_an_env_that_points_elsewhere(
    make_config: ConfigFactory, key: str
) -> None:
    config = host_nccl_config(make_config)
    config["vllm"]["env"] = {key: "/opt/nccl/libnccl.so.2"}
    with pytest.raises(Exception) as caught:
        evaluate(config, SECRETS, mocks=HostsWithNccl(EVERY_HOST))
    assert f"vllm.env.{key}: vllm.hostNccl sets it (to the host's NCCL, mounted in every " in str(
        caught.value
    )


# --- the stack's own known-bad NCCL releases (preflight.knownBad, kind nccl) -----------------


def test_a_stacks_own_known_bad_nccl_reaches_the_image_check_not_preflight(
    make_config: ConfigFactory,
) -> None:
    """An entry of kind nccl joins the shipped list in the image check (a pattern allowed);
    preflight's kernel and driver list never sees it, and a stack without one keeps the
    image check's command as it was."""
    plain = make_config(hosts=2)
    config = make_config(hosts=2)
    config["preflight"] = {"knownBad": [
        {"kind": "nccl", "version": "2.31.*", "reason": "wedges under load after 20 minutes",
         "source": "https://example.org/report"},
        {"kind": "kernel", "version": "6.99.0", "reason": "a test kernel"},
    ]}  # fmt: skip
    plan, before = plan_of(config), plan_of(plain)
    stream = image_streams(plan)[0]
    facts = image.image_facts(plan, plan.head, stream).create
    assert "--known-bad-nccl" not in image.image_facts(before, before.head, stream).create
    words = shlex.split(facts)
    rows = json.loads(words[words.index("--known-bad-nccl") + 1])
    assert rows == [{"version": "2.31.*", "what": "wedges under load after 20 minutes",
                     "source": "https://example.org/report", "neutraliser": ""}]  # fmt: skip
    assert known_bad_flag(plan.config) == "kernel|6.99.0|a test kernel|"
    refused = load("image_facts").nccl_problems({**IMAGE, "version": "2.31.2"}, rows, {}, "")
    assert refused == [
        f"image.ref: the image's NCCL 2.31.2 ({IMAGE['path']}) is known to break this "
        "workload: wedges under load after 20 minutes (https://example.org/report): use an "
        "image with another NCCL, or set vllm.hostNccl: true"
    ]
    assert load("image_facts").nccl_problems({**IMAGE, "version": "2.30.9"}, rows, {}, "") == []


def test_the_image_check_refuses_a_release_on_the_stacks_own_list(tmp_path: Path) -> None:
    """image_facts.py as the step runs it: the shipped rows, then the stack's own."""
    env = wheel_site(tmp_path, "NCCL version 2.31.2+cuda13.2")
    own = [{"version": "2.31.*", "what": "wedges", "source": "s", "neutraliser": ""}]
    refused = probe(env, json.dumps(ROWS), "{}", "", "", json.dumps(own))
    assert refused.returncode == 3
    assert "problem: image.ref: the image's NCCL 2.31.2 (" in refused.stderr
    assert probe(env, json.dumps(ROWS), "{}", "", "", "[]").returncode == 0


def test_host_nccl_refuses_a_release_on_the_stacks_own_list(make_config: ConfigFactory) -> None:
    """The stack's own rows hold the host's library too, before anything is declared."""
    config = host_nccl_config(make_config)
    config["preflight"] = {"knownBad": [
        {"kind": "nccl", "version": "2.28.*", "reason": "wedges a TP=2 server under load",
         "source": "vllm#42354"},
    ]}  # fmt: skip
    plan = plan_of(config)
    found = {node.name: HostNccl(HOST, "2.28.9") for node in plan.nodes}
    assert host_nccl_problems(plan, found) == [
        f"vllm.hostNccl: {node.name}'s NCCL 2.28.9 ({HOST}) is known to break this workload: "
        "wedges a TP=2 server under load (vllm#42354): install another libnccl2 release there, "
        "or set vllm.hostNccl: false"
        for node in plan.nodes
    ]
    found = {node.name: HostNccl(HOST, "2.29.1") for node in plan.nodes}
    assert host_nccl_problems(plan, found) == []
