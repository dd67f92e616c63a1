"""Pinned host keys in OpenSSH known_hosts form: looked up in the user's file (plain and hashed
entries), and written for the OpenSSH clients the Docker provider spawns."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class PinnedHost(Protocol):
    """What a pin is written from (the plan's SshEndpoint is one): this module sits below the
    plan, which reads pins through it, so it names no type of the plan's."""

    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def host_key(self) -> str | None: ...


def known_hosts_name(address: str, port: int) -> str:
    """The name OpenSSH records for a host: bare for port 22, `[addr]:port` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


# RSA last: pulumi-command offers a server only the pinned key's own type as host-key algorithm
# (`HostKeyAlgorithms = [publicKey.Type()]`), and for RSA that is `ssh-rsa` (SHA-1), which
# OpenSSH 8.8 and later refuse. After an `ssh-keyscan` the RSA line often comes first.
RSA_KEY_TYPE = "ssh-rsa"


def key_preference(key_type: str) -> int:
    """Lower is better: ed25519, then ECDSA, then anything else, RSA last."""
    if key_type in ("ssh-ed25519", "sk-ssh-ed25519@openssh.com"):
        return 0
    if key_type.startswith(("ecdsa-", "sk-ecdsa-")):
        return 1
    return 3 if key_type == RSA_KEY_TYPE else 2


def find_host_key(path: Path, address: str, port: int) -> str | None:
    """The host's `<type> <base64>` key recorded in the file, the best type the file has for it
    (an ed25519 key over an RSA one, whatever their order), or None when it is not there."""
    wanted = known_hosts_name(address, port)
    found: list[tuple[int, int, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith("#"):
            continue
        if fields[0].startswith("@"):  # @cert-authority / @revoked are not pins
            continue
        patterns, key_type, key = fields[0], fields[1], fields[2]
        if any(_matches(pattern, wanted) for pattern in patterns.split(",")):
            found.append((key_preference(key_type), len(found), f"{key_type} {key}"))
    return min(found)[2] if found else None


def is_rsa(host_key: str | None) -> bool:
    return host_key is not None and host_key.split()[0] == RSA_KEY_TYPE


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


def write_known_hosts(path: Path, endpoints: Sequence[PinnedHost]) -> None:
    """The pinned keys in known_hosts form, for OpenSSH clients spawned by the Docker provider.

    Pins written for hosts that are no longer configured are kept: a host removed from the
    stack is still in its state, and its containers' deletes run through this file after the
    program. A configured host has exactly today's pin, or none (unpinned: the lines OpenSSH
    adds itself with accept-new are dropped each run, as are older pins for it).
    """
    pinned = {
        known_hosts_name(e.address, e.port): f"{known_hosts_name(e.address, e.port)} {e.host_key}"
        for e in endpoints
        if e.host_key is not None
    }
    configured = {known_hosts_name(e.address, e.port) for e in endpoints}
    record = path.with_name(path.name + ".pinned")  # the pins this function wrote before
    earlier = record.read_text().splitlines() if record.exists() else []
    # A configured host's pin is today's (or none, unpinned); only removed hosts keep theirs.
    kept = [line for line in earlier if line.split(" ", 1)[0] not in configured]
    content = "".join(f"{line}\n" for line in sorted({*kept, *pinned.values()}))
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for target in (path, record):
        if not target.exists() or target.read_text() != content:
            target.write_text(content)
