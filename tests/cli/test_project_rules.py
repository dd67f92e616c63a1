"""Each rule the CLI applies to `Pulumi.yaml` and to a stack's config: a case the real CLI
refuses (with its own message) and one it accepts. Sources are cited in project.py/stack.py."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.cli import CliError, PulumiCli
from tests.cli.project import ConfigDeclaration, Project, load_project
from tests.cli.stack import StackFile, config_key_name, may_look_like_secret, merge_config

HEAD = "name: demo\nruntime: python\n"


def project_file(tmp_path: Path, config_block: str) -> Path:
    path = tmp_path / "Pulumi.yaml"
    path.write_text(HEAD + "config:\n" + textwrap.indent(textwrap.dedent(config_block), "  "))
    return path


def refusal(tmp_path: Path, config_block: str) -> str:
    path = project_file(tmp_path, config_block)
    with pytest.raises(CliError) as caught:
        load_project(path)
    return str(caught.value).replace(str(path), "<path>")


# --- Project.Validate (project.go) ----------------------------------------------------------


def test_an_array_needs_items(tmp_path: Path) -> None:
    assert refusal(tmp_path, "hosts:\n  type: array\n") == (
        "could not unmarshal '<path>': The configuration key 'hosts' declares an array but does "
        "not specify the underlying type via the 'items' attribute"
    )
    load_project(project_file(tmp_path, "hosts:\n  type: array\n  items:\n    type: object\n"))


def test_default_and_value_exclude_each_other(tmp_path: Path) -> None:
    assert refusal(tmp_path, "port:\n  default: 1\n  value: 2\n") == (
        "could not unmarshal '<path>': project config 'port' cannot have both a 'default' and "
        "'value' attribute"
    )
    load_project(project_file(tmp_path, "port:\n  default: 1\n"))


def test_a_typed_default_must_have_the_type(tmp_path: Path) -> None:
    assert refusal(tmp_path, "port:\n  type: integer\n  default: eighty\n") == (
        "could not unmarshal '<path>': The default value specified for configuration key 'port' "
        "is not of the expected type 'integer'"
    )
    assert "not of the expected type 'array<string>'" in refusal(
        tmp_path, "hcas:\n  type: array\n  items:\n    type: string\n  default: [1]\n"
    )
    # ValidateConfigValue: an integer may be text that parses; an object is a mapping.
    load_project(project_file(tmp_path, 'port:\n  type: integer\n  default: "8000"\n'))
    load_project(project_file(tmp_path, "ray:\n  type: object\n  default: {port: 1}\n"))


def test_keys_of_other_namespaces_take_a_value_only(tmp_path: Path) -> None:
    assert refusal(tmp_path, "aws:region:\n  type: string\n  value: x\n").endswith(
        "Configuration key 'aws:region' is not namespaced by the project and should not define "
        "a type"
    )
    assert "should not define a default value" in refusal(tmp_path, "aws:region:\n  default: x\n")
    assert refusal(tmp_path, "aws:region:\n  description: x\n").endswith(
        "Configuration key 'aws:region' is namespaced and must provide an attribute 'value'"
    )
    load_project(project_file(tmp_path, "aws:region: us-west-2\n"))  # shorthand: a value


# --- project.json (ValidateProject) -----------------------------------------------------------


def test_the_schema_refuses_unknown_attributes_and_types(tmp_path: Path) -> None:
    assert "#/config/port: additionalProperties 'typ' not allowed" in refusal(
        tmp_path, "port:\n  typ: integer\n"
    )
    text = refusal(tmp_path, "port:\n  type: number\n")
    assert text.startswith("could not validate '<path>': ")
    assert '#/config/port/type: value must be one of "string", "integer"' in text
    assert "#/config/ratio: oneOf failed" in refusal(tmp_path, "ratio: 0.5\n")
    load_project(project_file(tmp_path, "port:\n  type: integer\n"))


def test_a_project_needs_a_name(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.yaml"
    path.write_text("runtime: python\n")
    with pytest.raises(CliError, match="project is missing a 'name' attribute"):
        load_project(path)


# --- mergeConfig (pkg/workspace/config.go) ----------------------------------------------------


def merged(tmp_path: Path, config_block: str, stack: dict[str, Any]) -> dict[str, str]:
    project = load_project(project_file(tmp_path, config_block))
    return merge_config(project, StackFile.from_config(project, "dev", stack)).values


def merge_refusal(tmp_path: Path, config_block: str, stack: dict[str, Any]) -> str:
    with pytest.raises(CliError) as caught:
        merged(tmp_path, config_block, stack)
    return str(caught.value)


def test_a_key_without_default_must_be_set(tmp_path: Path) -> None:
    block = "a:\n  type: string\nb:\n  description: x\nc: {}\nd:\n  default: 1\n"
    assert merge_refusal(tmp_path, block, {}) == (
        "validating stack config: Stack 'dev' is missing configuration values 'a', 'b' and 'c'"
    )
    assert merge_refusal(tmp_path, block, {"a": "x", "b": "y"}) == (
        "validating stack config: Stack 'dev' is missing configuration value 'c'"
    )
    assert merged(tmp_path, block, {"a": "x", "b": "y", "c": "z"})["demo:d"] == "1"


def test_defaults_fill_in_and_the_stack_wins(tmp_path: Path) -> None:
    block = "ray:\n  type: object\n  default: {port: 6379, dash: false}\n"
    assert merged(tmp_path, block, {})["demo:ray"] == '{"dash":false,"port":6379}'
    assert merged(tmp_path, block, {"demo:ray": {"port": 1}})["demo:ray"] == '{"port":1}'


def test_with_both_a_value_and_a_default_the_default_is_merged(tmp_path: Path) -> None:
    """mergeConfig assigns `projectConfigType.Value`, then `projectConfigType.Default`: the
    default wins. Project.Validate refuses such a file (test_default_and_value_exclude_each_
    other); mergeConfig does not check it again, so a project made another way (the automation
    API's in-memory project) merges its default."""
    project = Project("demo", tmp_path / "Pulumi.yaml")
    project.config["port"] = ConfigDeclaration(default=1, value=2)
    assert merge_config(project, StackFile("dev")).values == {"demo:port": "1"}


def test_typed_values_are_checked(tmp_path: Path) -> None:
    block = "port:\n  type: integer\nhosts:\n  type: array\n  items:\n    type: object\n"
    assert merge_refusal(tmp_path, block, {"port": "80", "hosts": ["a"]}) == (
        "validating stack config: Stack 'dev' with configuration key 'hosts' must be of type "
        "'array<object>'"
    )
    assert merge_refusal(tmp_path, block, {"port": 1.5, "hosts": []}).endswith(
        "key 'port' must be of type 'integer'"
    )
    values = merged(tmp_path, block, {"port": 80, "hosts": [{"name": "a"}]})
    assert values == {"demo:port": "80", "demo:hosts": '[{"name":"a"}]'}


def test_a_typed_secret_must_be_set_with_secret(tmp_path: Path) -> None:
    block = "apiKey:\n  type: string\n  secret: true\n"
    assert merge_refusal(tmp_path, block, {"apiKey": "plain"}) == (
        "validating stack config: Stack 'dev' with configuration key 'apiKey' must be encrypted "
        "as it's secret"
    )
    # A typed secret cannot be optional: its default is plain text, so it is refused too.
    assert "must be encrypted" in merge_refusal(tmp_path, block + '  default: ""\n', {})
    cli = PulumiCli(project_file(tmp_path, block).parent)
    cli.stack_from("dev", {})
    cli.config_set("dev", "apiKey", "s3cret", secret=True)
    config = cli.program_config("dev")
    assert config.values == {"demo:apiKey": "s3cret"} and config.secret_keys == ["demo:apiKey"]


def test_the_program_gets_the_language_hosts_environment(tmp_path: Path) -> None:
    cli = PulumiCli(project_file(tmp_path, "n:\n  type: integer\n").parent)
    cli.stack_from("dev", {"n": 3, "other:flag": True})
    env = cli.program_config("dev").environment()
    assert env == {
        "PULUMI_CONFIG": '{"demo:n":"3","other:flag":"true"}',
        "PULUMI_CONFIG_SECRET_KEYS": "[]",
    }


def test_a_plain_value_for_a_name_that_looks_secret_is_not_guessed(tmp_path: Path) -> None:
    """looksLikeSecret weighs the value's entropy (zxcvbn-go, not ported): the port refuses to
    guess and asks for --secret or --plaintext; a name outside keyPattern is never weighed."""
    cli = PulumiCli(project_file(tmp_path, "").parent)
    cli.stack_from("dev", {})
    for key, path in (("hfToken", False), ("demo:dbPassword", False), ("apiToken.value", True)):
        with pytest.raises(CliError, match="looksLikeSecret"):
            cli.config_set("dev", key, "1415fc1f4eaeb5e096ee58c1480016638fff29bf", path=path)
        cli.config_set("dev", key, "x", path=path, plaintext=True)
    cli.config_set("dev", "region", "1415fc1f4eaeb5e096ee58c1480016638fff29bf")


def test_with_path_the_whole_path_is_the_name_looks_like_secret_weighs() -> None:
    """io.go parseConfigKey with --path: `MustMakeKey(topKey.Namespace(),
    topKey.Name()+key[bracketOrDotIndex:])`, so `auth.token` is named `auth.token` and
    keyPattern finds `token` in it; only the top segment carries the namespace."""
    assert config_key_name("auth.token", path=True) == "auth.token"
    assert config_key_name("demo:auth.token", path=True) == "auth.token"
    assert config_key_name("demo:hosts[0].name", path=True) == "hosts[0].name"
    assert config_key_name("a.b:c", path=False) == "c"  # no path: namespace `a.b`
    assert may_look_like_secret("auth.token", path=True)
    assert may_look_like_secret("demo:hosts[0].password", path=True)
    assert not may_look_like_secret("auth.region", path=True)


def test_config_set_with_path_weighs_the_whole_path(tmp_path: Path) -> None:
    cli = PulumiCli(project_file(tmp_path, "").parent)
    cli.stack_from("dev", {})
    with pytest.raises(CliError, match="looksLikeSecret"):
        cli.config_set("dev", "auth.token", "1415fc1f4eaeb5e096ee58c1480016638fff29bf", path=True)


def test_every_key_of_this_project_that_looks_secret_is_a_declared_secret() -> None:
    """So the entropy check never decides anything here: the merge already refuses a plain
    value of a declared secret (test_a_typed_secret_must_be_set_with_secret)."""
    project = load_project(Path(__file__).resolve().parents[2] / "Pulumi.yaml")
    weighed = [key for key in project.config if may_look_like_secret(key, path=False)]
    assert weighed == ["hfToken"]
    assert all(project.config[key].secret for key in weighed)
