"""Runs inside the vLLM container: one readiness probe, printed as one line.

`ready <text>` only when /v1/models lists the served name AND a real completion returns a token:
/health alone can answer 200 while the engine is hung (vLLM #39863). The API key is read from stdin.

    vllm_probe.py PORT SERVED_NAME [HOST] [measure N]

HOST may be `https://ADDRESS`: the front with front.tls. Its certificate is not checked: ADDRESS
is the head's own (the probe runs there), so no one on a network can stand in for it, and the
certificate may name another address (endpointUrl's) or be self-signed.

With `measure N` (once ready), N streamed completions of a fixed prompt, one at a time, give
`speed <time to first token> <decode tokens/s> ...`: medians, bounded by MEASURE_SECONDS.
"""

import json
import ssl
import statistics
import sys
import time
import urllib.error
import urllib.request

# No proxy, whatever the environment says (the image's, vllm.env's or the SSH session's
# http_proxy): these requests go to this cluster's own addresses, some with the API key.
UNCHECKED_TLS = ssl.create_default_context()
UNCHECKED_TLS.check_hostname = False
UNCHECKED_TLS.verify_mode = ssl.CERT_NONE
DIRECT = urllib.request.build_opener(
    urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=UNCHECKED_TLS)
)

MEASURE_SECONDS = 120  # the whole measurement; a slower server reports what it measured
MEASURE_TOKENS = 64
MEASURE_PROMPT = "Count from one to one hundred in words, separated by commas:"


def request(url: str, key: str, body: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with DIRECT.open(req, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")[:200]


def origin(host: str, port: int) -> str:
    """`http://HOST:PORT`, or `https://ADDRESS:PORT` for HOST `https://ADDRESS`."""
    scheme, _, address = host.rpartition("://")
    return f"{scheme or 'http'}://{address}:{port}"


def probe(port: int, served_name: str, key: str, host: str = "127.0.0.1") -> str:
    base = origin(host, port)
    try:
        status, _ = request(f"{base}/health", key)
    except OSError as error:
        return f"starting port {port} not answering ({error.__class__.__name__})"
    if status != 200:
        return f"starting /health={status}"
    status, body = request(f"{base}/v1/models", key)
    if status == 401:
        return "unauthorized /v1/models rejected the API key"
    names = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
    if served_name not in names:
        return f"waiting /v1/models={status} lists {names}, not {served_name!r}"
    completion = {"model": served_name, "prompt": "Say hello.", "max_tokens": 4, "temperature": 0}
    try:
        status, body = request(f"{base}/v1/completions", key, completion, timeout=120)
    except OSError as error:
        return f"waiting completion failed ({error.__class__.__name__}: {error})"
    if status != 200:
        return f"waiting completion={status} {body[:120]}"
    reply = json.loads(body)
    tokens = reply.get("usage", {}).get("completion_tokens", 0)
    text = reply["choices"][0].get("text", "") if reply.get("choices") else ""
    if tokens < 1:
        return "waiting completion returned no tokens"
    return "ready " + json.dumps(text)


def stream_once(base: str, served_name: str, key: str, timeout: float) -> tuple[float, float, int]:
    """One streamed completion: (seconds to the first token, seconds from the first token to
    the last, tokens after the first). Each SSE chunk with text is one token, as vLLM streams."""
    body = {
        "model": served_name,
        "prompt": MEASURE_PROMPT,
        "max_tokens": MEASURE_TOKENS,
        "temperature": 0,
        "ignore_eos": True,  # a fixed length, whatever the model would say
        "stream": True,
    }
    req = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    sent = time.monotonic()
    first = last = None
    tokens = 0
    with DIRECT.open(req, timeout=timeout) as response:
        for raw in response:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[len("data: ") :]).get("choices") or []
            if any(choice.get("text") for choice in choices):
                last = time.monotonic()
                first = first if first is not None else last
                tokens += 1
    if first is None or last is None:
        raise ValueError("the stream carried no token")
    return first - sent, last - first, tokens - 1


def measure(port: int, served_name: str, key: str, host: str, runs: int) -> str:
    """`speed TTFT_S DECODE_TOK_S RUNS TOKENS VERSION`, medians of the runs that finished."""
    base = origin(host, port)
    deadline = time.monotonic() + MEASURE_SECONDS
    ttfts, rates, tokens = [], [], 0
    for _ in range(runs):
        left = deadline - time.monotonic()
        if left <= 1:
            break
        try:
            ttft, decode_s, decoded = stream_once(base, served_name, key, left)
        except (OSError, ValueError) as error:
            return f"speed-failed {error.__class__.__name__}: {error}"
        ttfts.append(ttft)
        if decoded > 0 and decode_s > 0:
            rates.append(decoded / decode_s)
        tokens = decoded + 1
    if not ttfts:
        return "speed-failed no completion within the time allowed"
    try:
        _, version_body = request(f"{base}/version", key)
        version = json.loads(version_body).get("version", "unknown")
    except (OSError, ValueError):
        version = "unknown"
    rate = statistics.median(rates) if rates else 0.0
    return f"speed {statistics.median(ttfts):.3f} {rate:.1f} {len(ttfts)} {tokens} {version}"


def main() -> None:
    port, served_name = int(sys.argv[1]), sys.argv[2]
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"  # vllm.listen: fabric
    key = sys.stdin.readline().strip()
    if len(sys.argv) > 5 and sys.argv[4] == "measure":
        print(measure(port, served_name, key, host, int(sys.argv[5])))
        return
    print(probe(port, served_name, key, host))


if __name__ == "__main__":
    main()
