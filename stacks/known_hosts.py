"""Look up a pinned host key in an OpenSSH known_hosts file (plain and hashed entries)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path


def known_hosts_name(address: str, port: int) -> str:
    """The name OpenSSH records for a host: bare for port 22, `[addr]:port` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


def find_host_key(path: Path, address: str, port: int) -> str | None:
    """The first `<type> <base64>` key recorded for the host, or None when it is not there."""
    wanted = known_hosts_name(address, port)
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith("#"):
            continue
        if fields[0].startswith("@"):  # @cert-authority / @revoked are not pins
            continue
        patterns, key_type, key = fields[0], fields[1], fields[2]
        if any(_matches(pattern, wanted) for pattern in patterns.split(",")):
            return f"{key_type} {key}"
    return None


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        try:
            salt_b64, digest_b64 = pattern[3:].split("|", 1)
            salt = base64.b64decode(salt_b64)
            digest = base64.b64decode(digest_b64)
        except ValueError:
            return False
        computed = hmac.new(salt, name.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(computed, digest)
    return pattern == name
