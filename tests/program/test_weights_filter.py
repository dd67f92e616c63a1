"""A model's `include`/`exclude` patterns: matched as the Hugging Face Hub client matches them
(weights_filter.py, a table of its own examples), passed to its fetch (hf_fetch.py), and applied
to the manifest, the receipts and the copy to a worker (the real scripts against fixture HF
caches): a file outside them is neither fetched, counted nor copied."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from components.bundle import facts_script
from stacks.plan import weights
from stacks.plan.server_plan import per_server
from tests.program.conftest import ConfigFactory
from tests.program.planning import error_of, fleet, known, plan_of
from tests.program.previews import plan
from tests.program.scripting import SCRIPTS, fake_bin, load, run

weights_filter = load("weights_filter")

COMMIT = "c" * 40

# (path, include, exclude) -> kept. The rules are huggingface_hub's (utils/_paths.py
# filter_repo_objects and its docstring's examples): fnmatchcase, `*` across "/", a pattern
# ending in "/" is a directory, allow first, then ignore.
MATCHES = [
    # the docstring's example: PDFs that are not hidden
    ("aaa.pdf", ["*.pdf"], [".*"], True),
    ("bbb.jpg", ["*.pdf"], [".*"], False),
    (".ccc.pdf", ["*.pdf"], [".*"], False),
    (".ddd.png", ["*.pdf"], [".*"], False),
    # "data/*.json" matches data/subdir/file.json too: `*` crosses "/" (unlike bash globs)
    ("data/file.json", ["data/*.json"], [], True),
    ("data/subdir/file.json", ["data/*.json"], [], True),
    # so "*.gguf" reaches into directories, and "*" is everything
    ("metal/model.gguf", [], ["*.gguf"], False),
    ("config.json", ["*"], [], True),
    # a directory pattern gets "*" appended: everything beneath it, at any depth
    ("original/consolidated.safetensors", [], ["original/"], False),
    ("original/params/x.json", [], ["original/"], False),
    ("originals.json", [], ["original/"], True),
    # anchored at the snapshot's top: "original/*" is not "*/original/*"
    ("sub/original/x", [], ["original/*"], True),
    # case-sensitive on every platform (fnmatchcase)
    ("MODEL.GGUF", [], ["*.gguf"], True),
    # `\` is a path separator, never an escape (_normalize_separators)
    ("original/x.bin", [], ["original\\*"], False),
    # no patterns: everything; an include list: only what matches one of them
    ("anything/at/all", [], [], True),
    ("tokenizer.json", ["*.safetensors", "*.json"], [], True),
    ("README.md", ["*.safetensors", "*.json"], [], False),
    # the exclude applies after the include
    ("original/model.safetensors", ["*.safetensors"], ["original/*"], False),
    # character classes and `?`, as fnmatch has them
    ("model-00001-of-00002.safetensors", ["model-0000[0-9]-of-*"], [], True),
    ("model.bin", ["model.?in"], [], True),
]


@pytest.mark.parametrize(("path", "include", "exclude", "expected"), MATCHES)
def test_patterns_match_as_the_hub_client_matches_them(
    path: str, include: list[str], exclude: list[str], expected: bool
) -> None:
    assert weights_filter.kept(path, include, exclude) is expected


def test_count_reads_find_records_with_spaces_in_names() -> None:
    records = b"10 config.json\x0020 original/a b.safetensors\x0030 model.gguf\x00"
    assert weights_filter.count(records, [], ["original/*", "*.gguf"]) == (1, 10)
    assert weights_filter.count(records, [], []) == (3, 60)


# --- the snapshot on the hosts ---------------------------------------------------------------

SERVED = {"config.json": b"{}", "model.safetensors": b"w" * 1000, "tokenizer.json": b"t" * 10}
UNSERVED = {"original/consolidated.safetensors": b"o" * 5000, "model.gguf": b"g" * 3000}
EXCLUDE = json.dumps(["original/*", "*.gguf"])


def make_snapshot(cache: Path, files: dict[str, bytes]) -> Path:
    """An HF cache holding `files` as the hub client stores them: blobs named by their sha256,
    the snapshot's links into them, refs/main naming the commit."""
    repo = cache / "hub" / "models--org--m"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").mkdir(exist_ok=True)
    snapshot = repo / "snapshots" / COMMIT
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / blob, link.parent))
    return snapshot


def manifest(cache: Path, *filter_flags: str) -> subprocess.CompletedProcess[str]:
    return run("hf-manifest.sh", "--host", "node1", "--cache-dir", str(cache),
               "--model", "org/m", "--revision", "main", *filter_flags)  # fmt: skip


def test_the_manifest_counts_only_the_files_the_patterns_keep(tmp_path: Path) -> None:
    make_snapshot(tmp_path, {**SERVED, **UNSERVED})
    assert manifest(tmp_path).stdout.strip() == f"{COMMIT} 5 9012"
    kept = manifest(tmp_path, "--exclude", EXCLUDE)
    assert kept.stdout.strip() == f"{COMMIT} 3 1012", kept.stderr
    only = manifest(tmp_path, "--include", json.dumps(["*.json"]))
    assert only.stdout.strip() == f"{COMMIT} 2 12", only.stderr
    none = manifest(tmp_path, "--include", json.dumps(["*.bin"]))
    assert none.returncode == 1
    assert "is kept by include" in none.stderr
    assert "likely cause: the model's include/exclude leave none of its files" in none.stderr


def facts(state_dir: Path) -> dict[str, str]:
    """facts.sh as the program runs it (components/bundle.py facts_script): from stdin."""
    cache = state_dir.parent / "hf"
    done = subprocess.run(["bash", "-s", "--", str(state_dir), str(cache)], input=facts_script(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The receipts' lines; not what this machine's own Docker holds (test_key_labels.py).
    lines = [x for x in done.stdout.splitlines()[1:] if not x.startswith(MACHINE_DOCKER_LINES)]
    return dict(line.split(" ", 1) for line in lines)


MACHINE_DOCKER_LINES = ("key-label ", "key-label-error ", "dockerd-arg ", "daemon-json ")


def test_a_receipt_checks_the_kept_files_only(host_tmp: Path) -> None:
    """What the fetch and copy steps record (stacks/plan/weights.py snapshot_check), re-checked
    as every run re-checks it: a change to a file left out is no change; a kept one is."""
    state, cache = host_tmp / "state", host_tmp / "hf"
    shutil.copytree(SCRIPTS, state / "bin")  # the scripts step installed them
    snapshot = make_snapshot(cache, {**SERVED, **UNSERVED})
    checks = f"snapshot|{cache}|org/m|main|[]|{EXCLUDE}"
    run("receipt.sh", "--host", "node1", "--state-dir", str(state), "--step", "w-fetch",
        "--token", "t1", "--checks", checks, check=True)  # fmt: skip
    recorded = (state / "receipts" / "w-fetch").read_text().splitlines()[1]
    assert recorded == f"snapshot|{cache}|org/m|{COMMIT}|3|1012|[]|{EXCLUDE}"
    assert facts(state) == {"w-fetch": "t1"}
    (snapshot / "model.gguf").unlink()
    assert facts(state) == {"w-fetch": "t1"}
    (snapshot / "tokenizer.json").unlink()
    assert facts(state) == {"w-fetch": f"- model org/m: {COMMIT} 2 1002 (was {COMMIT} 3 1012)"}


# The worker's end of the fabric, here: the remote command runs with bash after the head's cache
# path is replaced by the worker's (the config's cacheDir is one path on every host).
WORKER_SSH = """#!/usr/bin/env bash
while [ $# -gt 0 ]; do
  case "$1" in -o|-i|-c|-O) shift 2 ;; -A|-n|-T) shift ;; *) break ;; esac
done
shift
command="$*"
exec bash -c "${command//"$HEAD_CACHE"/"$WORKER_CACHE"}"
"""


def copy_to_worker(head: Path, worker: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    said = manifest(head, "--exclude", EXCLUDE).stdout.strip()
    env = {**fake_bin(tmp_path, ssh=WORKER_SSH), "HEAD_CACHE": str(head),
           "WORKER_CACHE": str(worker)}  # fmt: skip
    return run("weights-sync.sh", "--host", "spark1", "--worker", "spark2",
               "--target", "ssh://u@10.0.0.2:22", "--worker-bin", str(SCRIPTS),
               "--cache-dir", str(head), "--model", "org/m", "--manifest", said,
               "--exclude", EXCLUDE, "--timeout-minutes", "1", env=env)  # fmt: skip


def worker_files(worker: Path) -> set[str]:
    snapshot = worker / "hub" / "models--org--m" / "snapshots" / COMMIT
    return {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if not p.is_dir()}


def test_the_copy_sends_only_the_kept_files_though_the_head_holds_more(tmp_path: Path) -> None:
    """The head's cache holds a fuller snapshot (an earlier fetch without patterns): the worker
    gets the kept files, their blobs and nothing else, and its manifest is the head's."""
    head, worker = tmp_path / "head", tmp_path / "worker"
    make_snapshot(head, {**SERVED, **UNSERVED})
    done = copy_to_worker(head, worker, tmp_path)
    assert done.returncode == 0, done.stderr
    assert worker_files(worker) == set(SERVED)
    blobs = worker / "hub" / "models--org--m" / "blobs"
    assert sum(blob.stat().st_size for blob in blobs.iterdir()) == 1012
    sent = json.loads(done.stdout.splitlines()[-1].split(" ", 1)[1])
    assert (sent["sent"], sent["total"]) == (3, 1012)
    # Run again: the worker holds what is kept; nothing is sent.
    again = copy_to_worker(head, worker, tmp_path)
    assert "nothing more to copy" in again.stdout, again.stderr


def test_a_worker_holding_more_than_is_kept_is_sent_nothing(tmp_path: Path) -> None:
    """A worker copied to before the patterns keeps its files (nothing outside what we created
    is deleted), and its kept files match the head's: nothing to send."""
    head, worker = tmp_path / "head", tmp_path / "worker"
    make_snapshot(head, {**SERVED, **UNSERVED})
    make_snapshot(worker, {**SERVED, **UNSERVED})
    done = copy_to_worker(head, worker, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "nothing more to copy" in done.stdout
    assert worker_files(worker) == set(SERVED) | set(UNSERVED)


# --- the fetch, with a stand-in hub client -----------------------------------------------------

# huggingface_hub as hf_fetch.py calls it: each call's arguments are logged to $FAKE_HUB_LOG; the
# "download" stores the whole repository whatever the patterns (a cache fuller than they keep),
# so the manifest's count is the scripts' own filtering.
FAKE_HUB_INIT = """
import json, os
from pathlib import Path
from huggingface_hub.constants import HF_HUB_CACHE

def snapshot_download(model, revision, local_files_only=False, token=None, **patterns):
    with open(os.environ["FAKE_HUB_LOG"], "a") as log:
        log.write(json.dumps({"local_files_only": local_files_only, **patterns}) + "\\n")
    if local_files_only:
        raise FileNotFoundError("LocalEntryNotFoundError")
    snapshot = Path(HF_HUB_CACHE) / "models--org--m" / "snapshots" / ("c" * 40)
    for name, size in json.loads(os.environ["FAKE_HUB_FILES"]).items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(b"x" * size)
    return str(snapshot)
"""

FAKE_HUB_CONSTANTS = """
import os
HF_HUB_CACHE = os.path.join(os.environ["HF_HOME"], "hub")
"""

# docker run ... -v CACHE:/hf ... --entrypoint python3 IMAGE /spark-vllm/hf_fetch.py ARGS
FAKE_DOCKER = f"""#!/usr/bin/env bash
while [ $# -gt 0 ]; do
  case "$1" in
    -v) case "$2" in *:/hf) export HF_HOME="${{2%:/hf}}" ;; esac; shift 2 ;;
    --entrypoint) shift 3; break ;;
    *) shift ;;
  esac
done
shift  # /spark-vllm/hf_fetch.py
exec python3 {SCRIPTS}/hf_fetch.py "$@"
"""


def fetch(tmp_path: Path, *filter_flags: str) -> tuple[str, list[dict[str, object]]]:
    hub = tmp_path / "fakehub" / "huggingface_hub"
    hub.mkdir(parents=True)
    (hub / "__init__.py").write_text(FAKE_HUB_INIT)
    (hub / "constants.py").write_text(FAKE_HUB_CONSTANTS)
    state, log = tmp_path / "state", tmp_path / "log"
    state.mkdir()
    (state / "image-id").write_text("sha256:img")
    files = {name: len(data) for name, data in {**SERVED, **UNSERVED}.items()}
    env = {**fake_bin(tmp_path, docker=FAKE_DOCKER), "PYTHONPATH": str(tmp_path / "fakehub"),
           "FAKE_HUB_LOG": str(log), "FAKE_HUB_FILES": json.dumps(files)}  # fmt: skip
    done = run("weights-fetch.sh", "--host", "spark1", "--state-dir", str(state),
               "--cache-dir", str(tmp_path / "cache"), "--model", "org/m", "--revision", COMMIT,
               "--timeout-minutes", "1", *filter_flags, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1], [json.loads(line) for line in log.read_text().split("\n")
                                          if line]  # fmt: skip


def test_the_fetch_passes_the_patterns_to_both_hub_calls(tmp_path: Path) -> None:
    """The cache check and the download alike: the client judges a cached snapshot complete by
    the files the patterns keep, so widening them fetches what was left out."""
    said, calls = fetch(tmp_path, "--include", json.dumps(["*"]), "--exclude", EXCLUDE)
    patterns = {"allow_patterns": ["*"], "ignore_patterns": ["original/*", "*.gguf"]}
    assert calls == [
        {"local_files_only": True, **patterns},
        {"local_files_only": False, **patterns},
    ]
    assert said == f"{COMMIT} 3 1012"


def test_a_fetch_without_patterns_passes_none_not_an_empty_allow_list(tmp_path: Path) -> None:
    """The hub client's empty allow list keeps nothing (`allow_patterns is not None and not
    any(...)`): no patterns must reach it as None."""
    said, calls = fetch(tmp_path)
    none = {"allow_patterns": None, "ignore_patterns": None}
    assert calls == [{"local_files_only": True, **none}, {"local_files_only": False, **none}]
    assert said == f"{COMMIT} 5 9012"


# --- the program ------------------------------------------------------------------------------


def test_the_steps_carry_the_patterns_only_when_there_are_some(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    plain = per_server(plan_of(config))[0]
    assert "--exclude" not in known(weights.fetch_weights(plain)).create
    config["model"]["exclude"] = ["original/*", "*.gguf"]
    filtered = per_server(plan_of(config))[0]
    fetch_step = known(weights.fetch_weights(filtered))
    assert f"--exclude '{EXCLUDE}'" in fetch_step.create
    assert "--include" not in fetch_step.create
    assert fetch_step.receipts[0].checks[-1].endswith(f"|main|[]|{EXCLUDE}")
    copy_step = known(weights.copy_weights(filtered, filtered.workers[0]))
    assert f"--exclude '{EXCLUDE}'" in copy_step.create
    assert copy_step.receipts[0].checks[-1].endswith(f"|[]|{EXCLUDE}")


# Adding (or changing) patterns on a deployed stack: the fetch runs again (the hub client
# fetches what the patterns now keep) and so does each copy (it sends what the worker lacks of
# it); the server is not touched: its arguments do not name the patterns.
FILTERING = {"weights-fetch": "update", "weights-spark2-copy": "update"}


def test_adding_patterns_reruns_the_fetch_and_the_copies_only(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    filtered = copy.deepcopy(config)
    filtered["model"]["exclude"] = ["original/*", "*.gguf", "metal/*"]
    assert plan(config, filtered) == FILTERING
    changed = copy.deepcopy(filtered)
    changed["model"]["exclude"] = ["original/*"]
    assert plan(filtered, changed) == FILTERING
    assert plan(filtered, filtered) == {}


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("", "is empty"),
        ("/etc/*", "starts with '/'"),
        ("../other/*", "has a '..' part"),
        ("a\\..\\b", "has a '..' part"),
        ("a|b", "holds '|', ';' or a control character"),
        ("a\nb", "holds '|', ';' or a control character"),
    ],
)
def test_a_pattern_outside_the_snapshot_is_refused_with_its_key(
    make_config: ConfigFactory, pattern: str, problem: str
) -> None:
    config = make_config(hosts=2)
    config["model"]["exclude"] = ["*.gguf", pattern]
    assert problem in error_of(config).split("model.exclude[1]: ")[1]


def test_with_models_the_patterns_belong_to_each_entry(make_config: ConfigFactory) -> None:
    config = fleet(make_config, 2)
    config["model"]["include"] = ["*.safetensors"]
    assert "model.include: `models` lists the models; set it on each entry" in error_of(config)
