"""Runs inside the vLLM container: one readiness probe, printed as one line.

`ready <text>` only when /v1/models lists the served name AND a real completion returns a token:
/health alone can answer 200 while the engine is hung (vLLM #39863). The API key is read from stdin.
"""

import json
import sys
import urllib.error
import urllib.request


def request(url: str, key: str, body: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")[:200]


def probe(port: int, served_name: str, key: str, host: str = "127.0.0.1") -> str:
    base = f"http://{host}:{port}"
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


def main() -> None:
    port, served_name = int(sys.argv[1]), sys.argv[2]
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"  # vllm.listen: fabric
    key = sys.stdin.readline().strip()
    print(probe(port, served_name, key, host))


if __name__ == "__main__":
    main()
