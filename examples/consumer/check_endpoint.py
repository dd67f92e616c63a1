"""Ask an OpenAI-compatible endpoint for one short completion.

    python3 check_endpoint.py BASE_URL MODEL [CA_FILE]   (the API key on stdin)

CA_FILE: the certificate to trust for an https endpoint (a TLS front's), instead of the system's.

Prints `answered: <text>`; on failure, one line naming the endpoint and what went wrong, and the
exit is 1. Bounded: 60 s for the answer.
"""

from __future__ import annotations

import json
import ssl
import sys
import urllib.error
import urllib.request


def main(base_url: str, model: str, api_key: str, ca_file: str | None = None) -> int:
    request = urllib.request.Request(
        base_url.rstrip("/") + "/completions",
        data=json.dumps({"model": model, "prompt": "Hello", "max_tokens": 8}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        method="POST",
    )
    try:
        trust = ssl.create_default_context(cafile=ca_file) if ca_file else None
        with urllib.request.urlopen(request, timeout=60, context=trust) as response:
            text = json.loads(response.read())["choices"][0]["text"]
    except urllib.error.HTTPError as error:
        hint = " (the API key was refused)" if error.code == 401 else ""
        print(f"{base_url}: HTTP {error.code}{hint}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, IndexError) as error:
        print(f"{base_url}: no completion: {error}", file=sys.stderr)
        return 1
    print(f"answered: {text!r}")
    return 0


if __name__ == "__main__":
    ca = sys.argv[3] if len(sys.argv) > 3 else None
    sys.exit(main(sys.argv[1], sys.argv[2], sys.stdin.read().strip(), ca))
