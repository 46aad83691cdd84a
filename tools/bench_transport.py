"""The floor under every shmgrid call: a bare ZeroMQ DEALER -> ROUTER round trip between two
processes, with no shmgrid code, over TCP loopback and over a Unix socket (ipc://).

    python tools/bench_transport.py --calls 20000

A get through the owner costs this plus the client's and the member's Python; a put with one
synchronous backup costs about two of these.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import tempfile
import time

import zmq


def serve(endpoint: str, frames: int) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    while True:
        message = sock.recv_multipart()
        if message[1] == b"stop":
            break
        sock.send_multipart([message[0], *message[1:1 + frames]])
    ctx.destroy(linger=0)


def round_trips(endpoint: str, frames: int, calls: int) -> float:
    """Round trips per second of ``frames``-part messages (a 30-byte header, a 10-byte key)."""
    server = multiprocessing.get_context("spawn").Process(target=serve,
                                                          args=(endpoint, frames))
    server.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    message = [b"h" * 30, b"k" * 10][:frames]
    for _ in range(1000):  # connect and warm up
        sock.send_multipart(message)
        sock.recv_multipart()
    started = time.perf_counter()
    for _ in range(calls):
        sock.send_multipart(message)
        sock.recv_multipart()
    elapsed = time.perf_counter() - started
    sock.send_multipart([b"stop"])
    server.join()
    ctx.destroy(linger=0)
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-transport-")
    for name, endpoint in (("tcp 127.0.0.1", "tcp://127.0.0.1:5799"),
                           ("ipc", f"ipc://{os.path.join(folder, 'socket')}")):
        for frames in (1, 2):
            rate = round_trips(endpoint, frames, args.calls)
            print(f"{name:14} {frames} frame{'s' if frames > 1 else ' '}: {rate:8,.0f} round "
                  f"trips/s, {1e6 / rate:4.0f} µs each")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
