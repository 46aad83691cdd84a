"""A stray client: raw messages to a member or the supervisor from a fresh DEALER socket."""

from __future__ import annotations

import msgpack
import zmq


def send_raw(endpoint: str, messages: list[list[bytes]], wait_ms: int = 300) -> list[dict]:
    """Send each message (a list of frames); return the headers of whatever was answered."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    replies = []
    try:
        for frames in messages:
            sock.send_multipart(frames)
        while sock.poll(wait_ms):
            replies.append(msgpack.unpackb(sock.recv_multipart()[0]))
    finally:
        ctx.destroy(linger=0)
    return replies
