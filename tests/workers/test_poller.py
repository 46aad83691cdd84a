"""The member loop's epoll poller (workers/poller.py): what zmq.Poller reported, it reports.

A ZeroMQ socket's descriptor (ZMQ_FD) is edge-triggered: it fires once for what arrived, and
reading the socket's events resets it. A loop that reads one of two queued messages, or sends
on the socket, must say so (``used``), or the poller sleeps with a message waiting.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import pytest
import zmq

from grid.link import POLLERR, POLLIN, POLLOUT
from workers.poller import EpollPoller, make_poller

pytestmark = pytest.mark.skipif(not hasattr(select, "epoll"), reason="needs Linux's epoll")


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A ROUTER (the member's side) and a DEALER connected to it over inproc."""
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.bind("inproc://poller-test")
    dealer.connect("inproc://poller-test")
    try:
        yield router, dealer
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()


def ready_sockets(poller: EpollPoller, timeout_ms: int) -> list[object]:
    return [target for target, events in poller.poll(timeout_ms) if events & POLLIN]


def wait_until_queued(sock: zmq.Socket, deadline_s: float = 2.0) -> None:
    end = time.monotonic() + deadline_s
    while not sock.getsockopt(zmq.EVENTS) & POLLIN:
        assert time.monotonic() < end, "the message never arrived"
        time.sleep(0.001)


def two_queued(router: zmq.Socket, dealer: zmq.Socket) -> EpollPoller:
    """A poller that reported ``router`` with two messages queued in it (both there before
    the poller asked, so that no later arrival fires the descriptor again)."""
    dealer.send(b"1")
    dealer.send(b"2")
    wait_until_queued(router)
    time.sleep(0.05)
    poller = EpollPoller()
    poller.register(router, zmq.POLLIN)
    assert ready_sockets(poller, 0) == [router]
    return poller


def test_a_message_wakes_the_poll(pair):
    router, dealer = pair
    poller = EpollPoller()
    poller.register(router, zmq.POLLIN)
    assert ready_sockets(poller, 0) == []  # nothing came: registering asks once
    dealer.send(b"x")
    assert ready_sockets(poller, 2000) == [router]
    router.recv_multipart()
    assert ready_sockets(poller, 0) == []
    poller.close()


def test_what_came_before_registering_is_reported(pair):
    router, dealer = pair
    dealer.send(b"early")
    wait_until_queued(router)  # its descriptor's edge went by before the poller saw it
    poller = EpollPoller()
    poller.register(router, zmq.POLLIN)
    assert ready_sockets(poller, 0) == [router]
    poller.close()


def test_a_socket_drained_in_part_is_reported_again_once_used(pair):
    router, dealer = pair
    poller = two_queued(router, dealer)
    router.recv_multipart()  # one of two taken, as a loop with a budget does
    poller.used(router)
    assert ready_sockets(poller, 0) == [router]
    router.recv_multipart()
    poller.used(router)
    assert ready_sockets(poller, 0) == []  # asked, nothing left: not reported twice
    poller.close()


def test_without_used_the_edge_is_gone(pair):
    """Why ``used`` exists: the same partial drain without it sleeps with a message queued."""
    router, dealer = pair
    poller = two_queued(router, dealer)
    router.recv_multipart()
    assert router.getsockopt(zmq.EVENTS) & POLLIN  # the second waits...
    assert ready_sockets(poller, 100) == []  # ...and the descriptor does not say so
    poller.close()


@pytest.mark.parametrize("used", [True, False])
def test_a_send_is_a_use(pair, used):
    """A send takes in the news of arrived messages, the descriptor's edge with it: a reply
    that came before the loop sent again is reported only when the send was said."""
    router, dealer = pair
    poller = EpollPoller()
    poller.register(dealer, zmq.POLLIN)
    assert ready_sockets(poller, 0) == []
    dealer.send(b"hello")
    identity, _ = router.recv_multipart()
    router.send_multipart([identity, b"reply"])
    time.sleep(0.05)  # the reply is in, its descriptor readable
    dealer.send(b"more")
    if used:
        poller.used(dealer)
        assert ready_sockets(poller, 2000) == [dealer]
        assert dealer.recv() == b"reply"
    else:  # the edge went with the send: the reply waits unseen
        assert ready_sockets(poller, 100) == []
        assert dealer.getsockopt(zmq.EVENTS) & POLLIN
    poller.close()


def test_descriptors_in_and_out_and_a_hang_up():
    a, b = socket.socketpair()
    poller = EpollPoller()
    poller.register(a.fileno(), POLLIN)
    assert poller.poll(0) == []
    b.send(b"x")
    assert poller.poll(1000) == [(a.fileno(), POLLIN)]
    poller.modify(a.fileno(), POLLIN | POLLOUT)
    assert poller.poll(0) == [(a.fileno(), POLLIN | POLLOUT)]
    a.recv(10)
    assert poller.poll(0) == [(a.fileno(), POLLOUT)]
    poller.modify(a.fileno(), POLLIN)
    b.close()
    [(fd, events)] = poller.poll(1000)
    assert fd == a.fileno() and events & POLLIN and events & POLLERR  # the loop reads the EOF
    fd = a.fileno()
    a.close()  # a link closes itself when it breaks; the epoll lost it with the close
    poller.unregister(fd)
    assert poller.poll(0) == []
    poller.close()


def test_unregister_and_closed_sockets(pair):
    router, dealer = pair
    poller = EpollPoller()
    poller.register(router, zmq.POLLIN)
    poller.register(dealer, zmq.POLLIN)
    poller.unregister(router)
    poller.unregister(router)  # twice: nothing to do
    dealer.send(b"x")
    assert ready_sockets(poller, 200) == []  # the router is not asked any more
    poller.used(dealer)
    dealer.close(linger=0)  # a socket closed while it is to be asked is skipped
    assert ready_sockets(poller, 0) == []
    poller.close()


def test_make_poller_is_epoll_on_linux():
    poller = make_poller()
    assert isinstance(poller, EpollPoller)
    poller.close()
