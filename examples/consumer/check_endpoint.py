"""Ask an OpenAI-compatible endpoint for one short completion.

    python3 check_endpoint.py BASE_URL MODEL   (the API key on stdin)

Prints `answered: <text>`; on failure, one line naming the endpoint and what went wrong, and the
exit is 1. Bounded: 60 s for the answer.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request


def main(base_url: str, model: str, api_key: str) -> int:
    request = urllib.request.Request(
        base_url.rstrip("/") + "/completions",
        data=json.dumps({"model": model, "prompt": "Hello", "max_tokens": 8}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
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
    sys.exit(main(sys.argv[1], sys.argv[2], sys.stdin.read().strip()))
