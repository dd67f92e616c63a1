"""The consumer example (examples/consumer/) under Pulumi's mocks, started as the CLI starts it
(its Pulumi.yaml and stack config checked first): a spark-vllm stack's outputs arrive through a
StackReference, and its two local commands run for real, against a stand-in OpenAI endpoint on
loopback."""

from __future__ import annotations

import json
import shutil
import ssl
import stat
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.cli import CliError, PulumiCli
from tests.lab.realmocks import RealMocks, run_program
from tests.mockvalues import SECRET_SIG_KEY, SECRET_SIG_VALUE

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "consumer"
REFERENCE = "organization/spark-vllm/dev"
KEY = "sk-consumer-0f3a"


class Endpoint(BaseHTTPRequestHandler):
    """POST /v1/completions with the right key answers one completion; anything else 401/404."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Endpoint.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self.send_response(401)
            self.end_headers()
            return
        reply = json.dumps({"choices": [{"text": " world"}]}).encode()
        self.send_response(200 if self.path == "/v1/completions" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Endpoint.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


@pytest.fixture
def tls_endpoint(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The stand-in endpoint behind TLS, as a `front.tls` deployment serves it: its URL and the
    certificate the deployment publishes (`frontCertificate`), self-signed for 127.0.0.1."""
    key, cert = tmp_path / "front.key", tmp_path / "front.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=front",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Endpoint.seen.clear()
    yield f"https://127.0.0.1:{server.server_address[1]}/v1", cert.read_text()
    server.shutdown()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the example: its stack files and the written config stay out of the repo."""
    copy = tmp_path / "consumer"
    shutil.copytree(EXAMPLE, copy)
    return copy


def up(
    project: Path,
    endpoint: str,
    key: str = KEY,
    own_key: str | None = None,
    certificate: str | None = None,
    **config: Any,
) -> tuple[RealMocks, dict]:
    """`key`: the deployment's `apiKey` output (the operator's); `own_key`: this project's own,
    set with --secret; `certificate`: the deployment's `frontCertificate` (front.tls)."""
    cli = PulumiCli(project)
    cli.stack_from("dev", {"vllmStack": REFERENCE, **config})
    if own_key is not None:
        cli.config_set("dev", "apiKey", own_key, secret=True)
    mocks = RealMocks()
    secret = {SECRET_SIG_KEY: SECRET_SIG_VALUE, "value": key}
    mocks.stack_references[REFERENCE] = {
        "endpointUrl": endpoint,
        "modelId": "qwen3.5-122b",
        "models": [{"servedName": "qwen3.5-122b", "id": "Qwen/Qwen3.5-122B-A10B-FP8"}],
        "apiKey": secret,
        **({"frontCertificate": certificate} if certificate is not None else {}),
    }
    outputs = run_program(cli, "dev", mocks)
    return mocks, outputs


def test_the_consumer_writes_the_client_config_and_checks_the_endpoint(
    project: Path, endpoint: str
) -> None:
    mocks, outputs = up(project, endpoint)
    assert outputs == {"openaiBaseUrl": endpoint, "model": "qwen3.5-122b",
                       "models": ["qwen3.5-122b"]}  # fmt: skip
    written = project / "openai.env"
    assert written.read_text() == (
        f"OPENAI_BASE_URL={endpoint}\nOPENAI_MODEL=qwen3.5-122b\nOPENAI_API_KEY={KEY}\n"
    )
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert Endpoint.seen == [
        {"path": "/v1/completions", "auth": f"Bearer {KEY}", "model": "qwen3.5-122b",
         "prompt": "Hello", "max_tokens": 8}
    ]  # fmt: skip
    check = next(e for e in mocks.journal if e.name == "endpoint-check")
    assert "answered: ' world'" in check.outputs["stdout"]
    # The key is a secret here too, and on no command line.
    for entry in mocks.journal:
        assert KEY not in json.dumps(entry.inputs.get("create")), entry.name
    config_entry = next(e for e in mocks.journal if e.name == "openai-config")
    assert config_entry.inputs["stdin"][SECRET_SIG_KEY] == SECRET_SIG_VALUE
    mocks.teardown()
    assert not written.exists(), "destroy removes the written key"


def test_a_second_project_uses_its_own_key_and_model(project: Path, endpoint: str) -> None:
    """One of the deployment's `keys`, given to this project: it, not the operator's key, is in
    the client configuration and the check, with the model the key may use."""
    mocks, outputs = up(project, endpoint, key="sk-operator-not-ours", own_key=KEY, model="embed")
    assert outputs["model"] == "embed"
    written = project / "openai.env"
    assert f"OPENAI_API_KEY={KEY}\n" in written.read_text()
    assert "OPENAI_MODEL=embed\n" in written.read_text()
    assert [(seen["auth"], seen["model"]) for seen in Endpoint.seen] == [(f"Bearer {KEY}", "embed")]
    for entry in mocks.journal:
        assert KEY not in json.dumps(entry.inputs.get("create")), entry.name
    mocks.teardown()


def test_a_refused_key_fails_the_up_naming_the_endpoint(project: Path, endpoint: str) -> None:
    with pytest.raises(Exception, match=r"endpoint-check.*HTTP 401 \(the API key was refused\)"):
        up(project, endpoint, key="sk-wrong")


def test_the_check_can_be_left_out(project: Path, endpoint: str) -> None:
    mocks, _ = up(project, endpoint, checkEndpoint=False)
    assert [e.name for e in mocks.journal if e.type == "command:local:Command"] == ["openai-config"]
    assert Endpoint.seen == []
    mocks.teardown()


def test_the_cli_refuses_the_consumer_without_the_stack_to_use(project: Path) -> None:
    cli = PulumiCli(project)
    cli.stack_from("dev", {})
    with pytest.raises(CliError, match="Stack 'dev' is missing configuration value 'vllmStack'"):
        cli.program_config("dev")


def test_a_tls_front_is_trusted_by_the_certificate_the_deployment_publishes(
    project: Path, tls_endpoint: tuple[str, str]
) -> None:
    """With `front.tls` the deployment exports the certificate its front serves: the client
    configuration trusts it (SSL_CERT_FILE, which httpx and Python's ssl read) and the check
    verifies the endpoint against it; nothing else is trusted for it."""
    endpoint, certificate = tls_endpoint
    mocks, _ = up(project, endpoint, certificate=certificate)
    written, ca = project / "openai.env", project / "openai.env.ca.pem"
    assert ca.read_text() == certificate
    assert written.read_text().endswith(f"OPENAI_API_KEY={KEY}\nSSL_CERT_FILE={ca}\n")
    check = next(e for e in mocks.journal if e.name == "endpoint-check")
    assert "answered: ' world'" in check.outputs["stdout"]
    assert [seen["auth"] for seen in Endpoint.seen] == [f"Bearer {KEY}"]
    mocks.teardown()
    assert not written.exists() and not ca.exists(), "destroy removes both files"


def test_a_tls_front_without_its_certificate_is_not_trusted(
    project: Path, tls_endpoint: tuple[str, str]
) -> None:
    """A deployment that published no certificate (self-signed here): the system's store does
    not know it, and the check fails naming the endpoint, before any key is sent."""
    endpoint, _ = tls_endpoint
    with pytest.raises(
        Exception, match=r"endpoint-check.*no completion.*CERTIFICATE_VERIFY_FAILED"
    ):
        up(project, endpoint)
    assert Endpoint.seen == []
