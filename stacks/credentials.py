"""This machine's SSH credentials, as the components need them: read from the stack's settings
(stacks/settings.py), used by the components' connections, and nothing of the config with them."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi


@dataclass(frozen=True)
class SshAuth:
    """This machine's credentials. The key's content is a secret; its path is not."""

    private_key: pulumi.Output[str] | None  # None: the agent at SSH_AUTH_SOCK (ssh.useAgent)
    private_key_path: str | None
    dial_error_limit: int
    per_dial_timeout: int
