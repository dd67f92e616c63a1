"""The front's optional TLS (front.tls, stacks/plan/front.py TLS_BIND): refused configurations,
the head's step that writes or makes the certificate (front-tls-file.sh), what the plan and the
outputs become with it on (and that nothing changes with it off: the goldens), and the real
HAProxy (Debian's 2.6, as in the lab image) serving HTTPS with a certificate made by that step:
the key still required, clear-text HTTP and h2 not served, the certificate the one clients pin."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from stacks.config import ConfigError
from stacks.plan import names
from stacks.plan.front import (
    TLS_BIND,
    Route,
    certificate_sha256,
    first_certificate,
    router_config,
    subject_alt_name,
)
from stacks.schema import FrontTlsConfig
from stacks.settings import front_tls_pair
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import FAKE_CERTIFICATE, evaluate, is_secret, step_command
from tests.program.planning import graph_of
from tests.program.ports import free_port
from tests.program.previews import plan
from tests.program.scripting import fake_docker_path, load, run
from tests.program.test_front_reload import FAKE_DOCKER
from tests.program.test_secrets import plain_parts

OPERATOR = "operator-key-0c9e2b7d5a1f3e86"
HAPROXY = shutil.which("haproxy")
OPENSSL = shutil.which("openssl")


def make_pair(directory: Path, name: str, san: str = "IP:127.0.0.1") -> tuple[Path, Path]:
    """A certificate and its key, as a user's CA or `openssl req` would give them."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [str(OPENSSL), "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "2", "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def openssl() -> None:
    if OPENSSL is None:
        pytest.skip("openssl is not installed")


# --- refused configurations ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "refusal"),
    [
        ({"enabled": True, "certificateFile": "/c.pem"}, "certificateFile and keyFile together"),
        ({"enabled": True, "keyFile": "/k.pem"}, "certificateFile and keyFile together"),
        ({"enabled": True}, "needs certificateFile and keyFile, or selfSigned"),
        (
            {"enabled": True, "selfSigned": True, "certificateFile": "/c", "keyFile": "/k"},
            "either selfSigned: true or certificateFile and keyFile",
        ),
    ],
)
def test_a_certificate_needs_its_key_and_one_source(given: dict[str, Any], refusal: str) -> None:
    with pytest.raises(ValidationError, match=refusal):
        FrontTlsConfig.model_validate(given)


def test_off_by_default_reads_no_file() -> None:
    tls = FrontTlsConfig()
    assert not tls.enabled and front_tls_pair(tls) is None


def test_the_users_files_are_read_certificate_first(tmp_path: Path, openssl: None) -> None:
    cert, key = make_pair(tmp_path, "front")
    tls = FrontTlsConfig.model_validate(
        {"enabled": True, "certificateFile": str(cert), "keyFile": str(key)}
    )
    pair = front_tls_pair(tls)
    assert pair == (cert.read_text(), key.read_text())


@pytest.mark.parametrize(
    ("certificate", "key", "refusal"),
    [
        ("no pem here\n", None, "holds no PEM certificate"),
        (None, "-----BEGIN ENCRYPTED PRIVATE KEY-----\nc2VjcmV0\n", "is encrypted"),
        (None, "not a key, secret-words-inside\n", "holds no PEM private key"),
    ],
)
def test_files_that_are_not_a_pem_pair_are_refused_without_quoting_the_key(
    tmp_path: Path, openssl: None, certificate: str | None, key: str | None, refusal: str
) -> None:
    cert_file, key_file = make_pair(tmp_path, "front")
    if certificate is not None:
        cert_file.write_text(certificate)
    if key is not None:
        key_file.write_text(key)
    tls = FrontTlsConfig.model_validate(
        {"enabled": True, "certificateFile": str(cert_file), "keyFile": str(key_file)}
    )
    with pytest.raises(ConfigError, match=refusal) as caught:
        front_tls_pair(tls)
    assert "c2VjcmV0" not in str(caught.value) and "secret-words" not in str(caught.value)


def test_a_missing_file_names_its_setting(tmp_path: Path) -> None:
    tls = FrontTlsConfig.model_validate(
        {"enabled": True, "certificateFile": str(tmp_path / "gone.crt"), "keyFile": "/k"}
    )
    with pytest.raises(ConfigError, match=re.escape("front.tls.certificateFile: cannot read")):
        front_tls_pair(tls)


# --- the head's step (front-tls-file.sh) --------------------------------------------------------


def test_the_users_pair_is_written_private_and_its_certificate_printed(
    tmp_path: Path, openssl: None
) -> None:
    cert, key = make_pair(tmp_path, "front")
    target = tmp_path / "front-secrets" / "tls.pem"
    done = run("front-tls-file.sh", "write", "--host", "h", "--file", str(target),
               stdin=cert.read_text() + key.read_text(), check=True)  # fmt: skip
    assert target.read_text() == cert.read_text() + key.read_text()
    assert target.stat().st_mode & 0o077 == 0
    assert first_certificate(done.stdout) == cert.read_text()
    assert "PRIVATE KEY" not in done.stdout + done.stderr
    run("front-tls-file.sh", "remove", "--host", "h", "--file", str(target), check=True)
    assert not target.parent.exists()


def test_a_key_of_another_certificate_is_refused_and_nothing_written(
    tmp_path: Path, openssl: None
) -> None:
    cert, _ = make_pair(tmp_path, "front")
    _, other_key = make_pair(tmp_path, "other")
    target = tmp_path / "front-secrets" / "tls.pem"
    done = run("front-tls-file.sh", "write", "--host", "h", "--file", str(target),
               stdin=cert.read_text() + other_key.read_text())  # fmt: skip
    assert done.returncode == 1
    assert "front.tls.keyFile is not the private key of front.tls.certificateFile" in done.stderr
    assert "PRIVATE KEY" not in done.stdout + done.stderr
    assert not target.exists() and not list(target.parent.glob("*tmp"))


def test_a_self_signed_certificate_is_made_once_per_name(tmp_path: Path, openssl: None) -> None:
    target = tmp_path / "front-secrets" / "tls.pem"

    def write(san: str) -> str:
        flags = ("--host", "h", "--file", str(target), "--san", san)
        return run("front-tls-file.sh", "write", *flags, check=True).stdout

    first = write("IP:127.0.0.1")
    assert "front certificate made for IP:127.0.0.1" in first
    assert write("IP:127.0.0.1") == first_certificate(first)  # kept: clients' pins hold
    text = subprocess.run(
        [str(OPENSSL), "x509", "-noout", "-text"], input=first_certificate(first),
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "IP Address:127.0.0.1" in text and "CA:FALSE" in text
    renamed = write("DNS:spark1.lan")
    assert "made for DNS:spark1.lan" in renamed
    assert first_certificate(renamed) != first_certificate(first)


def test_self_signed_without_openssl_says_what_to_install(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # the system's tools, openssl left out
    bin_dir.mkdir()
    for directory in ("/usr/bin", "/bin"):
        for tool in Path(directory).iterdir():
            if tool.name != "openssl" and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    target = tmp_path / "front-secrets" / "tls.pem"
    done = run("front-tls-file.sh", "write", "--host", "spark1", "--file", str(target),
               "--san", "IP:10.0.0.1", env={"PATH": str(bin_dir)})  # fmt: skip
    assert done.returncode == 1
    assert "openssl is not installed on spark1" in done.stderr
    assert "apt install openssl" in done.stderr


def test_the_fingerprint_is_opensslls(tmp_path: Path, openssl: None) -> None:
    cert, _ = make_pair(tmp_path, "front")
    printed = subprocess.run(
        [str(OPENSSL), "x509", "-noout", "-fingerprint", "-sha256", "-in", str(cert)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert printed.strip().split("=", 1)[1] == certificate_sha256(cert.read_text())
    assert certificate_sha256("no certificate") == ""


@pytest.mark.parametrize(
    ("host", "san"),
    [
        ("10.240.1.11", "IP:10.240.1.11"),
        ("127.0.0.1", "IP:127.0.0.1"),
        ("spark1.lan", "DNS:spark1.lan"),
    ],
)
def test_the_self_signed_name_is_the_endpoints_address(host: str, san: str) -> None:
    assert subject_alt_name(host) == san


# --- the plan and the outputs -------------------------------------------------------------------


def with_tls(make_config: ConfigFactory, **tls: Any) -> dict[str, Any]:
    return make_config(front={"tls": {"enabled": True, **tls}})


def test_off_plans_no_step_and_an_http_endpoint(make_config: ConfigFactory) -> None:
    plan, graph = graph_of(make_config())
    assert names.FRONT_TLS not in graph.by_name
    assert plan.endpoint_url == "http://10.240.1.11:8000/v1"
    assert "ssl" not in graph.by_name[names.FRONT_CONFIG].spec.create  # type: ignore[union-attr]


def test_self_signed_plans_the_step_before_the_front_and_its_reload(
    make_config: ConfigFactory,
) -> None:
    plan, graph = graph_of(with_tls(make_config, selfSigned=True))
    assert plan.endpoint_url == "https://10.240.1.11:8000/v1"
    step = graph.by_name[names.FRONT_TLS]
    assert "--san IP:10.240.1.11" in step.spec.create  # type: ignore[union-attr]
    assert step.spec.stdin is None  # type: ignore[union-attr]
    assert names.FRONT_TLS in graph.by_name[names.FRONT_CONTAINER].after
    reload = graph.by_name[names.FRONT_RELOAD]
    assert names.FRONT_TLS in reload.after
    assert "--tls-file" in reload.spec.create  # type: ignore[union-attr]
    config = graph.by_name[names.FRONT_CONFIG].spec.create  # type: ignore[union-attr]
    assert TLS_BIND.format(crt="/run/spark-vllm-front/tls.pem") + " proto h1" in config
    ready = graph.by_name[names.ready_of(names.VLLM)].spec.create  # type: ignore[union-attr]
    assert "--probe-host https://127.0.0.1" in ready


def test_the_users_certificate_travels_on_stdin_and_reloads_the_front(
    make_config: ConfigFactory, tmp_path: Path, openssl: None
) -> None:
    cert, key = make_pair(tmp_path, "front")
    config = with_tls(make_config, certificateFile=str(cert), keyFile=str(key))
    _, graph = graph_of(config)
    step = graph.by_name[names.FRONT_TLS]
    assert step.spec.stdin == "front-tls" and step.spec.quiet == "none"  # type: ignore[union-attr]
    assert "--san" not in step.spec.create  # type: ignore[union-attr]
    assert "front-tls" in graph.by_name[names.FRONT_RELOAD].secret_triggers


def test_outputs_publish_the_https_endpoint_and_the_users_certificate(
    make_config: ConfigFactory, tmp_path: Path, openssl: None
) -> None:
    cert, key = make_pair(tmp_path, "front", san="IP:10.240.1.11")
    ev = evaluate(with_tls(make_config, certificateFile=str(cert), keyFile=str(key)), SECRETS)
    assert ev.outputs["endpointUrl"] == "https://10.240.1.11:8000/v1"
    assert ev.outputs["frontCertificate"] == cert.read_text()
    assert ev.outputs["frontCertificateSha256"] == certificate_sha256(cert.read_text())
    step = ev.named(names.FRONT_TLS)
    assert is_secret(step.inputs["stdin"]) and step.inputs["logging"] == "none"
    assert step.inputs["stdin"]["value"] == cert.read_text() + key.read_text()
    key_body = key.read_text().splitlines()[1]
    for resource in ev.registrations:  # the key on stdin alone, a secret
        assert key_body not in json.dumps(plain_parts(resource.inputs)), resource.name
    assert "PRIVATE KEY" not in str(step_command(step.inputs["create"]))


def test_a_renewed_certificate_rewrites_it_and_reloads_the_front(
    make_config: ConfigFactory, tmp_path: Path, openssl: None
) -> None:
    old_cert, old_key = make_pair(tmp_path, "old")
    new_cert, new_key = make_pair(tmp_path, "new")
    before = with_tls(make_config, certificateFile=str(old_cert), keyFile=str(old_key))
    after = with_tls(make_config, certificateFile=str(new_cert), keyFile=str(new_key))
    assert plan(before, after) == {"front-tls": "update", "front-reload": "replace"}


def test_outputs_publish_the_certificate_the_head_made(make_config: ConfigFactory) -> None:
    ev = evaluate(with_tls(make_config, selfSigned=True), SECRETS)
    assert ev.outputs["frontCertificate"] == first_certificate(FAKE_CERTIFICATE)
    assert ev.outputs["frontCertificateSha256"] == certificate_sha256(FAKE_CERTIFICATE)


# --- the real HAProxy ---------------------------------------------------------------------------


def echo_server() -> ThreadingHTTPServer:
    """A stand-in vLLM: 200 with the path for the operator's key, else its own 401."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            admitted = self.headers.get("Authorization") == f"Bearer {OPERATOR}"
            body = json.dumps({"path": self.path} if admitted else {"error": "401"}).encode()
            self.send_response(200 if admitted else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Front:
    port: int
    certificate: str  # as the step printed it: what clients trust

    def trusting(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.certificate)
        return context

    def ask(self, path: str, key: str | None) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.port, timeout=10, context=self.trusting()
        )
        try:
            connection.request(
                "GET", path, headers={"Authorization": f"Bearer {key}"} if key else {}
            )
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    if HAPROXY is None or OPENSSL is None:
        if os.environ.get("CI") == "true":
            pytest.fail("HAProxy and openssl (lab/install-deps.sh) are not installed")
        pytest.skip("HAProxy or openssl (lab/install-deps.sh) is not installed")
    workdir = tmp_path_factory.mktemp("front-tls")
    server = echo_server()
    route = Route("alpha", "org/alpha", None, (("s", f"127.0.0.1:{server.server_address[1]}"),))
    (workdir / "bearer").write_text(f"Bearer {OPERATOR}\n")
    pem = workdir / "tls.pem"
    made = run("front-tls-file.sh", "write", "--host", "h", "--file", str(pem),
               "--san", "IP:127.0.0.1", check=True)  # fmt: skip
    port = free_port()
    config = workdir / "haproxy.cfg"
    config.write_text(
        router_config(
            f"127.0.0.1:{port}", str(workdir / "bearer"), [route], "/unused", tls_cert=str(pem)
        )
    )
    check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    process = subprocess.Popen(
        [HAPROXY, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    running = Front(port, first_certificate(made.stdout))
    deadline = time.monotonic() + 20
    while True:
        try:
            running.ask("/health", OPERATOR)
            break
        except OSError:
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.1)
    try:
        yield running
    finally:
        process.terminate()
        process.wait(timeout=10)
        server.shutdown()


def test_the_key_over_tls_reaches_the_server_verified_against_the_certificate(
    front: Front,
) -> None:
    assert front.ask("/v1/models", OPERATOR) == (200, b'{"path": "/v1/models"}')


def test_the_key_is_still_required_over_tls(front: Front) -> None:
    status, body = front.ask("/v1/models", None)
    assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
    assert front.ask("/v1/models", "not-the-key-0123456789abcdef")[0] == 401


def test_clear_text_http_is_not_served(front: Front) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, OSError)):
            connection.request("GET", "/v1/models", headers={"Authorization": f"Bearer {OPERATOR}"})
            connection.getresponse().read()
    finally:
        connection.close()


def test_h2_is_not_negotiated(front: Front) -> None:
    context = front.trusting()
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", front.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.selected_alpn_protocol() != "h2"
    context.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", front.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.selected_alpn_protocol() == "http/1.1"


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_older_than_1_2_is_refused(front: Front) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=front.certificate)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # lets this client offer TLS 1.1 at all
    context.minimum_version = ssl.TLSVersion.TLSv1_1
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    with (
        socket.create_connection(("127.0.0.1", front.port), timeout=10) as raw,
        pytest.raises(ssl.SSLError),
    ):
        context.wrap_socket(raw, server_hostname="127.0.0.1")


def test_the_pinned_fingerprint_is_the_served_certificates(front: Front) -> None:
    context = front.trusting()
    with (
        socket.create_connection(("127.0.0.1", front.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        served = tls.getpeercert(binary_form=True)
    assert served is not None
    pem = ssl.DER_cert_to_PEM_cert(served)
    assert certificate_sha256(pem) == certificate_sha256(front.certificate)


def test_the_readiness_probe_reaches_the_tls_front(front: Front) -> None:
    probe = load("vllm_probe")
    assert probe.origin("https://127.0.0.1", front.port) == f"https://127.0.0.1:{front.port}"
    assert probe.origin("10.0.0.1", 8000) == "http://10.0.0.1:8000"
    base = probe.origin("https://127.0.0.1", front.port)
    assert probe.request(f"{base}/health", OPERATOR) == (200, '{"path": "/health"}')


def test_turning_it_on_replaces_no_container(make_config: ConfigFactory) -> None:
    """What the next `pulumi preview` shows (docs/upgrading.md): the certificate's step, the
    front's configuration and its reload, the readiness wait (now over HTTPS); no container."""
    assert plan(make_config(), with_tls(make_config, selfSigned=True)) == {
        "front-tls": "create",
        "front-config": "update",
        "front-reload": "update",
        "vllm-ready": "update",
    }


# --- turning it on: a running front reloaded onto HTTPS (front-reload.sh) ------------------------


@pytest.fixture
def clear_text_front(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A front as a deployment without front.tls runs it (HAProxy's master-worker, `-W`), and
    what front-reload.sh needs to reload it (Docker a stand-in that runs its commands here)."""
    if HAPROXY is None or OPENSSL is None:
        pytest.skip("HAProxy or openssl (lab/install-deps.sh) is not installed")
    server = echo_server()
    route = Route("alpha", "org/alpha", None, (("s", f"127.0.0.1:{server.server_address[1]}"),))
    (tmp_path / "bearer").write_text(f"Bearer {OPERATOR}\n")
    port = free_port()
    config = tmp_path / "front" / "haproxy.cfg"
    config.parent.mkdir()

    def configure(tls_cert: str | None) -> None:
        bind, bearer = f"127.0.0.1:{port}", str(tmp_path / "bearer")
        config.write_text(router_config(bind, bearer, [route], "/unused", tls_cert=tls_cert))

    configure(None)
    master = subprocess.Popen([str(HAPROXY), "-W", "-db", "-f", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    env = {"PATH": fake_docker_path(tmp_path, FAKE_DOCKER), "FAKE_MASTER_PID": str(master.pid)}
    deadline = time.monotonic() + 20
    while True:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/")
            break
        except OSError:
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.1)
    try:
        yield {"port": port, "config": config, "configure": configure, "env": env}
    finally:
        master.terminate()
        master.wait(timeout=10)
        server.shutdown()


def reload_front(front: dict[str, Any], tls_file: Path) -> subprocess.CompletedProcess[str]:
    config = str(front["config"])
    return run("front-reload.sh", "--host", "spark1", "--container", "front", "--file", config,
               "--config", config, "--digest", "d2", "--tls-file", str(tls_file),
               env=front["env"])  # fmt: skip


def test_turning_it_on_reloads_a_running_front_onto_https(
    clear_text_front: dict[str, Any], tmp_path: Path
) -> None:
    pem = tmp_path / "front-secrets" / "tls.pem"
    made = run("front-tls-file.sh", "write", "--host", "h", "--file", str(pem),
               "--san", "IP:127.0.0.1", check=True)  # fmt: skip
    clear_text_front["configure"](str(pem))
    done = reload_front(clear_text_front, pem)
    assert done.returncode == 0 and "front reloaded" in done.stdout, done.stderr
    tls = Front(clear_text_front["port"], first_certificate(made.stdout))
    deadline = time.monotonic() + 10
    while True:
        try:
            assert tls.ask("/v1/models", OPERATOR) == (200, b'{"path": "/v1/models"}')
            break
        except (OSError, http.client.HTTPException):
            assert time.monotonic() < deadline, "the front does not serve HTTPS after its reload"
            time.sleep(0.1)


def test_a_pair_haproxy_cannot_load_is_not_loaded_and_named(
    clear_text_front: dict[str, Any], tmp_path: Path
) -> None:
    """On a head without openssl the step cannot check the pair: HAProxy's check refuses it, the
    front keeps serving, and the failure names front.tls."""
    cert, _ = make_pair(tmp_path, "front")
    _, other_key = make_pair(tmp_path, "other")
    pem = tmp_path / "tls.pem"
    pem.write_text(cert.read_text() + other_key.read_text())
    clear_text_front["configure"](str(pem))
    done = reload_front(clear_text_front, pem)
    assert done.returncode == 1 and "HAProxy refuses" in done.stderr
    assert "front.tls's certificate and key do not belong together" in done.stderr
    connection = http.client.HTTPConnection("127.0.0.1", clear_text_front["port"], timeout=10)
    connection.request("GET", "/v1/models", headers={"Authorization": f"Bearer {OPERATOR}"})
    assert connection.getresponse().status == 200  # the clear-text front still serves
    connection.close()
