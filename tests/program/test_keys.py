"""Named keys (`keys`) through the program: their values are secrets read apart from the typed
config (a plain value is refused, as apiKey's), their names and models are checked, and a key
added, changed or revoked plans only the front's key map, its configuration and its reload:
no server, no Ray, no front container."""

from __future__ import annotations

from typing import Any

import pytest

from stacks.plan.containers import ContainerSpec
from stacks.plan.front import front_config
from stacks.settings import key_entry
from tests.cli import PulumiCli
from tests.mockvalues import is_secret
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import REPO, Evaluation, run_stack, unwrap
from tests.program.planning import fleet, graph_of
from tests.program.previews import changes

ALICE = "alice-key-5f0c2d7e9b1a4c38e6d2"
BOB = "bob-key-8e1f3a6c0d9b2e7f4a51c"


def deploy(
    config: dict[str, Any],
    values: list[str],
    *,
    preview: bool = False,
    prior: Evaluation | None = None,
    plain: bool = False,
) -> Evaluation:
    """`config` with each of its `keys` given its value from `values` as a user does it:
    `pulumi config set --path --secret 'keys[i].key' VALUE` (without --secret: `plain`)."""
    cli = PulumiCli(REPO)
    cli.stack_from("dev", config)
    for key, value in SECRETS.items():
        cli.config_set("dev", key, value, secret=True)
    for index, value in enumerate(values):
        cli.config_set(
            "dev", f"keys[{index}].key", value, secret=not plain, path=True, plaintext=plain
        )
    return run_stack(cli, "dev", preview=preview, prior=prior)


def refusal(config: dict[str, Any], values: list[str], plain: bool = False) -> str:
    with pytest.raises(Exception) as caught:
        deploy(config, values, plain=plain)
    assert type(caught.value).__name__ == "RunError", repr(caught.value)
    return str(caught.value)


def with_keys(config: dict[str, Any], *keys: dict[str, Any]) -> dict[str, Any]:
    return {**config, "keys": list(keys)} if keys else config


@pytest.mark.parametrize(
    ("keys", "values", "plain", "expected"),
    [
        # A value set without --secret sits in plain text in the stack file and the state.
        ([{"name": "alice"}], [ALICE], True, "keys: the keys' values are stored in plain text"),
        ([{"name": "alice"}], [], False, "keys[0].key: is required"),
        ([{"name": "alice"}], ["short-key"], False, "keys[0].key: is 9 characters long"),
        ([{"name": "alice"}], [ALICE + " x"], False, "keys[0].key: must be one word"),
        ([{"name": "alice"}], [SECRETS["apiKey"]], False, "keys[0].key: is apiKey's"),
        (
            [{"name": "alice"}, {"name": "bob"}],
            [ALICE, ALICE],
            False,
            "keys[1].key: is apiKey's or another key's",
        ),
        (
            [{"name": "alice"}, {"name": "alice"}],
            [ALICE, BOB],
            False,
            "keys[1].name: 'alice' is used by two keys",
        ),
        ([{"name": "Alice"}], [ALICE], False, "keys[0].name: String should match"),
        (
            [{"name": "alice", "models": ["qwen", "nope"]}],
            [ALICE],
            False,
            "keys[0].models[1]: 'nope' is not a model this stack serves (its served names: "
            "qwen, embed, coder)",
        ),
        ([{"name": "alice", "requestsPerMinute": 0}], [ALICE], False, "requestsPerMinute"),
    ],
)
def test_a_key_that_cannot_be_used_is_refused_naming_it_never_its_value(
    make_config: ConfigFactory,
    keys: list[dict[str, Any]],
    values: list[str],
    plain: bool,
    expected: str,
) -> None:
    message = refusal(with_keys(fleet(make_config, 2), *keys), values, plain)
    assert expected in message
    for value in values:
        assert value not in message


def test_the_values_travel_only_on_the_key_steps_stdin(make_config: ConfigFactory) -> None:
    config = with_keys(
        fleet(make_config, 2),
        {"name": "alice", "models": ["embed"], "requestsPerMinute": 30},
        {"name": "bob"},
    )
    run = deploy(config, [ALICE, BOB])
    step = run.named("front-keys")
    assert is_secret(step.inputs["stdin"])
    operator = SECRETS["apiKey"]  # first: what a named key's request carries on to vLLM
    alice, bob = key_entry("alice", ALICE), key_entry("bob", BOB)
    assert unwrap(step.inputs["stdin"]) == f"{operator}\n{ALICE} {alice}\n{BOB} {bob}\n"
    assert "front-keys" in step.inputs["create"] and "keys.map" in step.inputs["create"]
    for registration in run.registrations:
        inputs = {k: v for k, v in registration.inputs.items() if k != "stdin"}
        # Neither a value nor its tag (the table's entry: only beside the value, in the map).
        for secret in (ALICE, alice.split(".")[1]):
            assert secret not in repr(unwrap(inputs)), registration.name
    config_step = run.named("front-config").inputs["create"]
    assert "acl key_0 var(txn.key) -m beg alice." in config_step
    assert "models-alice.json" in config_step
    # The reload also follows the map, written apart from the configuration.
    assert (
        "--keys-map /home/aurora/.spark-vllm/spark-vllm.dev/front-secrets/keys.map"
        in (run.named("front-reload").inputs["create"])
    )
    # The map is written before the front starts and before it reloads.
    assert run.depends_on("front-container", "front-keys")
    assert run.depends_on("front-reload", "front-keys")


def test_the_fronts_secrets_are_mounted_into_the_front_alone(make_config: ConfigFactory) -> None:
    """The key's pattern file, the named keys' maps (every key's value) and the handover's key
    pair are in the front's own directory, which no other container mounts; the servers' key
    directory holds the API key alone (the one key vLLM checks itself)."""
    config = with_keys(fleet(make_config, 2), {"name": "alice"})
    config["monitoring"] = {"enabled": True}
    run = deploy(config, [ALICE])
    leaf = "/home/aurora/.spark-vllm/spark-vllm.dev"
    front_secrets, key_dir = f"{leaf}/front-secrets", f"{leaf}/secrets"
    mounted: dict[str, set[str]] = {}
    for container in run.by_type("docker:index/container:Container"):
        for mount in container.inputs["mounts"]:
            mounted.setdefault(mount["source"], set()).add(container.name)
    assert mounted[front_secrets] == {"front-container"}
    assert "front-container" not in mounted.get(key_dir, set())
    # What each step writes where.
    key_step = run.named("front-api-key").inputs["create"]
    assert f"--file {key_dir}/api-key --bearer {front_secrets}/bearer" in key_step
    assert f"--file {front_secrets}/keys.map" in run.named("front-keys").inputs["create"]
    text = run.named("front-config").inputs["create"]
    assert "-f /run/spark-vllm-front/bearer" in text
    assert "map_str(/run/spark-vllm-front/keys.map)" in text
    assert "ssl crt /run/spark-vllm-front/handover.pem" in text


def plan_of(before: dict, after: dict, values: list[str], new_values: list[str]) -> dict:
    """What preview plans for each resource whose step is not "same" (deletes included)."""
    up = deploy(before, values)
    preview = deploy(after, new_values, preview=True, prior=up)
    deleted = {urn.rsplit("::", 1)[-1]: "delete" for urn in preview.deletes}
    return {**changes(preview), **deleted}


FRONT_ONLY = {"front-config": "update", "front-reload": "replace"}


def test_adding_changing_and_revoking_a_key_reloads_the_front_and_nothing_else(
    make_config: ConfigFactory,
) -> None:
    base = fleet(make_config, 2)
    alice = {"name": "alice", "models": ["embed"]}
    bob = {"name": "bob", "requestsPerMinute": 60}
    # The first key: its map is new; the configuration and the reload follow.
    assert plan_of(base, with_keys(base, alice), [], [ALICE]) == {
        "front-keys": "create",
        **FRONT_ONLY,
    }
    # One more.
    assert plan_of(with_keys(base, alice), with_keys(base, alice, bob), [ALICE], [ALICE, BOB]) == {
        "front-keys": "update",
        **FRONT_ONLY,
    }
    # A new value for a key: the map and the reload (the configuration names no value).
    renewed = "alice-key-renewed-7c2e9d0b4f1a83"
    assert plan_of(with_keys(base, alice), with_keys(base, alice), [ALICE], [renewed]) == {
        "front-keys": "update",
        "front-reload": "replace",
    }
    # Revoked: one of two, then the last one (its map deleted with it).
    assert plan_of(with_keys(base, alice, bob), with_keys(base, bob), [ALICE, BOB], [BOB]) == {
        "front-keys": "update",
        **FRONT_ONLY,
    }
    assert plan_of(with_keys(base, alice), base, [ALICE], []) == {
        "front-keys": "delete",
        **FRONT_ONLY,
    }
    # The same keys again: nothing.
    assert plan_of(with_keys(base, alice), with_keys(base, alice), [ALICE], [ALICE]) == {}


def test_with_one_model_a_key_is_a_reload_of_the_front_too(make_config: ConfigFactory) -> None:
    """One model: vLLM answers /v1/models itself and the front reads no body; a key still
    changes only the front's steps."""
    base = make_config(hosts=2)
    keyed = with_keys(base, {"name": "alice", "models": ["qwen"], "requestsPerMinute": 10})
    assert plan_of(base, keyed, [], [ALICE]) == {"front-keys": "create", **FRONT_ONLY}
    config = deploy(keyed, [ALICE]).named("front-config").inputs["create"]
    assert "sc_http_req_rate(1) gt 10" in config and "not available with this key" not in config
    assert "is not open to this key" in config  # the client routes, with one model too
    # The keys' table goes over a reload: its local peer at front.metricsPort, on 127.0.0.2.
    assert "    localpeer front\n" in config and "    bind 127.0.0.2:8404 ssl crt " in config


def test_the_front_takes_its_local_peers_name_from_its_configuration(
    make_config: ConfigFactory,
) -> None:
    """HAProxy ignores `localpeer` when it is started with `-L`: the front's container passes
    none, so the name the `peers` section gives its local peer is the front's own."""
    plan, graph = graph_of(with_keys(make_config(hosts=2), {"name": "alice"}))
    container = graph.by_name["front-container"].spec
    assert isinstance(container, ContainerSpec)
    assert not [word for word in container.command if word.startswith("-L")]
    text = front_config(plan)
    assert "    localpeer front\n" in text and "    bind 127.0.0.2:8404 ssl crt " in text


def test_with_monitoring_the_first_key_adds_prometheus_job_and_the_next_do_not(
    make_config: ConfigFactory,
) -> None:
    """Prometheus scrapes the per-key counters (`front-keys`) once there are keys: the first
    key and the last one revoked change its targets (Prometheus restarts, its data kept); any
    other key change is still a reload of the front alone."""
    base = {**fleet(make_config, 2), "monitoring": {"enabled": True}}
    alice = {"name": "alice", "models": ["embed"]}
    bob = {"name": "bob", "requestsPerMinute": 60}
    prometheus = {
        "monitoring-files": "update",
        "monitoring-prometheus": "replace",
        "monitoring-ready": "replace",
    }
    first = plan_of(base, with_keys(base, alice), [], [ALICE])
    assert first == {"front-keys": "create", **FRONT_ONLY, **prometheus}
    more = plan_of(with_keys(base, alice), with_keys(base, alice, bob), [ALICE], [ALICE, BOB])
    assert more == {"front-keys": "update", **FRONT_ONLY}
    last = plan_of(with_keys(base, alice), base, [ALICE], [])
    assert last == {"front-keys": "delete", **FRONT_ONLY, **prometheus}
