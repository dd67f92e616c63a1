"""What could reach the keys' table other than the front's own tracking, run against the real
HAProxy (Debian's 2.6, as in the lab image): the table's handover admits only a peer with the
deployment's certificate, and /metrics/keys prints only the configured keys, each escaped as a
Prometheus label value, whatever entries the table holds."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacks.plan.front import (
    HANDOVER_CERT_NAME,
    HANDOVER_HOST,
    KEY_METRICS_PATH,
    LOCAL_PEER,
    Key,
    Route,
    handover_address,
    keys_lua,
    prometheus_label_value,
    router_config,
)
from stacks.settings import key_entry, keys_map
from tests.program.ports import free_port
from tests.program.scripting import make_handover_pair

HAPROXY = shutil.which("haproxy")
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason="HAProxy is not installed")
KEYS = (Key("alice"), Key("carol"))
# Not a name the configuration admits (NAME_PATTERN): what the Lua must still print safely (a
# line feed cannot be in the map's entry, so the Lua never prints one: prometheus_label_value's
# table has it).
ODD = 'o"dd\\na'
ALICE = "alice-key-5f0c2d7e9b1a4c38e6d2"
ODD_KEY = "odd-key-3e8c1f0a7d2b9e5c4a6f"
KEYS_MAP = keys_map([("alice", ALICE), (ODD, ODD_KEY)])
# An entry crafted to close the label and add a series of its own to what Prometheus stores.
CRAFTED = 'x"} 9\nspark_vllm_key_requests_total{key="alice'


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("alice", "alice"),
        ('a"b', 'a\\"b'),
        ("a\\b", "a\\\\b"),
        ("a\nb", "a\\nb"),
        ("a\\n", "a\\\\n"),  # a backslash then `n`: not a line feed once read back
    ],
)
def test_a_label_value_is_escaped_as_prometheus_reads_it(name: str, label: str) -> None:
    assert prometheus_label_value(name) == label


def test_the_lua_names_only_the_configured_keys() -> None:
    text = keys_lua(KEYS, "/run/k/keys.map")
    assert '["alice"] = "alice",' in text and '["carol"] = "carol",' in text
    assert 'io.open("/run/k/keys.map", "r")' in text  # the current entries: the map's
    assert "if current[entry] and name ~= nil and labels[name] ~= nil then" in text
    assert "bob" not in text


@pytest.fixture
def front_with_injector(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The front's configuration for KEYS, its Lua written for KEYS and ODD, and beside it a
    frontend that puts any entry into the keys' table (the header's value, percent-decoded):
    what a peer, or a later configuration, could leave there."""
    assert HAPROXY is not None
    port, metrics, inject = free_port(), free_port(), free_port()
    (tmp_path / "bearer").write_text("Bearer operator-key-0c9e2b7d5a1f3e86\n")
    (tmp_path / "keys.map").write_text(KEYS_MAP)
    (tmp_path / "upstream.map").write_text("operator Bearer operator-key-0c9e2b7d5a1f3e86\n")
    (tmp_path / "keys.lua").write_text(keys_lua((*KEYS, Key(ODD)), str(tmp_path / "keys.map")))
    config = router_config(
        f"127.0.0.1:{port}",
        str(tmp_path / "bearer"),
        [Route("alpha", "org/alpha", None, (("s", "127.0.0.1:1"),))],
        str(tmp_path / "models.json"),
        f"127.0.0.1:{metrics}",
        keys=KEYS,
        keys_map=str(tmp_path / "keys.map"),
        keys_lua=str(tmp_path / "keys.lua"),
    )
    config += "\n".join(
        [
            "frontend inject",
            f"    bind 127.0.0.1:{inject}",
            "    http-request track-sc2 req.hdr(x-entry),url_dec table keys",
            "    http-request return status 200",
            "",
        ]
    )
    (tmp_path / "haproxy.cfg").write_text(config)
    process = subprocess.Popen(
        [HAPROXY, "-db", "-f", str(tmp_path / "haproxy.cfg")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{inject}/", timeout=5).read()
                break
            except OSError:
                assert process.poll() is None, "HAProxy refused the configuration"
                assert time.monotonic() < deadline, "HAProxy did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{inject}/", f"http://127.0.0.1:{metrics}{KEY_METRICS_PATH}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@needs_haproxy
def test_only_configured_keys_reach_the_metrics_each_escaped(
    front_with_injector: tuple[str, str],
) -> None:
    inject, metrics = front_with_injector
    # A configured name, bare or with an earlier key's tag (a revoked key's, its name now
    # given to a new key), is not a current entry: only the map's are printed.
    stale = key_entry("alice", "alice-key-of-before-0a1b2c3d4e5f")
    entries = (key_entry("alice", ALICE), stale, stale, "alice", "mallory", CRAFTED)
    for entry in (*entries, key_entry(ODD, ODD_KEY)):
        request = urllib.request.Request(inject, headers={"x-entry": urllib.parse.quote(entry)})
        urllib.request.urlopen(request, timeout=5).read()
    with urllib.request.urlopen(metrics, timeout=5) as response:
        text = response.read().decode()
    series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")]
    odd = prometheus_label_value(ODD)
    assert series == [
        f'spark_vllm_key_{metric}_total{{key="{label}"}}'
        for metric in ("requests", "bytes_in", "bytes_out")
        for label in ("alice", odd)
    ], text
    assert 'spark_vllm_key_requests_total{key="alice"} 1\n' in text
    assert "mallory" not in text and "x\\" not in text


# --- the table handover: TLS with the deployment's certificate, both ways ---------------------

# The peers protocol's hello (HAProxy 2.6 src/peers.c): its version, the name of the peer it
# asks for, then its own name, pid and relative pid. The front answers "200" when it accepts.
HELLO = f"HAProxyS 2.1\n{LOCAL_PEER}\n{LOCAL_PEER} 1 1\n".encode()


@pytest.fixture
def handover_front(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """The front for KEYS with its handover on 127.0.0.2, its key pair made as the head makes it."""
    assert HAPROXY is not None
    port, metrics = free_port(), free_port()
    (tmp_path / "bearer").write_text("Bearer operator-key-0c9e2b7d5a1f3e86\n")
    (tmp_path / "keys.map").write_text(KEYS_MAP)
    (tmp_path / "upstream.map").write_text("operator Bearer operator-key-0c9e2b7d5a1f3e86\n")
    pair = tmp_path / HANDOVER_CERT_NAME
    make_handover_pair(pair)
    (tmp_path / "haproxy.cfg").write_text(
        router_config(
            f"127.0.0.1:{port}",
            str(tmp_path / "bearer"),
            [Route("alpha", "org/alpha", None, (("s", "127.0.0.1:1"),))],
            str(tmp_path / "models.json"),
            keys=KEYS,
            keys_map=str(tmp_path / "keys.map"),
            handover=handover_address(metrics),
            handover_cert=str(pair),
        )
    )
    process = subprocess.Popen(
        [HAPROXY, "-db", "-f", str(tmp_path / "haproxy.cfg")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((HANDOVER_HOST, metrics), timeout=5).close()
                break
            except OSError:
                assert process.poll() is None, "HAProxy refused the configuration"
                assert time.monotonic() < deadline, "HAProxy did not start"
                time.sleep(0.1)
        yield pair, metrics
    finally:
        process.terminate()
        process.wait(timeout=10)


def hello_over_tls(port: int, pair: Path | None) -> bytes:
    """The peers' hello over TLS, presenting `pair` (None: no certificate); what comes back."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the front is not what is checked here
    if pair is not None:
        context.load_cert_chain(pair)
    with (
        socket.create_connection((HANDOVER_HOST, port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        tls.sendall(HELLO)
        return tls.recv(100)


@needs_haproxy
def test_the_handover_admits_only_the_deployments_certificate(
    handover_front: tuple[Path, int], tmp_path: Path
) -> None:
    pair, port = handover_front
    # With the deployment's pair, the peer is accepted (what the old workers do at a reload).
    assert hello_over_tls(port, pair).startswith(b"200")
    # No certificate: TLS 1.3 reports the refusal once the client has sent its part.
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
        hello_over_tls(port, None)
    # A certificate of one's own (another deployment's, or made for the purpose).
    stranger = tmp_path / "stranger" / HANDOVER_CERT_NAME
    stranger.parent.mkdir()
    make_handover_pair(stranger)
    with pytest.raises(ssl.SSLError, match="ALERT_UNKNOWN_CA"):
        hello_over_tls(port, stranger)
    # The peers protocol in clear text: no answer but the connection's end.
    with socket.create_connection((HANDOVER_HOST, port), timeout=5) as plain:
        plain.sendall(HELLO)
        try:
            answer = plain.recv(100)
        except ConnectionResetError:
            answer = b""
    assert not answer.startswith(b"200"), answer
