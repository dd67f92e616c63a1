"""A model's revision is resolved once and pinned: the decision as a table (hf_fetch.py), the
fetch as the head runs it (weights-fetch.sh with a stand-in hub), and the warning naming the
commit to write into the stack."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from stacks.fleet import ServedModel
from stacks.plan.weights import unpinned_revision_warning
from stacks.schema import ImageConfig, ServerSettings
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import Evaluation, evaluate
from tests.program.planning import fleet
from tests.program.previews import plan
from tests.program.scripting import SCRIPTS, fake_bin, load, run

C1, C2, C3 = "1" * 40, "2" * 40, "3" * 40

hf_fetch = load("hf_fetch")

# (configured revision, the stack's pin record, the cache's refs/<revision>) -> what to fetch
PIN_TABLE = [
    # a commit is fetched as written, whatever was pinned or cached
    (C3, f"org/m main {C1}", C2, C3),
    # the first fetch: nothing recorded, nothing cached: the hub resolves the branch
    ("main", "", "", "main"),
    # a re-run (new image, failed receipt): the commit the first fetch resolved
    ("main", f"org/m main {C1}", "", C1),
    # the pin wins over a cache ref another tool moved
    ("main", f"org/m main {C1}", C2, C1),
    # a changed revision is resolved anew: the pin is of another revision
    ("v2", f"org/m main {C1}", "", "v2"),
    # no pin yet, but the cache resolved it (an interrupted first fetch, or a deployment made
    # before pins): that commit, not the branch's new head
    ("main", "", C2, C2),
    # a pin of another model (model.id changed, same revision) does not count
    ("main", f"org/other main {C1}", "", "main"),
    # a damaged record does not count
    ("main", "org/m main not-a-commit", "", "main"),
    ("main", f"org/m main {C1} extra", "", "main"),
    # a cache ref that is not a commit does not count
    ("main", "", "garbage", "main"),
]


@pytest.mark.parametrize(("revision", "pin", "cached", "fetched"), PIN_TABLE)
def test_revision_to_fetch(revision: str, pin: str, cached: str, fetched: str) -> None:
    assert hf_fetch.revision_to_fetch("org/m", revision, pin, cached) == fetched


@pytest.mark.parametrize(
    ("text", "commit"),
    [
        (C1, C1),  # as the hub client writes it
        (f"{C1}\n", C1),  # a line break added by hand
        ("", ""),  # a write cut short: no commit, resolved at the hub
        ("../../../etc", None),  # would name a path outside the snapshots
        (f"{C1}/../x", None),
        ("A" * 40, None),  # the hub writes lowercase hex
        ("main", None),  # a branch, not what it resolved to
    ],
)
def test_a_refs_file_names_a_commit_or_is_refused(text: str, commit: str | None) -> None:
    if commit is None:
        with pytest.raises(hf_fetch.NotACommit, match="not a commit"):
            hf_fetch.ref_commit("refs/main", text)
    else:
        assert hf_fetch.ref_commit("refs/main", text) == commit


def served(revision: str, key: str = "model") -> ServedModel:
    return ServedModel(
        model_key=key,
        settings_key=key,
        id="org/m",
        revision=revision,
        served_name="m",
        hosts=("spark1",),
        settings=ServerSettings(),
        image=ImageConfig(ref="vllm:x"),
    )


def test_warning_names_the_commit_to_pin_with_the_key_it_belongs_to() -> None:
    assert unpinned_revision_warning(served(C1), f"{C1} 3 100") is None
    warned = unpinned_revision_warning(served("main", "models[1]"), f"{C2} 3 100")
    assert warned is not None
    assert warned.endswith(f"Pin what was fetched: models[1].revision: {C2}")
    assert "models[1].revision main of org/m is a branch or tag" in warned


# --- the fetch on the head, with a stand-in hub ---------------------------------------------

# huggingface_hub as hf_fetch.py uses it: the hub's branches are $FAKE_HUB (JSON), every
# download is logged to $FAKE_HUB_LOG; a resolved revision writes refs/<revision> as the real
# client does (huggingface_hub _snapshot_download.py: `if revision != commit_hash`). No
# patterns here (test_weights_filter.py has them): hf_fetch.py passes None for each.
FAKE_HUB_INIT = """
import json, os, re
from pathlib import Path
from huggingface_hub.constants import HF_HUB_CACHE

def snapshot_download(model, revision, local_files_only=False, token=None,
                      allow_patterns=None, ignore_patterns=None):
    repo = Path(HF_HUB_CACHE) / ("models--" + model.replace("/", "--"))
    if local_files_only:
        commit = revision
        if not re.fullmatch("[0-9a-f]{40}", revision):
            ref = repo / "refs" / revision
            if not ref.exists():
                raise FileNotFoundError("LocalEntryNotFoundError")
            commit = ref.read_text()
        snapshot = repo / "snapshots" / commit
        if not (snapshot / "model.safetensors").exists():
            raise FileNotFoundError("LocalEntryNotFoundError")
        return str(snapshot)
    heads = json.loads(os.environ["FAKE_HUB"])
    if revision in heads.get("gone", ""):
        raise KeyError(f"RevisionNotFoundError: {revision}")
    commit = revision if re.fullmatch("[0-9a-f]{40}", revision) else heads[revision]
    with open(os.environ["FAKE_HUB_LOG"], "a") as log:
        log.write(f"download {commit}\\n")
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs" / commit).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    link = snapshot / "model.safetensors"
    if not link.is_symlink():
        link.symlink_to(f"../../blobs/{commit}")
    if revision != commit:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / revision).write_text(commit)
    return str(snapshot)
"""

FAKE_HUB_CONSTANTS = """
import os
HF_HUB_CACHE = os.path.join(os.environ["HF_HOME"], "hub")
"""

# docker run ... -v CACHE:/hf ... --entrypoint python3 IMAGE /spark-vllm/hf_fetch.py ARGS: runs
# the real hf_fetch.py here with the stand-in hub.
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


class Head:
    def __init__(self, tmp_path: Path) -> None:
        hub = tmp_path / "fakehub" / "huggingface_hub"
        hub.mkdir(parents=True)
        (hub / "__init__.py").write_text(FAKE_HUB_INIT)
        (hub / "constants.py").write_text(FAKE_HUB_CONSTANTS)
        self.state, self.cache, self.log = tmp_path / "state", tmp_path / "cache", tmp_path / "log"
        self.state.mkdir()
        (self.state / "image-id").write_text("sha256:img")
        self.log.write_text("")
        self.env = {
            **fake_bin(tmp_path, docker=FAKE_DOCKER),
            "PYTHONPATH": str(tmp_path / "fakehub"),
        }
        self.repo = self.cache / "hub" / "models--org--m"

    def fetch(self, revision: str, heads: dict[str, str]) -> str:
        done = self.run(revision, heads)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    def run(self, revision: str, heads: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return run(
            "weights-fetch.sh", "--host", "spark1", "--state-dir", str(self.state),
            "--cache-dir", str(self.cache), "--model", "org/m", "--revision", revision,
            "--timeout-minutes", "1",
            env={**self.env, "FAKE_HUB": json.dumps(heads), "FAKE_HUB_LOG": str(self.log)},
        )  # fmt: skip

    def downloads(self) -> list[str]:
        return self.log.read_text().split()[1::2]


def test_first_fetch_resolves_the_branch_and_records_the_commit(tmp_path: Path) -> None:
    head = Head(tmp_path)
    assert head.fetch("main", {"main": C1}) == f"{C1} 1 40"
    assert head.downloads() == [C1]
    assert (head.state / "weights-pins" / "org--m@main").read_text() == f"org/m main {C1}\n"


def test_a_moved_branch_is_not_followed_by_a_fetch_that_runs_again(tmp_path: Path) -> None:
    head = Head(tmp_path)
    head.fetch("main", {"main": C1})
    # intact snapshot: used as is, offline
    assert head.fetch("main", {"main": C2}) == f"{C1} 1 40"
    assert head.downloads() == [C1]
    # its blob deleted (the receipt failed) and another tool moved the cache's ref to the new
    # head: the fetch downloads the pinned commit again and points the ref back at it
    (head.repo / "blobs" / C1).unlink()
    (head.repo / "refs" / "main").write_text(C2)
    assert head.fetch("main", {"main": C2}) == f"{C1} 1 40"
    assert head.downloads() == [C1, C1]
    assert (head.repo / "refs" / "main").read_text() == C1


def test_an_interrupted_first_fetch_resumes_the_commit_it_resolved(tmp_path: Path) -> None:
    head = Head(tmp_path)
    # the hub client wrote the ref, then the download stopped: no snapshot, no pin
    (head.repo / "refs").mkdir(parents=True)
    (head.repo / "refs" / "main").write_text(C1)
    assert head.fetch("main", {"main": C2}) == f"{C1} 1 40"
    assert head.downloads() == [C1]


def test_a_changed_revision_is_resolved_anew(tmp_path: Path) -> None:
    head = Head(tmp_path)
    head.fetch("main", {"main": C1})
    assert head.fetch("v2", {"main": C2, "v2": C3}) == f"{C3} 1 40"
    assert head.fetch(C2, {"main": C2, "v2": C3}) == f"{C2} 1 40"
    assert head.downloads() == [C1, C3, C2]


def test_a_planted_refs_file_stops_the_fetch(tmp_path: Path) -> None:
    head = Head(tmp_path)
    (head.repo / "refs").mkdir(parents=True)
    (head.repo / "refs" / "main").write_text("../../../models--org--evil/snapshots/x")
    done = head.run("main", {"main": C1})
    assert done.returncode == 1
    assert (
        "refs/main of org/m in the HF cache holds "
        "'../../../models--org--evil/snapshots/x', not a commit" in done.stderr
    )
    assert "likely cause: something other than the hub client wrote that refs file" in (done.stderr)
    assert head.downloads() == []


# --- the program ----------------------------------------------------------------------------

MOCK_COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the harness's fetch manifest


def pin_warnings(ev: Evaluation) -> list[str]:
    return [w for w in ev.warnings if "is a branch or tag" in w]


def test_up_names_the_commit_to_pin_for_every_model_of_the_fleet(
    make_config: ConfigFactory,
) -> None:
    config = fleet(make_config, 2)
    config["models"][2]["revision"] = C3  # pinned already: not warned about
    warned = pin_warnings(evaluate(config, SECRETS))
    assert sorted(w.split("Pin what was fetched: ")[1] for w in warned) == [
        f"models[0].revision: {MOCK_COMMIT}",
        f"models[1].revision: {MOCK_COMMIT}",
    ], warned
    single = pin_warnings(evaluate(make_config(hosts=2), SECRETS))
    assert len(single) == 1
    assert single[0].endswith(f"Pin what was fetched: model.revision: {MOCK_COMMIT}")


# Writing the commit the warning names into the stack: the fetch runs again (the snapshot is
# complete: no download) and so does each copy (the worker's snapshot matches: nothing sent);
# the server restarts, since vLLM's `--revision` is an argument of its container.
PINNING = {
    "weights-fetch": "update",
    "weights-spark2-copy": "update",
    "vllm-container": "replace",
    "vllm-ready": "replace",
}


def test_a_deployed_stack_plans_nothing_until_its_revision_is_changed(
    make_config: ConfigFactory,
) -> None:
    """The branch's head is never read by the program: only the stack's revision plans."""
    config = make_config(hosts=2)
    assert plan(config, config) == {}
    pinned = copy.deepcopy(config)
    pinned["model"]["revision"] = MOCK_COMMIT
    assert plan(config, pinned) == PINNING


def test_a_pinned_commit_gone_from_the_hub_is_named_as_the_likely_cause(tmp_path: Path) -> None:
    head = Head(tmp_path)
    head.fetch("main", {"main": C1})
    (head.repo / "blobs" / C1).unlink()
    (head.repo / "snapshots" / C1 / "model.safetensors").unlink()
    done = head.run("main", {"main": C2, "gone": C1})  # the branch's history rewritten
    assert done.returncode == 1
    assert f"download of org/m@{C1} failed: KeyError" in done.stderr
    assert "the commit main was pinned to here is no longer on the hub" in done.stderr
    assert head.downloads() == [C1]  # and the new head was not taken instead
