"""The consumer's two resources: the client configuration file, and a check that the endpoint
answers. Both are pulumi-command local Commands; the API key travels on stdin only, never on a
command line or in the resource's logged output."""

from __future__ import annotations

import shlex
from pathlib import Path

import pulumi
from pulumi_command import local

CHECK_SCRIPT = Path(__file__).parent / "check_endpoint.py"


def client_config(
    name: str,
    path: Path,
    endpoint: pulumi.Input[str],
    model: pulumi.Input[str],
    api_key: pulumi.Output[str],
) -> local.Command:
    """`path` (0600) holding OPENAI_BASE_URL, OPENAI_MODEL and OPENAI_API_KEY; removed on destroy.
    A new endpoint, model or key rewrites it (an update runs `create` again)."""
    target = shlex.quote(str(path))
    return local.Command(
        name,
        create=f"umask 077 && cat > {target}.tmp && mv {target}.tmp {target}",
        delete=f"rm -f {target}",
        stdin=pulumi.Output.format(
            "OPENAI_BASE_URL={0}\nOPENAI_MODEL={1}\nOPENAI_API_KEY={2}\n", endpoint, model, api_key
        ),
        logging=local.Logging.NONE,
    )


def endpoint_check(
    name: str,
    endpoint: pulumi.Input[str],
    model: pulumi.Input[str],
    api_key: pulumi.Output[str],
    after: pulumi.Resource,
) -> local.Command:
    """One completion from the endpoint (check_endpoint.py, the key on stdin). A new endpoint,
    model or key is an update, which runs `create` again (pulumi-command has no `update` set)."""
    create = pulumi.Output.all(endpoint, model).apply(
        lambda values: " ".join(
            shlex.quote(word)
            for word in ("python3", str(CHECK_SCRIPT), str(values[0]), str(values[1]))
        )
    )
    return local.Command(
        name,
        create=create,
        stdin=api_key,
        opts=pulumi.ResourceOptions(depends_on=[after]),
    )
