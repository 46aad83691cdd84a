"""Links (grid/link.py): messages of frames over a Unix or TCP connection, whole and in order,
whatever the sizes and however the bytes arrive; a broken or lying peer ends the link."""

from __future__ import annotations

import random
import select
import socket
import threading
import time
from pathlib import Path

import pytest
import zmq

from grid.client.invocation import Invoker
from grid.config import LINK_TRANSPORTS
from grid.link import (
    FRAME,
    GATHER_BYTES,
    IN_PLACE_BYTES,
    IN_PLACE_KEPT_BYTES,
    POLLERR,
    POLLIN,
    POLLOUT,
    SEND_BUFFER_BYTES,
    Link,
    LinkError,
    LinkPoll,
    address_of,
    encode,
    listen,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=LINK_TRANSPORTS)
def transport(request) -> str:
    return request.param


@pytest.fixture
def pair(transport):
    """make(max_frame_bytes) -> (a link we opened, the link the other end accepted)."""
    opened: list[Link] = []

    def make(max_frame_bytes: int = 1 << 30) -> tuple[Link, Link]:
        listener = listen("127.0.0.1", transport)
        try:
            ours = Link.connect(address_of(listener), max_frame_bytes)
            listener.setblocking(True)
            sock, _ = listener.accept()
        finally:
            listener.close()
        theirs = Link(sock, max_frame_bytes)
        opened.extend((ours, theirs))
        return ours, theirs

    yield make
    for link in opened:
        link.close()


@pytest.fixture
def raw_writer(transport):
    """make(max_frame_bytes) -> (a plain socket that writes raw bytes, the Link reading
    them)."""
    opened: list[socket.socket | Link] = []

    def make(max_frame_bytes: int) -> tuple[socket.socket, Link]:
        listener = listen("127.0.0.1", transport)
        try:
            writer = socket.socket(listener.family, socket.SOCK_STREAM)
            opened.append(writer)
            writer.connect(listener.getsockname())
            listener.setblocking(True)
            sock, _ = listener.accept()
        finally:
            listener.close()
        reader = Link(sock, max_frame_bytes)
        opened.append(reader)
        return writer, reader

    yield make
    for end in opened:
        end.close()


def assert_link_ends(link: Link) -> None:
    """The peer has closed: receive() raises LinkError within 5 s, and the link is closed."""
    with pytest.raises(LinkError):
        for _ in range(100):
            select.select([link.sock], [], [], 0.05)
            link.receive()
    assert link.closed


def take(receiver: Link, count: int, sender: Link | None = None) -> list[list[bytes]]:
    """Messages until ``count`` came, sending what waits in ``sender`` meanwhile."""
    messages: list[list[bytes]] = []
    deadline = time.monotonic() + 20
    while len(messages) < count:
        assert time.monotonic() < deadline, f"only {len(messages)} of {count} messages came"
        if sender is not None:
            assert sender.flush()
        select.select([receiver.sock], [], [], 0.01)
        messages += receiver.receive()
    assert {type(frame) for message in messages for frame in message} <= {bytes}
    return messages


def test_messages_of_any_shape_come_whole_and_in_order(pair):
    ours, theirs = pair()
    rng = random.Random(1)
    sent = [[rng.randbytes(rng.choice((0, 1, 5, 300))) for _ in range(rng.randint(1, 5))]
            for _ in range(500)]
    for message in sent:
        assert ours.send(message)
    assert take(theirs, len(sent), ours) == sent


def test_the_address_names_the_transport(transport):
    listener = listen("127.0.0.1", transport)
    try:
        address = address_of(listener)
        if transport == "unix":
            assert listener.family == socket.AF_UNIX and address.startswith("unix:@shmgrid-")
        else:
            assert listener.family == socket.AF_INET and address.startswith("127.0.0.1:")
        other = listen("127.0.0.1", transport)
        assert address_of(other) != address, "a fresh name each"
        other.close()
    finally:
        listener.close()
    with pytest.raises(ValueError, match="udp"):
        listen("127.0.0.1", "udp")


def test_bytes_that_come_one_at_a_time_make_the_same_messages(raw_writer):
    """A peer that writes a byte at a time: every split of headers and frames is seen."""
    writer, reader = raw_writer(1 << 20)
    sent = [[b"header", b"key", b"value" * 20], [b""], [b"x" * 3000, b"y"]]
    data = b"".join(encode(message) for message in sent)
    got: list[list[bytes]] = []
    for i in range(len(data)):
        writer.sendall(data[i:i + 1])
        select.select([reader.sock], [], [], 0.01)
        got += reader.receive()
    assert got == sent and {type(frame) for message in got for frame in message} == {bytes}


def test_a_message_larger_than_the_socket_takes_waits_in_the_link(pair):
    ours, theirs = pair()
    big = [b"h", random.Random(2).randbytes(16 * 1024 * 1024)]
    assert ours.send(big)
    assert ours.wants_write, "16 MiB do not fit the socket's buffer at once"
    assert ours.send([b"after"])  # queued behind it, never ahead
    assert take(theirs, 2, ours) == [big, [b"after"]]
    assert not ours.wants_write


def test_a_closed_peer_ends_the_link_after_what_it_sent(pair):
    ours, theirs = pair()
    assert ours.send([b"last", b"words"])
    ours.close()
    assert not ours.send([b"more"]), "a closed link sends nothing"
    assert take(theirs, 1) == [[b"last", b"words"]]
    assert_link_ends(theirs)


def test_a_link_poll_reports_what_zmq_poll_reports(pair):
    """LinkPoll stands in for zmq_poll in the client's wait: the same events, in ZeroMQ's
    flags, for readable, writable, quiet and hung-up links."""
    quiet, _ = pair()
    readable, sender = pair()
    writer, _ = pair()
    hung_up, peer = pair()
    assert sender.send([b"hello"])
    peer.close()
    items = [(quiet.fd, POLLIN), (readable.fd, POLLIN), (writer.fd, POLLIN | POLLOUT),
             (hung_up.fd, POLLIN)]
    deadline = time.monotonic() + 10
    while True:  # until the hello and the hang-up have come
        ours = dict(LinkPoll(items).poll(100))
        if readable.fd in ours and hung_up.fd in ours or time.monotonic() > deadline:
            break
    theirs = dict(zmq.zmq_poll(items, 0))
    assert ours == theirs
    assert quiet.fd not in ours
    assert ours[readable.fd] == POLLIN
    assert ours[writer.fd] == POLLOUT
    assert ours[hung_up.fd] & POLLIN, "a hang-up is read: receive() then ends the link"
    with pytest.raises(LinkError):
        hung_up.receive()
    assert LinkPoll([(quiet.fd, POLLIN)]).poll(0) == []


def test_a_link_poll_reports_a_closed_descriptor_as_an_error(pair):
    ours, _ = pair()
    poll = LinkPoll([(ours.fd, POLLIN)])
    ours.close()  # (the client drops its poll when a link closes; this is the stale case)
    assert poll.poll(0) == [(ours.fd, POLLERR)]


def test_a_frame_beyond_the_limit_ends_the_link(pair):
    ours, theirs = pair(max_frame_bytes=1000)
    ours.send([b"x" * 1001])
    with pytest.raises(LinkError, match="1001 bytes"):
        take(theirs, 1, ours)
    assert theirs.closed


def test_a_header_with_a_bad_flag_ends_the_link(pair):
    ours, theirs = pair()
    ours.sock.sendall(FRAME.pack(1, 7) + b"x")
    with pytest.raises(LinkError, match="flag 7"):
        take(theirs, 1)


@pytest.mark.parametrize("messages", [
    [[b"head", b"value"]],  # one message of two frames: the common read
    [[b"head"], [b"key"]],  # two messages of one frame each
    [[b"head", b"key"], [b"next", b"one"]],
    [[b"head", b"key", b"value"]],
    [[b"", b""]],
    [[b"head"]],  # one message of one frame: an acknowledgement
    [[b""]],
])
def test_whatever_one_read_holds_comes_out_as_the_messages_sent(pair, messages):
    """One read's worth of bytes, parsed at once: whole messages of any shape, one or many."""
    ours, theirs = pair()
    ours.sock.sendall(b"".join(encode(message) for message in messages))
    assert take(theirs, len(messages)) == messages


def test_a_second_frame_beyond_the_limit_or_with_a_bad_flag_ends_the_link(pair):
    ours, theirs = pair(max_frame_bytes=1000)
    ours.sock.sendall(encode([b"head", b"x" * 1001]))
    with pytest.raises(LinkError, match="1001 bytes"):
        take(theirs, 1)
    ours, theirs = pair()
    ours.sock.sendall(FRAME.pack(4, 1) + b"head" + FRAME.pack(1, 7) + b"x")
    with pytest.raises(LinkError, match="flag 7"):
        take(theirs, 1)


def test_nobody_listening_is_an_error_at_connect(transport):
    listener = listen("127.0.0.1", transport)
    address = address_of(listener)
    listener.close()
    with pytest.raises(OSError):
        Link.connect(address, 1 << 20)


def test_a_client_gives_up_at_once_on_a_request_whose_link_broke(transport):
    """The member died with the request on its link: the client learns it from the closed
    connection and retries elsewhere, instead of waiting out the attempt."""
    listener = listen("127.0.0.1", transport)
    listener.setblocking(True)

    def die_after_the_request() -> None:
        sock, _ = listener.accept()
        sock.recv(1024)
        sock.close()

    dying = threading.Thread(target=die_after_the_request)
    dying.start()
    invoker = Invoker([], "c", invocation_timeout=30.0, attempt_timeout=30.0)
    try:
        invoker.link_addresses["tcp://127.0.0.1:1"] = address_of(listener)
        began = time.monotonic()
        assert invoker.exchange([("tcp://127.0.0.1:1", "ping", {}, [])], 30.0) == [None]
        assert time.monotonic() - began < 5.0
    finally:
        dying.join()
        listener.close()
        invoker.close()


def test_an_endpoint_zeromq_refuses_leaves_no_socket_to_wait_for():
    """A DEALER whose connect failed was once left open: closing the client then waited for
    it forever."""
    invoker = Invoker([], "c", invocation_timeout=1.0, attempt_timeout=1.0)
    with pytest.raises(zmq.ZMQError) as refused:
        invoker._socket("not an endpoint")
    assert refused.traceback  # (holds the frames: nothing is collected behind our back)
    closing = threading.Thread(target=invoker.close, daemon=True)
    closing.start()
    closing.join(5)
    assert not closing.is_alive(), "closing the client hangs"


def test_frames_may_be_any_bytes_like_object(pair):
    """A frame may be bytes, a bytearray or a view (a value straight from a buffer), in the
    compiled link as in its source (grid/compiled.py); what comes out is bytes."""
    ours, theirs = pair()
    sent = [[b"head", bytearray(b"array")], [b"head", memoryview(b"a view"), bytearray(b"")],
            [memoryview(b"alone")]]
    for message in sent:
        assert ours.send(message)
    assert take(theirs, len(sent), ours) == [[bytes(frame) for frame in message]
                                              for message in sent]


def test_large_frames_in_pieces_of_any_size_come_whole_and_in_order(raw_writer):
    """Frames from IN_PLACE_BYTES up are read into place when a read leaves them incomplete:
    written in pieces of random sizes (a header split, a frame's last byte alone, pieces
    spanning a frame's end and the next header), messages of large and small frames in any
    order come out as sent, bytes, and the link reads the next ones as usual."""
    writer, reader = raw_writer(1 << 24)
    rng = random.Random(3)
    sizes = (0, 7, IN_PLACE_BYTES - 1, IN_PLACE_BYTES, 300_000, IN_PLACE_KEPT_BYTES + 5)
    sent = [[rng.randbytes(rng.choice(sizes)) for _ in range(rng.randint(1, 3))]
            for _ in range(24)]
    data = b"".join(encode(message) for message in sent)
    cuts = [0]
    while cuts[-1] < len(data):
        cuts.append(cuts[-1] + rng.choice((1, 4, 5, 6, 1000, 70_000, 300_000)))

    def write() -> None:  # (a thread: a piece may be more than the socket buffers)
        for start, stop in zip(cuts[:-1], cuts[1:], strict=True):
            writer.sendall(data[start:stop])
            time.sleep(0.0002)  # most reads then end where a piece does

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    got = take(reader, len(sent))
    thread.join(10)
    assert got == sent
    assert reader.body_size == 0 and len(reader.body) <= IN_PLACE_KEPT_BYTES


def test_a_peer_that_closes_within_a_large_frame_ends_the_link_after_what_it_sent(pair):
    ours, theirs = pair()
    whole = encode([b"first", b"message"])
    cut = encode([b"head", b"x" * (2 * IN_PLACE_BYTES)])[:IN_PLACE_BYTES]
    ours.sock.sendall(whole + cut)
    assert take(theirs, 1) == [[b"first", b"message"]]
    assert theirs.body_size == 2 * IN_PLACE_BYTES, "the cut frame is being read into place"
    ours.close()
    assert_link_ends(theirs)


def test_a_link_takes_a_bulk_message_in_one_send_where_the_kernel_allows(pair):
    """Both ends ask for SEND_BUFFER_BYTES of send buffer (the kernel caps it at
    net.core.wmem_max, and reports twice what it grants): a 400 KB put_all then goes whole."""
    cap = int(Path("/proc/sys/net/core/wmem_max").read_text())
    for link in pair():
        granted = link.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert granted >= 2 * min(SEND_BUFFER_BYTES, cap)


def test_messages_with_large_frames_go_out_gathered_and_whole_however_much_the_socket_takes(
        pair):
    """A message whose last frame is GATHER_BYTES or more goes to the socket as its frames
    (sendmsg); what the socket does not take waits in the link, cut anywhere (in a header,
    in a frame), and later messages wait behind it. Frames may be bytes, bytearrays or views."""
    ours, theirs = pair()
    rng = random.Random(4)
    kinds = (bytes, bytearray, memoryview)
    sent = []
    for _ in range(40):
        frames = [rng.randbytes(rng.choice((0, 3, 5000))) for _ in range(rng.randint(0, 2))]
        frames.append(rng.randbytes(rng.choice((GATHER_BYTES - 1, GATHER_BYTES, 700_000))))
        message = [rng.choice(kinds)(frame) for frame in frames]
        assert ours.send(message)
        sent.append([bytes(frame) for frame in message])
    assert ours.wants_write, "some 11 MB do not fit the socket's buffer at once"
    got: list[list[bytes]] = []
    while select.select([theirs.sock], [], [], 0.05)[0]:  # room in the socket, not flushed
        got += theirs.receive()
    last = [b"behind", rng.randbytes(GATHER_BYTES)]
    assert ours.send(last)  # while older bytes wait in the link: it must not go ahead
    sent.append(last)
    assert got + take(theirs, len(sent) - len(got), ours) == sent
    assert not ours.wants_write
