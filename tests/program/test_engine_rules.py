"""The engine's and the Docker provider's day-two rules as the model plans them (tests/engine/,
tests/lab/engine.py): each test is one rule of ENGINE-NOTES.md's audit of 2026-12-04, on a
small state, with the model's boundary to the hosts (docker, ssh) replaced by a recorder.
The rules' sources are cited where the model implements them."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

import tests.lab.engine as lab_engine
from tests.engine.cascade import OldResource
from tests.engine.container_read import read_container
from tests.engine.diff import TYPE_COMMAND, TYPE_CONTAINER, TYPE_REMOTE_IMAGE, diff
from tests.engine.images import repo_digest
from tests.engine.steps import StepGenerator
from tests.lab import realmocks
from tests.lab.engine import NextUp
from tests.lab.realmocks import DockerHost, RealMocks, RegistrationOptions, RemoteResult

HOST = DockerHost("root", "10.0.0.1", 22, ())
PROVIDER = "urn:pulumi:lab::p::pulumi:providers:docker::spark1-docker"


def urn(typ: str, name: str) -> str:
    return f"urn:pulumi:lab::p::{typ}::{name}"


BASE = urn(TYPE_CONTAINER, "ray-head")
TARGETS = urn(TYPE_COMMAND, "ray-targets")


def container_inputs(image: str = "img:1") -> dict[str, Any]:
    return {
        "name": "ray-head",
        "image": image,
        "mustRun": True,
        "restart": "unless-stopped",
        "networkMode": "host",
        "mounts": [],
    }


def targets_inputs() -> dict[str, Any]:
    return {"create": "write targets", "delete": "rm -f targets", "triggers": ["ray-head-id"]}


def cascade_state() -> list[OldResource]:
    """A container and a create-before-delete command whose triggers hold its ID (the shape of
    `ray-head` and the Ray targets step)."""
    return [
        OldResource(BASE, TYPE_CONTAINER, container_inputs()),
        OldResource(
            TARGETS,
            TYPE_COMMAND,
            targets_inputs(),
            dependencies=(BASE,),
            property_dependencies={"triggers": (BASE,)},
            replace_on_changes=("triggers[*]",),
        ),
    ]


# --- 1. what a delete-before-replace cascade deleted is created again -------------------------


def test_a_dependent_deleted_by_a_cascade_is_created_again_whatever_its_diff() -> None:
    """step_generator.go: `_, recreating := sg.deletes[urn]`, then Replace + CreateReplacement.
    Diffed again (the old rule), the command's unchanged inputs plan "same": the model would
    keep a resource it had just deleted; with a changed input, a create-before-delete
    replacement whose old delete runs a second time, after the new create."""
    generator = StepGenerator(cascade_state())
    base = generator.step(BASE, TYPE_CONTAINER, container_inputs("img:2"))
    assert (base.op, base.delete_now) == ("replace", (TARGETS, BASE))
    again = generator.step(TARGETS, TYPE_COMMAND, targets_inputs(), ("triggers[*]",))
    assert again.op == "replace"
    assert again.delete_now == () and not again.delete_old_at_end
    assert generator.gone({BASE, TARGETS}) == ([], [])


# --- 2. a container created but not started keeps its ID ---------------------------------------


def stopped(container_id: str) -> dict[str, Any]:
    return {
        "Id": container_id,
        "State": {"Running": False, "Status": "created"},
        "Config": {"Cmd": [], "Entrypoint": [], "User": "", "WorkingDir": ""},
        "HostConfig": {"NetworkMode": "host", "RestartPolicy": {"Name": "unless-stopped"}},
    }


def args(typ: str, name: str, inputs: dict[str, Any]) -> pulumi.runtime.MockResourceArgs:
    return pulumi.runtime.MockResourceArgs(typ, name, inputs, f"{PROVIDER}::p1", "", True)


# What each registration says besides its inputs (OptionsMonitor hands it to the mocks).
OPTIONS = {
    (TYPE_CONTAINER, "ray-head"): RegistrationOptions(BASE, (), (), False, provider_urn=PROVIDER),
    (TYPE_COMMAND, "ray-targets"): RegistrationOptions(
        TARGETS, (BASE,), ("triggers[*]",), False, property_dependencies=(("triggers", (BASE,)),)
    ),
}


def register(mocks: RealMocks, typ: str, name: str) -> None:
    mocks.registrations[(typ, name)] = OPTIONS[(typ, name)]


def test_a_container_created_but_not_started_keeps_its_id_and_up_refresh_starts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The provider sets the ID before ContainerStart (resource_docker_container_funcs.go) and
    the bridge returns that state with an initialization error (tfbridge provider.go Create):
    the next `up` plans an update (step_generator.go: "generate an empty update step"), and
    `up --refresh` reads it stopped (`must_run` false), so the update starts it. Kept without
    its ID (the old rule), the refresh could not find it: a create, "name already in use"."""
    monkeypatch.setattr(realmocks, "inspect_container", lambda host, name: stopped("c0ffee"))
    first = RealMocks()
    register(first, TYPE_CONTAINER, "ray-head")
    failed = RemoteResult(127, "", "docker: Error response from daemon: failed to create task")
    first._journal_failed_container(
        args(TYPE_CONTAINER, "ray-head", container_inputs()),
        container_inputs(),
        HOST,
        "ray-head",
        failed,
        "Unable to start container",
    )
    [entry] = first.state_entries()
    assert entry.resource_id == "c0ffee" and entry.init_errors == ("Unable to start container",)

    plain = NextUp(first)
    assert plain.steps.step(BASE, TYPE_CONTAINER, container_inputs()).op == "update"

    looked_up: list[str] = []

    def inspect(host: DockerHost, container_id: str) -> dict[str, Any] | None:
        looked_up.append(container_id)
        return stopped(container_id) if container_id == "c0ffee" else None

    monkeypatch.setattr(realmocks, "inspect_container", inspect)
    refreshed = NextUp(first, refresh=True)
    assert looked_up == ["c0ffee"]
    assert refreshed.prior[BASE].inputs["mustRun"] is False
    planned = refreshed.steps.step(BASE, TYPE_CONTAINER, container_inputs())
    assert (planned.op, planned.changed) == ("update", ("mustRun",))


# --- 3. a delete-before-replace whose create failed stays pending -----------------------------


class Recorder:
    """The hosts, as the model reaches them: what was deleted and created, in order; a create
    of a name in `failing` fails."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> None:
        self.done: list[tuple[str, str]] = []
        recorder = self

        def teardown(entry: realmocks.JournalEntry, timeout_s: float) -> None:
            recorder.done.append(("delete", entry.name))

        def perform(mocks: RealMocks, a: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
            if a.name in failing:
                raise RuntimeError(f"{a.name}: Unable to create container")
            recorder.done.append(("create", a.name))
            entry = realmocks.entry_for(a, dict(a.inputs), dict(a.inputs), HOST, a.name + "-new")
            mocks._record(entry)
            return entry.resource_id, entry.outputs

        monkeypatch.setattr(lab_engine, "teardown_entry", teardown)
        monkeypatch.setattr(RealMocks, "perform", perform)


def deployed(monkeypatch: pytest.MonkeyPatch) -> RealMocks:
    """A first `up` of the container and its targets command."""
    Recorder(monkeypatch, set())
    first = RealMocks()
    up_step(first, TYPE_CONTAINER, "ray-head", container_inputs())
    up_step(first, TYPE_COMMAND, "ray-targets", targets_inputs())
    return first


def up_step(run: RealMocks, typ: str, name: str, inputs: dict[str, Any]) -> None:
    """One registration: its options reach the mocks first, as OptionsMonitor hands them."""
    register(run, typ, name)
    run.new_resource(args(typ, name, inputs))


def test_a_cascade_deletes_each_dependent_once_and_creates_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole run in the model: the targets step is deleted before the container, created
    again after it (its inputs unchanged), and nothing is deleted at the end."""
    first = deployed(monkeypatch)
    hosts = Recorder(monkeypatch, set())
    run = NextUp(first)
    up_step(run, TYPE_CONTAINER, "ray-head", container_inputs("img:2"))
    up_step(run, TYPE_COMMAND, "ray-targets", targets_inputs())
    run.finish()
    assert hosts.done == [
        ("delete", "ray-targets"),
        ("delete", "ray-head"),
        ("create", "ray-head"),
        ("create", "ray-targets"),
    ]
    assert run.changed() == {"ray-head": "replace", "ray-targets": "replace"}


def test_a_delete_before_replace_whose_create_failed_is_replaced_next_run_not_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """step.go DeleteStep.Apply marks the deleted old resource PendingReplacement and the state
    keeps it; the next run plans a replace (step_generator.go `old.PendingReplacement`) and
    does not delete it again (`if !old.PendingReplacement`). Dropped (the old rule), the next
    run planned "create"."""
    first = deployed(monkeypatch)
    Recorder(monkeypatch, {"ray-head"})
    failed = NextUp(first)
    with pytest.raises(RuntimeError, match="Unable to create container"):
        up_step(failed, TYPE_CONTAINER, "ray-head", container_inputs("img:2"))
    state = {e.name: e for e in failed.state_entries()}
    assert state["ray-head"].pending_replacement and state["ray-targets"].pending_replacement

    hosts = Recorder(monkeypatch, set())
    run = NextUp(failed)
    up_step(run, TYPE_CONTAINER, "ray-head", container_inputs("img:2"))
    up_step(run, TYPE_COMMAND, "ray-targets", targets_inputs())
    run.finish()
    assert run.changed() == {"ray-head": "replace", "ray-targets": "replace"}
    # The targets step, a dependent, is deleted again by the new cascade (its DeleteReplacement
    # is not skipped for a pending one); the container, the base, is not.
    assert hosts.done == [
        ("delete", "ray-targets"),
        ("create", "ray-head"),
        ("create", "ray-targets"),
    ]


def test_a_pending_replacement_is_replaced_even_when_its_inputs_did_not_change() -> None:
    """step_generator.go: `if diff.Changes == plugin.DiffSome || old.PendingReplacement`, then
    `diff.Replace() || ... || old.PendingReplacement`: the run that failed after the delete is
    retried with the same program, so the diff alone would say "same" and never re-create it."""
    pending = OldResource(BASE, TYPE_CONTAINER, container_inputs(), pending_replacement=True)
    planned = StepGenerator([pending]).step(BASE, TYPE_CONTAINER, container_inputs())
    assert (planned.op, planned.delete_now) == ("replace", ())


def test_a_pending_replacement_the_program_dropped_leaves_the_state_without_a_delete() -> None:
    """step_generator.go GenerateDeletes: `NewRemovePendingReplaceStep` for a pending one."""
    pending = OldResource(BASE, TYPE_CONTAINER, container_inputs(), pending_replacement=True)
    kept = OldResource(TARGETS, TYPE_COMMAND, targets_inputs())
    assert StepGenerator([pending, kept]).gone(set()) == ([TARGETS], [BASE])


# --- 4. set-typed container fields ignore order ------------------------------------------------


@pytest.mark.parametrize(
    ("field", "before", "after"),
    [
        ("envs", ["A=1", "B=2"], ["B=2", "A=1"]),
        ("labels", [{"label": "a", "value": "1"}, {"label": "b", "value": "2"}],
         [{"label": "b", "value": "2"}, {"label": "a", "value": "1"}]),
        ("mounts", [{"target": "/a", "type": "bind"}, {"target": "/b", "type": "bind"}],
         [{"target": "/b", "type": "bind"}, {"target": "/a", "type": "bind"}]),
        ("ulimits", [{"name": "memlock", "soft": -1.0, "hard": -1.0},
                     {"name": "stack", "soft": 1.0, "hard": 1.0}],
         [{"name": "stack", "soft": 1.0, "hard": 1.0},
          {"name": "memlock", "soft": -1.0, "hard": -1.0}]),
        ("devices", [{"hostPath": "/dev/a"}, {"hostPath": "/dev/b"}],
         [{"hostPath": "/dev/b"}, {"hostPath": "/dev/a"}]),
        ("capabilities", {"adds": ["CAP_A", "CAP_B"]}, {"adds": ["CAP_B", "CAP_A"]}),
    ],
)  # fmt: skip
def test_a_release_that_only_reorders_a_set_plans_nothing(
    field: str, before: Any, after: Any
) -> None:
    """resource_docker_container.go: these are `schema.TypeSet`; the bridge plans with the SDK's
    diff, where "set element reordering in programs [is] a no-change plan"
    (pulumi-terraform-bridge docs/guides/sets.md). Compared as lists (the old rule): a
    replacement, so a release that reorders them would restart the container."""
    old = {"name": "c", "image": "i", field: before}
    assert diff(TYPE_CONTAINER, old, {**old, field: after}).step == "same"


def test_a_list_typed_field_still_compares_in_order() -> None:
    old = {"name": "c", "image": "i", "command": ["a", "b"]}
    assert diff(TYPE_CONTAINER, old, {**old, "command": ["b", "a"]}).step == "replace"


# --- 5. refresh writes back restart, maxRetryCount and init -----------------------------------


def test_up_refresh_restores_a_restart_policy_changed_by_hand() -> None:
    """resourceDockerContainerRead sets `restart` and `max_retry_count` from the container's
    RestartPolicy, and `init` from HostConfig.Init: after `docker update --restart=no`, the
    diff is an update of `restart` (not ForceNew), which ContainerUpdate undoes. Not read (the
    old rule), `up --refresh` planned nothing."""
    program = {"name": "c", "image": "i", "restart": "unless-stopped", "init": True, "mounts": []}
    by_hand = {
        "Config": {},
        "HostConfig": {"RestartPolicy": {"Name": "no", "MaximumRetryCount": 0}, "Init": True},
    }
    planned = diff(TYPE_CONTAINER, read_container(by_hand, program), program)
    assert (planned.step, planned.changed) == ("update", ("restart",))
    on_failure = {**program, "restart": "on-failure", "maxRetryCount": 3.0}
    by_hand["HostConfig"]["RestartPolicy"] = {"Name": "on-failure", "MaximumRetryCount": 1}
    planned = diff(TYPE_CONTAINER, read_container(by_hand, on_failure), on_failure)
    assert (planned.step, planned.changed) == ("update", ("maxRetryCount",))
    untouched = {"Config": {}, "HostConfig": {"RestartPolicy": {"Name": "unless-stopped"},
                                              "Init": True}}  # fmt: skip
    assert diff(TYPE_CONTAINER, read_container(untouched, program), program).step == "same"


# --- 6. the repo digest a RemoteImage stores ---------------------------------------------------

DIGESTS = ["mirror.local:5000/example/vllm@sha256:aa", "example/vllm@sha256:bb"]


def test_the_repo_digest_is_the_one_of_the_images_repository(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """determineRepoDigest: the digest that begins with the name up to its first colon, not
    RepoDigests[0] (the old rule, at create)."""
    assert repo_digest("example/vllm:1.0", DIGESTS) == "example/vllm@sha256:bb"
    assert repo_digest("other/name:1", DIGESTS) == DIGESTS[0]  # none matches: the first
    assert repo_digest("x:1", ["only@sha256:cc"]) == "only@sha256:cc"
    image = {"Id": "sha256:11", "RepoDigests": DIGESTS}
    monkeypatch.setattr(realmocks, "inspect_image", lambda host, name: image)
    mocks = RealMocks()
    mocks._docker_hosts["p1"] = HOST
    _, outputs = mocks.perform(args(TYPE_REMOTE_IMAGE, "image-pull", {"name": "example/vllm:1.0"}))
    assert outputs["repoDigest"] == "example/vllm@sha256:bb"
