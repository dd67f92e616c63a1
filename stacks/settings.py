"""Read the stack's Pulumi config and secrets into typed settings, or stop with one clean error."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from stacks.config import ConfigError, SshConfig, StackConfig, parse_stack_config
from stacks.credentials import SshAuth
from stacks.schema import SECRETS, FrontTlsConfig, StackSchema

# The stack's keys, as the schema declares them (the secrets apart: they never enter the model).
SECRET_KEYS = tuple(SECRETS)
FIELDS_BY_KEY = {field.alias or name: field for name, field in StackSchema.model_fields.items()}
CONFIG_KEYS = tuple(FIELDS_BY_KEY)


@dataclass(frozen=True)
class Settings:
    config: StackConfig
    deployment_id: str
    hf_token: pulumi.Output[str] | None  # None: not set (models that are not gated)
    api_key: pulumi.Output[str]
    # What the front-keys step reads: the operator's key on a line, then the named keys' map
    # (stacks/plan/front.py KEYS_MAP_NAME: one `<key> <entry>` line each, keys_map). A secret.
    user_keys: pulumi.Output[str]
    ssh_auth: SshAuth
    known_hosts: Path | None  # ssh.knownHostsFile, expanded; it exists
    local_dir: Path  # this machine's derived files: known_hosts for Docker, SSH control sockets
    # front.tls with the user's files: the certificate (not secret: an output for clients)...
    front_certificate: str | None = None
    # ... and what the front's TLS step reads on stdin: the certificate, then its key. A secret.
    front_tls: pulumi.Output[str] | None = None


def load_settings() -> Settings:
    """Every configuration problem is reported from here, as keyed lines: the typed config's
    (stacks/config.py), the secrets', and those of the files the config names on this machine."""
    config = pulumi.Config()
    raw, problems = _structured_values(config)
    user_keys, key_problems = _user_keys(raw, config, pulumi.get_project())
    problems += key_problems
    problems += _unknown_keys(pulumi.get_project())
    problems += _secret_problems(config, pulumi.get_project())
    problems += docker_environment_problems(os.environ)
    problems += agent_socket_problems(os.environ.get("SSH_AUTH_SOCK"))
    try:
        if problems:
            raise ConfigError("\n".join(problems))
        stack_config = parse_stack_config(raw)
        known_hosts = _known_hosts_file(stack_config.ssh)
        ssh_auth = _ssh_auth(stack_config.ssh)
        tls_pair = front_tls_pair(stack_config.front.tls)
    except ConfigError as error:
        raise pulumi.RunError(f"invalid spark-vllm configuration:\n{error}") from None
    project, stack = pulumi.get_project(), pulumi.get_stack()
    hf_token = config.get("hfToken")
    base = Path(os.environ.get("SPARK_VLLM_LOCAL_DIR", "~/.spark-vllm")).expanduser()
    return Settings(
        config=stack_config,
        deployment_id=f"{project}/{stack}",
        hf_token=pulumi.Output.secret(hf_token) if hf_token else None,
        api_key=pulumi.Output.secret(config.get("apiKey") or ""),
        user_keys=pulumi.Output.secret(f"{config.get('apiKey') or ''}\n{keys_map(user_keys)}"),
        ssh_auth=ssh_auth,
        known_hosts=known_hosts,
        local_dir=base / f"{project}-{stack}",
        front_certificate=tls_pair[0] if tls_pair else None,
        front_tls=pulumi.Output.secret("".join(tls_pair)) if tls_pair else None,
    )


def front_tls_pair(tls: FrontTlsConfig) -> tuple[str, str] | None:
    """front.tls's certificate and key, read from this machine (PEM), each ending in a newline;
    None unless TLS is on with the user's files. Only the certificate's problems quote it: the
    key's never show its content."""
    if not tls.user_certificate:
        return None
    assert tls.certificate_file is not None and tls.key_file is not None  # FrontTlsConfig
    certificate = _read_pem("front.tls.certificateFile", tls.certificate_file)
    key = _read_pem("front.tls.keyFile", tls.key_file)
    problems = []
    if "-----BEGIN CERTIFICATE-----" not in certificate:
        problems.append(
            f"front.tls.certificateFile: {tls.certificate_file} holds no PEM certificate "
            "(-----BEGIN CERTIFICATE-----)"
        )
    if "PRIVATE KEY-----" in certificate:
        problems.append(
            f"front.tls.certificateFile: {tls.certificate_file} holds a private key: give the "
            "key in keyFile alone (it is kept secret; the certificate is not)"
        )
    if "ENCRYPTED" in key:
        problems.append(
            f"front.tls.keyFile: {tls.key_file} is encrypted: HAProxy reads it unattended; "
            "give it unencrypted (openssl pkey -in KEY -out PLAIN)"
        )
    elif not re.search(r"-----BEGIN (RSA |EC )?PRIVATE KEY-----", key):
        problems.append(f"front.tls.keyFile: {tls.key_file} holds no PEM private key")
    if problems:
        raise ConfigError("\n".join(problems))
    return (certificate.rstrip("\n") + "\n", key.rstrip("\n") + "\n")


def _read_pem(where: str, path: str) -> str:
    file = Path(path).expanduser()
    try:
        return file.read_text()
    except (OSError, UnicodeDecodeError) as error:
        why = getattr(error, "strerror", None) or "not text"
        raise ConfigError(f"{where}: cannot read {file} ({why})") from None


def _user_keys(
    raw: dict[str, Any], config: pulumi.Config, project: str
) -> tuple[list[tuple[str, str]], list[str]]:
    """Each of `keys`' (name, value), the values taken out of the typed config (a secret never
    enters it), and their problems: a value that is missing, not a bearer token as `apiKey` must
    be, `apiKey` itself or another key's, or set without --secret. Pulumi marks a structured
    key secret as a whole, so a plain value beside secret ones in the list is not seen here."""
    entries = raw.get("keys")
    if not isinstance(entries, list):
        return [], []
    found: list[tuple[str, str]] = []
    problems: list[str] = []
    if not pulumi.runtime.is_config_secret(f"{project}:keys"):
        problems.append(
            "keys: the keys' values are stored in plain text; set each with "
            "pulumi config set --path --secret 'keys[0].key' ..."
        )
    taken = {config.get("apiKey") or ""}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue  # the typed config reports it
        value = entry.pop("key", None)
        where = f"keys[{index}].key"
        if not isinstance(value, str) or not value:
            problems.append(
                f"{where}: is required: pulumi config set --path --secret '{where}' "
                '"$(openssl rand -hex 24)"'
            )
        elif problem := api_key_problem(value, f"--path --secret '{where}'"):
            problems.append(f"{where}: {problem}")
        elif value in taken:
            problems.append(f"{where}: is apiKey's or another key's value; give each its own")
        else:
            taken.add(value)
            found.append((str(entry.get("name", "")), value))
    return found, problems


# A named key's entry in the front's table is its name, this separator (no name holds it:
# NAME_PATTERN) and KEY_TAG_DIGITS hex digits of its value's sha256 (key_entry).
KEY_ENTRY_SEPARATOR = "."
KEY_TAG_DIGITS = 12


def key_entry(name: str, value: str) -> str:
    """What the front counts a named key's requests under (stacks/plan/front.py KEYS_TABLE): its
    name and a tag of its value, so that a new key given a revoked key's name starts at zero
    rather than with the counters and the rate the table kept for the old one. The tag is
    written only beside the value itself (the map file), and lives in the front's memory."""
    tag = hashlib.sha256(value.encode()).hexdigest()[:KEY_TAG_DIGITS]
    return f"{name}{KEY_ENTRY_SEPARATOR}{tag}"


def keys_map(keys: list[tuple[str, str]]) -> str:
    """HAProxy's map file of the named keys: `<key> <entry>` per line (a map's key is its first
    word: a bearer token has no space; the entry: key_entry)."""
    return "".join(f"{value} {key_entry(name, value)}\n" for name, value in keys)


def _known_hosts_file(ssh: SshConfig) -> Path | None:
    if ssh.known_hosts_file is None:
        return None
    path = Path(ssh.known_hosts_file).expanduser()
    if not path.is_file():
        raise ConfigError(f"ssh.knownHostsFile: {path} does not exist")
    return path


def _ssh_auth(ssh: SshConfig) -> SshAuth:
    """The key file's content (a secret), or the running agent's socket."""
    if ssh.use_agent:
        if not os.environ.get("SSH_AUTH_SOCK"):
            raise ConfigError(
                "ssh.useAgent: true, but SSH_AUTH_SOCK is not set: start ssh-agent and ssh-add "
                "your key, or set ssh.privateKeyPath"
            )
        return SshAuth(None, None, ssh.dial_error_limit, ssh.per_dial_timeout_seconds)
    assert ssh.private_key_path is not None  # SshConfig guarantees one auth method
    key_path = Path(ssh.private_key_path).expanduser()
    try:
        key = key_path.read_text()
    except OSError as error:
        raise ConfigError(
            f"ssh.privateKeyPath: cannot read {key_path} ({error.strerror})"
        ) from None
    return SshAuth(
        pulumi.Output.secret(key),
        str(key_path),
        ssh.dial_error_limit,
        ssh.per_dial_timeout_seconds,
    )


def _structured_values(config: pulumi.Config) -> tuple[dict[str, Any], list[str]]:
    """Each set key parsed as YAML/JSON structure; a plain text where a structure belongs is a
    problem to report, not a crash."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key in CONFIG_KEYS:
        try:
            value = config.get_object(key)
        except pulumi.ConfigTypeError:
            shape = {"hosts": "a list of hosts", "models": "a list of models"}.get(
                key, "a mapping of settings"
            )
            problems.append(f"{key}: must be {shape}, not the text {config.get(key)!r}")
            continue
        # An optional key set to nothing (`bastion: {}`, `models: []`: Pulumi.yaml's defaults)
        # is not set.
        empty = value in ({}, [])
        if value is not None and (not empty or FIELDS_BY_KEY[key].is_required()):
            values[key] = value
    return values, problems


# What the Docker provider reads from the environment pulumi runs in, over its `host` setting
# (terraform-provider-docker: DOCKER_CONTEXT picks another daemon; TLS material makes every
# resource fail on an ssh:// host). The provider inherits the CLI's environment, which the
# program cannot change for it: refused, with the variable named.
DOCKER_ENVIRONMENT = {
    "DOCKER_CONTEXT": "the Docker provider would send every container to that context's daemon "
    "instead of each host's",
    "DOCKER_CERT_PATH": "the Docker provider would dial each host's ssh:// daemon with TLS, and "
    "every container would fail",
    "DOCKER_TLS_VERIFY": "the Docker provider would dial each host's ssh:// daemon with TLS, and "
    "every container would fail",
    "DOCKER_TLS": "the Docker provider would dial each host's ssh:// daemon with TLS, and every "
    "container would fail",
    "DOCKER_CA_MATERIAL": "the Docker provider would dial each host's ssh:// daemon with TLS, "
    "and every container would fail",
    "DOCKER_CERT_MATERIAL": "the Docker provider would dial each host's ssh:// daemon with TLS, "
    "and every container would fail",
    "DOCKER_KEY_MATERIAL": "the Docker provider would dial each host's ssh:// daemon with TLS, "
    "and every container would fail",
}


def docker_environment_problems(environment: Mapping[str, str]) -> list[str]:
    """One line per Docker variable set (not empty) in the environment pulumi runs in."""
    return [
        f"environment: {name} is set: {why}; run pulumi without it (`env -u {name} pulumi up`)"
        for name, why in DOCKER_ENVIRONMENT.items()
        if environment.get(name)
    ]


AGENT_PROBE_SECONDS = 2.0


def agent_socket_problems(socket_path: str | None) -> list[str]:
    """pulumi-command dials SSH_AUTH_SOCK whenever it is set (its agentSocketPath unset), and a
    dead one fails every step's connection, even with ssh.privateKeyPath: refused once, here,
    before any resource. Unset, or an agent that answers, is fine."""
    if not socket_path:
        return []
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(AGENT_PROBE_SECONDS)
    try:
        probe.connect(socket_path)
    except OSError as error:
        return [
            f"environment: SSH_AUTH_SOCK is {socket_path}, where no SSH agent answers "
            f"({error.strerror or error}; a re-attached tmux or an ended `ssh -A` leaves one "
            "behind), and pulumi-command would fail every step's connection through it, even "
            'with ssh.privateKeyPath: start an agent (`eval "$(ssh-agent)"` and ssh-add), '
            "or run pulumi without it (`env -u SSH_AUTH_SOCK pulumi up`)"
        ]
    finally:
        probe.close()
    return []


def _secret_problems(config: pulumi.Config, project: str) -> list[str]:
    """apiKey is required and must not be empty (an empty key turns vLLM's authentication off);
    a token given without --secret would sit in plain text in the stack file and the state."""
    problems = []
    key = config.get("apiKey")
    if not key:
        problems.append(
            "apiKey: is required and must not be empty: "
            'pulumi config set --secret apiKey "$(openssl rand -hex 24)"'
        )
    elif problem := api_key_problem(key):
        problems.append(f"apiKey: {problem}")
    for key in SECRET_KEYS:
        if config.get(key) and not pulumi.runtime.is_config_secret(f"{project}:{key}"):
            problems.append(
                f"{key}: is stored in plain text; set it with pulumi config set --secret {key} ..."
            )
    return problems


# A bearer token as RFC 6750 (2.1) writes it, b64token: what clients send after `Bearer `. The
# front matches the whole header line (stacks/plan/front.py), the key file holds one line: a
# line break, a comma or a space would change what is matched. 24 characters at least (as
# `openssl rand -hex 24` gives 48): guessing it over the network must be hopeless.
API_KEY_PATTERN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
MIN_API_KEY_LENGTH = 24


def api_key_problem(key: str, setting: str = "--secret apiKey") -> str | None:
    """Why `key` cannot be the API key (never quoting it: it is a secret), or None. `setting`:
    the key's `pulumi config set` flags, for the fix."""
    fix = f'pulumi config set {setting} "$(openssl rand -hex 24)"'
    if not API_KEY_PATTERN.fullmatch(key):
        return (
            "must be one word of letters, digits and - . _ ~ + / (a bearer token, RFC 6750): "
            f"no spaces, commas or line breaks; {fix}"
        )
    if len(key) < MIN_API_KEY_LENGTH:
        return f"is {len(key)} characters long; use at least {MIN_API_KEY_LENGTH}: {fix}"
    return None


def _unknown_keys(project: str) -> list[str]:
    """A typo in a top-level key (`spark-vllm:vlm`) must not be silently ignored.

    The one read outside `pulumi.Config`, which cannot list the keys that are set: the SDK's own
    store of them. tests/program/test_validation.py (the `vlm` case, through the CLI's hand-over)
    fails if the SDK changes underneath it.
    """
    from pulumi.runtime.config import CONFIG, get_config_env

    known = {f"{project}:{key}" for key in (*CONFIG_KEYS, *SECRET_KEYS)}
    names = set(CONFIG.get()) | set(get_config_env())
    return [
        f"{name.split(':', 1)[1]}: is not a known setting (check the spelling)"
        for name in sorted(names)
        if name.startswith(f"{project}:") and name not in known
    ]
