"""Round trips between two processes: ZeroMQ DEALER/ROUTER, a link (grid/link.py, on a Unix
socket), a link whose caller busy-polls for the reply (grid/busy_poll.py), one where
the server busy-polls for the next request too (as a member does), and that last one over TCP
(``link_transport = "tcp"``).

    python tools/bench_transport.py --round-trips 20000 --size 100

The variants run in one go, alternately, each against an echo server in a fresh process
that polls like a member (zmq.Poller), and print the round trip's p50, and the CPU time per
round trip of the caller and of the server (user + system, every thread: ZeroMQ's I/O thread
included). The ratios are each variant's over the plain link's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import zmq

from grid.config import GridConfig
from grid.link import POLLIN, Link, address_of, listen

STOP = b"stop"
DEFAULTS = GridConfig()  # the spins of a client and a member: client_busy_poll_us, ...
BUSY_POLL_S = DEFAULTS.client_busy_poll_us / 1e6
MEMBER_BUSY_POLL_S = DEFAULTS.member_busy_poll_us / 1e6


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def zmq_server(ready: multiprocessing.Queue, done: multiprocessing.Queue) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ready.put(f"tcp://127.0.0.1:{port}")
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    start = cpu_seconds()
    while True:
        poller.poll(1000)
        frames = router.recv_multipart()
        router.send_multipart(frames)
        if frames[1] == STOP:
            break
    done.put(cpu_seconds() - start)


def link_server(ready: multiprocessing.Queue, done: multiprocessing.Queue,
                busy_poll_s: float = 0.0, transport: str = "unix") -> None:
    """Echo on a link; with ``busy_poll_s``, poll on without sleeping for that long after
    each message, as a member does (workers/member.py)."""
    listener = listen("127.0.0.1", transport)
    ready.put(address_of(listener))
    listener.setblocking(True)
    sock, _ = listener.accept()
    link = Link(sock, 1 << 30)
    poller = zmq.Poller()
    poller.register(link.fd, zmq.POLLIN)
    start = cpu_seconds()
    while True:
        spin_until = time.perf_counter() + busy_poll_s
        while time.perf_counter() < spin_until and not poller.poll(0):
            os.sched_yield()
        poller.poll(1000)
        messages = link.receive()
        for frames in messages:
            link.send(frames)
        if any(frames[0] == STOP for frames in messages):
            break
    done.put(cpu_seconds() - start)


def run(kind: str, round_trips: int, size: int) -> tuple[float, float, float]:
    """(p50 µs, caller CPU µs per round trip, server CPU µs per round trip)."""
    ready: multiprocessing.Queue = multiprocessing.Queue()
    done: multiprocessing.Queue = multiprocessing.Queue()
    server_spin = MEMBER_BUSY_POLL_S if kind.endswith("spin-both") else 0.0
    transport = "tcp" if kind.startswith("tcp") else "unix"
    server = multiprocessing.Process(
        target=zmq_server if kind == "zmq" else link_server,
        args=(ready, done) if kind == "zmq" else (ready, done, server_spin, transport))
    server.start()
    address = ready.get(timeout=10)
    payload = b"x" * size
    poller = zmq.Poller()
    if kind == "zmq":
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(address)
        poller.register(dealer, zmq.POLLIN)

        def round_trip(data: bytes) -> None:
            dealer.send(data)
            poller.poll(1000)
            dealer.recv()
    elif kind == "link":
        link = Link.connect(address, 1 << 30)
        poller.register(link.fd, zmq.POLLIN)

        def round_trip(data: bytes) -> None:
            link.send([data])
            while not link.receive():
                poller.poll(1000)
    else:  # as the client's Invoker.exchange waits, with a budget no reply here outlasts
        link = Link.connect(address, 1 << 30)
        polled = [(link.fd, POLLIN)]

        def round_trip(data: bytes) -> None:
            link.send([data])
            spin_until = time.perf_counter() + BUSY_POLL_S
            while time.perf_counter() < spin_until:
                if zmq.zmq_poll(polled, 0):
                    break
                os.sched_yield()
            while not link.receive():
                zmq.zmq_poll(polled, 1000)

    for _ in range(1000):
        round_trip(payload)
    latencies = []
    start = cpu_seconds()
    for _ in range(round_trips):
        began = time.perf_counter()
        round_trip(payload)
        latencies.append(time.perf_counter() - began)
    caller = cpu_seconds() - start
    round_trip(STOP)
    served = done.get(timeout=10)
    server.join()
    return (statistics.median(latencies) * 1e6, caller / round_trips * 1e6,
            served / (round_trips + 1001) * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float]]] = {
        "zmq": [], "link": [], "link-spin": [], "link-spin-both": [], "tcp-link-spin-both": []}
    for _ in range(args.rounds):
        for kind in results:
            results[kind].append(run(kind, args.round_trips, args.size))
    mean = {kind: [statistics.mean(r[i] for r in rows) for i in range(3)]
            for kind, rows in results.items()}
    print(f"{'transport':<24}{'p50 µs':>10}{'caller CPU µs':>16}{'server CPU µs':>16}")
    for kind, (p50, caller, server) in mean.items():
        print(f"{kind:<24}{p50:>10.1f}{caller:>16.1f}{server:>16.1f}")
    for kind in ("zmq", "link-spin", "link-spin-both", "tcp-link-spin-both"):
        ratios = [v / lk for v, lk in zip(mean[kind], mean["link"], strict=True)]
        print(f"{kind + '/link':<24}{ratios[0]:>9.2f}x{ratios[1]:>15.2f}x{ratios[2]:>15.2f}x")


if __name__ == "__main__":
    main()
