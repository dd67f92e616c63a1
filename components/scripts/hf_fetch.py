"""Runs inside the serving image on the head: make the snapshot complete in the HF cache.

The HF token arrives on stdin (never argv or env). An already complete snapshot is used as is,
without network access, so re-runs are cheap and offline hosts work. Mounted alone into the
container (weights-fetch.sh): it imports nothing of ours (no hostlib.py).
"""

import os
import sys


def main() -> int:
    model, revision = sys.argv[1], sys.argv[2]
    token = sys.stdin.read().strip() or None
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(model, revision=revision, local_files_only=True)
        print(f"complete in cache: {path}", file=sys.stderr)
        return 0
    except Exception as missing:
        print(f"not complete in cache ({type(missing).__name__}); downloading", file=sys.stderr)
    os.environ.pop("HF_HUB_OFFLINE", None)
    try:
        path = snapshot_download(model, revision=revision, token=token)
    except Exception as error:
        message = str(error).replace(token, "***") if token else str(error)
        print(
            f"download of {model}@{revision} failed: {type(error).__name__}: {message}",
            file=sys.stderr,
        )
        return 1
    print(f"downloaded to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
