"""TCP throughput between two hosts over the fabric, measured with the hosts' own python3.

    python3 link_probe.py receive --bind IP --streams N --timeout S
        prints `listening PORT`, accepts N connections, reads each to its end, answers each with
        the byte count it read (8 bytes, big-endian), and exits.
    python3 link_probe.py send --to IP:PORT --streams N --seconds S
        sends zeros on N parallel connections for S seconds, then waits for every count and
        prints `link {"gbps": ..., "bytes": ..., "seconds": ..., "streams": N}`.
    python3 link_probe.py floor --gbps G --min-gbps F
        prints `below` when the measured G Gbit/s is under the floor F (fabric.minLinkGbps),
        else `met` (fabric-link.sh decides with it).

Why this and not iperf3 or ssh: iperf3 is not on a stock DGX OS and cannot be brought offline;
one ssh stream measures its cipher, which on a Spark is far below the link's 200 Gbit/s, so it
could not tell a healthy link from a degraded one. Plain sockets in threads (the GIL is
released in send and recv) measure the kernel's TCP path, which is what NCCL's socket
bootstrap, Gloo and the image and weights copies use. The figure is the bytes the receiver
counted over the time until the last count came back: no byte is counted that did not arrive.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

from hostlib import require, run_step

CHUNK = 1 << 20  # 1 MiB per send: the syscall cost is negligible against the copy


def receive(bind: str, streams: int, timeout: float) -> int:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((bind, 0))
    listener.listen(streams)
    listener.settimeout(timeout)
    print(f"listening {listener.getsockname()[1]}", flush=True)
    workers = []
    try:
        for _ in range(streams):
            conn, _ = listener.accept()
            worker = threading.Thread(target=_drain, args=(conn, timeout), daemon=True)
            worker.start()
            workers.append(worker)
    except TimeoutError:
        print(f"problem: only {len(workers)} of {streams} connections arrived", file=sys.stderr)
        return 2
    for worker in workers:
        worker.join(timeout)
    return 0


def _drain(conn: socket.socket, timeout: float) -> None:
    conn.settimeout(timeout)
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    total = 0
    with conn:
        while True:
            n = conn.recv_into(view)
            if n == 0:
                break
            total += n
        conn.sendall(total.to_bytes(8, "big"))


def send(target: str, streams: int, seconds: float) -> int:
    host, _, port = target.rpartition(":")
    payload = bytes(CHUNK)
    counted = [0] * streams
    failures: list[str] = []
    started = time.monotonic()
    deadline = started + seconds

    def stream(index: int) -> None:
        try:
            with socket.create_connection((host, int(port)), timeout=10) as conn:
                conn.settimeout(seconds + 20)
                while time.monotonic() < deadline:
                    conn.sendall(payload)
                conn.shutdown(socket.SHUT_WR)
                answer = b""
                while len(answer) < 8:
                    part = conn.recv(8 - len(answer))
                    if not part:
                        raise ConnectionError("the receiver closed without its count")
                    answer += part
                counted[index] = int.from_bytes(answer, "big")
        except OSError as error:
            failures.append(f"stream {index}: {error}")

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 40)
    elapsed = time.monotonic() - started
    if failures:
        print("problem: " + "; ".join(failures), file=sys.stderr)
        return 2
    total = sum(counted)
    result = {
        "gbps": round(total * 8 / elapsed / 1e9, 3),
        "bytes": total,
        "seconds": round(elapsed, 2),
        "streams": streams,
    }
    print("link " + json.dumps(result), flush=True)
    return 0


def below_floor(gbps: float, floor: float) -> bool:
    """Whether a measured link fails fabric.minLinkGbps; a link at the floor passes."""
    return gbps < floor


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    if mode not in ("receive", "send", "floor"):
        print(__doc__, file=sys.stderr)
        return 2

    def probe(flags: dict[str, str]) -> int:
        if mode == "floor":
            require(flags, "gbps", "min-gbps")
            below = below_floor(float(flags["gbps"]), float(flags["min_gbps"]))
            print("below" if below else "met")
            return 0
        streams = int(flags.get("streams", "4"))
        if mode == "receive":
            require(flags, "bind")
            return receive(flags["bind"], streams, float(flags.get("timeout", "30")))
        require(flags, "to")
        return send(flags["to"], streams, float(flags.get("seconds", "3")))

    return run_step("link-probe", argv[1:], probe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
