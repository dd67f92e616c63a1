"""Values as Pulumi's mock runtime delivers them: one definition for every mocks harness."""

from __future__ import annotations

from typing import Any

import grpc

# How the mock runtime marks a secret value (pulumi's rpc "special signature" for secrets).
SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG_VALUE = "1b47061264138c4ac30d75fd1eb44270"


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SECRET_SIG_KEY) == SECRET_SIG_VALUE


def unwrap_secrets(value: Any) -> Any:
    """The plain value, with every secret wrapper (at any depth) removed."""
    if is_secret(value):
        return unwrap_secrets(value.get("value"))
    if isinstance(value, dict):
        return {key: unwrap_secrets(item) for key, item in value.items()}
    if isinstance(value, list):
        return [unwrap_secrets(item) for item in value]
    return value


class ProviderInvokeError(grpc.RpcError):
    """A provider's invoke error as the engine hands it to the program: a gRPC error whose
    details are `invocation of <token> returned an error: <error>` (pulumi/pulumi
    pkg/resource/deploy/source_eval.go, resmon Invoke); the SDK raises it as
    `invoke of <token> failed: <details>` (pulumi/runtime/invoke.py)."""

    def __init__(self, token: str, error: str) -> None:
        super().__init__(error)
        self._details = f"invocation of {token} returned an error: {error}"

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self._details
