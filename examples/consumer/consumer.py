"""The consumer's two resources: the client configuration file, and a check that the endpoint
answers. Both are pulumi-command local Commands; the API key travels on stdin only, never on a
command line or in the resource's logged output."""

from __future__ import annotations

import shlex
from pathlib import Path

import pulumi
from pulumi_command import local

CHECK_SCRIPT = Path(__file__).parent / "check_endpoint.py"


def ca_path(path: Path) -> Path:
    """Where the front's certificate is written beside the client configuration."""
    return path.with_name(path.name + ".ca.pem")


def client_config(
    name: str,
    path: Path,
    endpoint: pulumi.Input[str],
    model: pulumi.Input[str],
    api_key: pulumi.Output[str],
    certificate: pulumi.Input[str | None],
) -> local.Command:
    """`path` (0600) holding OPENAI_BASE_URL, OPENAI_MODEL and OPENAI_API_KEY; removed on destroy.
    With a TLS front (the deployment's `frontCertificate`), its certificate beside it
    (`ca_path`) and SSL_CERT_FILE naming it, which the openai client (httpx) and Python's ssl
    read: the client trusts that certificate for this endpoint, not the system's store. A new
    endpoint, model, key or certificate rewrites them (an update runs `create` again)."""
    target, ca = shlex.quote(str(path)), shlex.quote(str(ca_path(path)))
    trust = pulumi.Output.from_input(certificate).apply(
        lambda pem: f"SSL_CERT_FILE={ca_path(path)}\n" if pem else ""
    )
    return local.Command(
        name,
        create=(
            f"umask 077 && cat > {target}.tmp && mv {target}.tmp {target} && "
            f'if [ -n "$FRONT_CERTIFICATE" ]; then printf %s "$FRONT_CERTIFICATE" > {ca}; '
            f"else rm -f {ca}; fi"
        ),
        delete=f"rm -f {target} {ca}",
        # The certificate is no secret: the environment of a local command is this machine's.
        environment={
            "FRONT_CERTIFICATE": pulumi.Output.from_input(certificate).apply(lambda p: p or "")
        },
        stdin=pulumi.Output.format(
            "OPENAI_BASE_URL={0}\nOPENAI_MODEL={1}\nOPENAI_API_KEY={2}\n{3}",
            endpoint,
            model,
            api_key,
            trust,
        ),
        logging=local.Logging.NONE,
    )


def endpoint_check(
    name: str,
    endpoint: pulumi.Input[str],
    model: pulumi.Input[str],
    api_key: pulumi.Output[str],
    config: local.Command,
    config_path: Path,
    certificate: pulumi.Input[str | None],
) -> local.Command:
    """One completion from the endpoint (check_endpoint.py, the key on stdin), trusting the
    front's certificate written with the configuration when the deployment has one. A new
    endpoint, model or key is an update, which runs `create` again (pulumi-command has no
    `update` set)."""
    create = pulumi.Output.all(endpoint, model, certificate).apply(
        lambda values: " ".join(
            shlex.quote(word)
            for word in (
                "python3",
                str(CHECK_SCRIPT),
                str(values[0]),
                str(values[1]),
                *([str(ca_path(config_path))] if values[2] else []),
            )
        )
    )
    return local.Command(
        name,
        create=create,
        stdin=api_key,
        opts=pulumi.ResourceOptions(depends_on=[config]),
    )
