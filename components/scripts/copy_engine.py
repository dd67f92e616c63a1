"""The copy engine: on the head, send one worker the serving image or the model's weights over
the fabric, only what it lacks, watched while the bytes move. image-sync.sh and weights-sync.sh
run it; standard library only: it runs with the head's own python3, beside its sibling modules.

    copy_engine.py image --host H --worker W --target ssh://user@ip:port --image-id ID --ref REF
        --pinned NAME --worker-bin DIR --timeout-minutes M [--compress auto|zstd|none]
        [--progress-seconds S] [--stall-seconds S] [--fabric-key K --fabric-known-hosts F]
        [--relay CHAIN] [--remove yes [--owner ID]]
    copy_engine.py weights --host H --worker W --target ssh://user@ip:port --worker-bin DIR
        --cache-dir C --model M --manifest "commit files bytes" --timeout-minutes M
        [--include JSON] [--exclude JSON] [--compress auto|zstd|none] [--progress-seconds S]
        [--stall-seconds S]
        [--fabric-key ...] [--relay CHAIN]

Organised as pyinfra organises an operation: the facts are read first (every worker of a relay
chain at once, each over its own multiplexed connection, every question bounded in time:
copy_transport.py), the decisions are pure functions of them (copy_plan.py, table-tested), and
the byte pump (copy_pump.py) moves the bytes: it counts them itself, prints progress every
`--progress-seconds`, and stops a stream that moved nothing for `--stall-seconds`
(timeouts.copyStallSeconds), the processes of both ends, naming the worker and the bytes sent.
One relay (copy_relay.py) serves both payloads (copy_image.py, copy_weights.py; copy_step.py
holds what they share): with `--relay` (the first worker's step: every worker, a
`name|destination|bin` line each), the workers that lack the payload get one stream passed from
worker to worker (relay.sh), so the head's link carries one copy, not one per worker; each
worker's own step then finds it there, or copies what the chain did not bring.

The last line of stdout is `spark-vllm-image-sent {json}` or `spark-vllm-weights-sent {json}`;
a failure is one `spark-vllm: HOST: STEP: WHAT` line and its likely cause, exit status 1.
"""

from __future__ import annotations

import sys

from copy_image import ImageCopy
from copy_step import Copy
from copy_weights import WeightsCopy
from hostlib import run_step

COPIES: dict[str, type[Copy]] = {
    "image": ImageCopy,
    "weights": WeightsCopy,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COPIES:
        print(__doc__, file=sys.stderr)
        return 2
    kind = COPIES[argv[0]]

    def copy(flags: dict[str, str]) -> None:
        made = kind(flags)
        try:
            made.run()
        finally:
            made.close()

    return run_step(kind.step, argv[1:], copy)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
