"""Links: the data path's requests and replies over a plain stream socket on the host.

ZeroMQ hands every message to an I/O thread on each end: two more thread wake-ups per message,
which on a small virtual machine cost more than the send itself. A non-blocking socket read and
written by the loop's own thread saves them (``tools/bench_transport.py`` measures a bare round
trip both ways). A put crosses two round trips (client to owner, owner to backup), so members
talk to each other, and clients to the members they know from the member list, over links.
ZeroMQ stays for everything else: the supervisor, seed addresses, and a member not reachable
by a link.

A link keeps what a DEALER and ROUTER pair gave: messages of frames, in order, never torn; a
broken connection loses what was in flight (as a ZeroMQ reconnect may), and the caller's
timeouts and resends cover that. Sends never block: what the socket does not take waits in
the link until the loop sees the socket writable.

A link is a Unix stream socket in Linux's abstract namespace where there is one (no file to
create or clean up: the name goes with the listening process), else a TCP connection on
``host``. A message costs a Unix socket a third of TCP's kernel time: 1.1 µs to send and 1.2
to receive 150 bytes here, against 3.4 and 3.3 over loopback TCP, which runs both ends' TCP
stack on every send (``tools/bench_transport.py`` has the round trips). The configuration's
``link_transport`` chooses; its address is ``unix:@NAME`` or ``HOST:PORT``.

On the wire a frame is a 5-byte header (little-endian length, then 1 if another frame of the
same message follows, else 0) and its bytes.
"""

from __future__ import annotations

import os
import secrets
import select
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Any

import zmq
from mypy_extensions import mypyc_attr

from grid.config import LINK_TRANSPORTS

FRAME = struct.Struct("<IB")
# ZeroMQ's poll flags as plain ints, as both loops' polls report them (the client's zmq_poll,
# the member's workers/poller.py): IntFlag arithmetic costs microseconds a message.
POLLIN, POLLOUT, POLLERR = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.POLLERR)
RECV_BYTES = 256 * 1024
# A frame at least this large that a read leaves incomplete is read into place: straight
# from the socket into the link's buffer, then copied out once. Gathered in pieces, each
# was copied into the frame's growing start (which grew by copies), and that out again:
# about 7% of a member's CPU in a Spark write, whose messages are about 400 KB.
IN_PLACE_BYTES = 64 * 1024
# The buffer is kept for the next large frame up to this size.
IN_PLACE_KEPT_BYTES = 8 * 1024 * 1024
# A link's socket takes this much unsent data (the kernel caps it at net.core.wmem_max, often
# 208 KiB): a bulk message (a Spark write's 400 KB put_all, an owner's part of it for its
# backup, a scan's chunk) then goes in one send, where 208 KiB took a send, a copy of the
# rest into ``out`` and a wait for the socket to drain, with the reader woken for each part.
SEND_BUFFER_BYTES = 4 * 1024 * 1024
# A message whose last frame is at least this large goes out gathered from its frames
# (``sendmsg``) instead of copied into one bytes object first: the Spark writer's put_all
# of 400 KB and an owner's part of it for its backup.
GATHER_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 1.0
UNIX_PREFIX = "unix:@"
# Linux has the abstract namespace; elsewhere a Unix socket is a file to clean up: TCP there.
ABSTRACT_UNIX = sys.platform.startswith("linux")


def encode(frames: Sequence[Any]) -> bytes:
    """One message, as it goes on the wire. Frames are bytes-like (typed Any, not bytes: the
    compiled module would refuse a view at run time where the source takes it)."""
    if len(frames) == 2:  # most requests and replies: a header, and a key or a value
        head, body = frames
        return b"".join((FRAME.pack(len(head), 1), head, FRAME.pack(len(body), 0), body))
    return b"".join(_parts(frames))


def _parts(frames: Sequence[Any]) -> list[Any]:
    """A message's frames, each after its header, as they go on the wire."""
    parts = []
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        parts.append(FRAME.pack(len(frame), i < last))
        parts.append(frame)
    return parts


def listen(host: str, transport: str = "unix") -> socket.socket:
    """A non-blocking listening socket: an abstract Unix socket with a fresh name (where
    ``transport`` is "unix" and the platform has them), else TCP on a free port of ``host``."""
    if transport not in LINK_TRANSPORTS:
        raise ValueError(f"a link transport is one of {LINK_TRANSPORTS}, not {transport!r}")
    if transport == "unix" and ABSTRACT_UNIX:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(f"\0shmgrid-{os.getpid()}-{secrets.token_hex(8)}")
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def address_of(sock: socket.socket) -> str:
    """The address ``Link.connect`` takes: ``unix:@NAME`` or ``HOST:PORT``."""
    if sock.family == socket.AF_UNIX:
        return UNIX_PREFIX + sock.getsockname()[1:].decode()  # (abstract: bytes, NUL first)
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


class LinkPoll:
    """poll(2) over links' descriptors, reporting events with ZeroMQ's flags as zmq_poll
    does, for the client's wait for replies. zmq_poll makes two system calls for a wait that
    finds nothing ready at once (one that does not wait, then the wait): strace counted 1.66
    polls a get with it and 1.00 with this, and zmq_poll takes 0.4 µs where this takes
    0.25 µs even when something is ready."""

    __slots__ = ("items", "_poll")

    def __init__(self, items: list[tuple[int, int]]) -> None:
        self.items = items  # (descriptor, ZeroMQ flags), as zmq_poll takes them
        self._poll = select.poll()
        for fd, flags in items:
            self._poll.register(fd, (select.POLLIN if flags & POLLIN else 0)
                                | (select.POLLOUT if flags & POLLOUT else 0))

    def poll(self, timeout_ms: int) -> list[tuple[int, int]]:
        """(descriptor, flags) of the ready ones, waiting up to ``timeout_ms`` for one."""
        events = self._poll.poll(timeout_ms)
        for i, (fd, mask) in enumerate(events):
            if mask != select.POLLIN:
                events[i] = (fd, zmq_flags(mask))
        return events


def zmq_flags(mask: int) -> int:
    """ZeroMQ's poll flags for a poll(2) event mask, or an epoll one (Linux gives epoll's
    events poll's bits): a hang-up or an error is read as one (receive sees it), and is an
    error; a descriptor closed meanwhile (POLLNVAL) is an error."""
    return (POLLIN if mask & _READ_EVENTS else 0) | (POLLOUT if mask & select.POLLOUT else 0) \
        | (POLLERR if mask & _ERROR_EVENTS else 0)


_READ_EVENTS = select.POLLIN | select.POLLHUP
_ERROR_EVENTS = select.POLLERR | select.POLLHUP | select.POLLNVAL


@mypyc_attr(native_class=False)  # compiled (grid/compiled.py), it can still be an OSError
class LinkError(OSError):
    """The link is broken (the peer closed it, or sent what is not a message)."""


class Link:
    """One connection: a non-blocking socket, the bytes it has yet to send, and the bytes
    that came in but are not a whole message yet."""

    __slots__ = ("sock", "fd", "out", "inbound", "needed", "partial", "max_frame_bytes",
                 "closed", "body", "body_size", "body_filled", "body_more")

    def __init__(self, sock: socket.socket, max_frame_bytes: int) -> None:
        sock.setblocking(False)
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self.sock = sock
        self.fd = sock.fileno()
        self.out = bytearray()
        self.inbound = bytearray()  # the start of a frame that is not whole yet
        self.needed = 0  # the bytes inbound must hold for that frame to be whole
        self.partial: list[bytes] = []  # frames of a message whose last frame is to come
        self.max_frame_bytes = max_frame_bytes
        self.closed = False
        # A large frame read into place: its buffer, size, bytes come, and header flag.
        self.body = bytearray()
        self.body_size = 0
        self.body_filled = 0
        self.body_more = 0

    @classmethod
    def connect(cls, address: str, max_frame_bytes: int) -> Link:
        """Connect to ``unix:@NAME`` or ``HOST:PORT``; OSError when nobody listens there."""
        if not address.startswith(UNIX_PREFIX):
            host, _, port = address.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
            return cls(sock, max_frame_bytes)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect("\0" + address[len(UNIX_PREFIX):])
        except BaseException:
            sock.close()
            raise
        return cls(sock, max_frame_bytes)

    @property
    def wants_write(self) -> bool:
        return bool(self.out)

    def send(self, frames: Sequence[Any]) -> bool:
        """Queue one message and send what the socket takes now. False if the link is
        broken: the message is lost, as is anything still queued."""
        if self.closed:
            return False
        if not self.out and frames and len(frames[-1]) >= GATHER_BYTES:
            return self._send_gathered(frames)
        data = encode(frames)
        if self.out:
            self.out += data
            return True
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.close()
            return False
        if sent < len(data):
            self.out += memoryview(data)[sent:]
        return True

    def _send_gathered(self, frames: Sequence[Any]) -> bool:
        """``send`` of a message with a large last frame: its frames and headers go to
        the socket as they are (``sendmsg``), not copied into one message first; only what
        the socket does not take is copied, into ``out``."""
        parts = _parts(frames)
        try:
            sent = self.sock.sendmsg(parts)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.close()
            return False
        for part in parts:
            size = len(part)
            if sent >= size:
                sent -= size
                continue
            with memoryview(part) as view:
                self.out += view[sent:]
            sent = 0
        return True

    def flush(self) -> bool:
        """Send what waits, as far as the socket takes it; False if the link broke."""
        if self.closed:
            return False
        while self.out:
            try:
                sent = self.sock.send(self.out)
            except BlockingIOError:
                return True
            except OSError:
                self.close()
                return False
            del self.out[:sent]
        return True

    def receive(self) -> list[list[bytes]]:
        """Every whole message that has come in. Raises LinkError once the peer closed the
        link (after the messages before the close were taken) or broke the framing."""
        messages: list[list[bytes]] = []
        eof = False
        while True:
            if self.body_size:
                eof = self._fill_body(messages)
                if eof or self.body_size:
                    break
            try:
                chunk = self.sock.recv(RECV_BYTES)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            messages += self._parse(chunk)
            if len(chunk) < RECV_BYTES:
                break
        if eof and not messages:
            self.close()
            raise LinkError("the peer closed the link")
        return messages

    def _parse(self, data: bytes) -> list[list[bytes]]:
        """The whole messages in what came before (``inbound``) and ``data``. Mostly a read
        holds whole messages and nothing came before: frames are sliced straight out of it.
        A frame that comes in many reads gathers in ``inbound`` until it is whole
        (``needed`` bytes), and is copied out once; a large one is read into place
        (``_fill_body``)."""
        if self.inbound:
            self.inbound += data
            if len(self.inbound) < self.needed:
                return []
            data = bytes(self.inbound)
            self.inbound = bytearray()
        end, at = len(data), 0
        messages = []
        frames = self.partial
        unpack, header, limit = FRAME.unpack_from, FRAME.size, self.max_frame_bytes
        while end - at >= header:
            size, more = unpack(data, at)
            if size > limit or more > 1:
                self.close()
                raise LinkError(f"a frame of {size} bytes (flag {more}) on a link")
            start = at + header
            if end - start < size:
                if size >= IN_PLACE_BYTES:
                    self._begin_body(data, start, size, more)
                    at = end
                break
            at = start + size
            frames.append(data[start:at])
            if not more:
                messages.append(frames)
                frames = []
        self.partial = frames
        if at < end:
            self.inbound = bytearray(data[at:])
            self.needed = header + (unpack(data, at)[0] if end - at >= header else 0)
        return messages

    def _begin_body(self, data: bytes, start: int, size: int, more: int) -> None:
        """Start reading a large frame into place with the part of it ``data`` holds."""
        if len(self.body) < size:
            self.body = bytearray(size)
        filled = len(data) - start
        with memoryview(self.body) as view:
            view[0:filled] = memoryview(data)[start:]
        self.body_size, self.body_filled, self.body_more = size, filled, more

    def _fill_body(self, messages: list[list[bytes]]) -> bool:
        """Read the rest of a large frame into place (no further: what follows it is read
        as usual); once it is whole, it joins its message, which joins ``messages`` if it
        was the last frame. True when the peer closed the link."""
        size = self.body_size
        with memoryview(self.body) as view:
            while self.body_filled < size:
                try:
                    got = self.sock.recv_into(view[self.body_filled:size])
                except BlockingIOError:
                    return False
                except OSError:
                    return True
                if not got:
                    return True
                self.body_filled += got
            self.partial.append(bytes(view[0:size]))
        if not self.body_more:
            messages.append(self.partial)
            self.partial = []
        self.body_size = self.body_filled = 0
        if len(self.body) > IN_PLACE_KEPT_BYTES:
            self.body = bytearray()
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()
