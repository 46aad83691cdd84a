"""The member loop's poller: ``zmq.Poller``'s calls over Linux's epoll.

``zmq.Poller.poll`` asks every ZeroMQ socket it holds for its events on every call
(``ZMQ_EVENTS``, about 2.4 µs a socket here) before it polls the descriptors: 7 µs a call for
a member's three ZeroMQ sockets and its links, while an epoll of the same descriptors takes
0.8 µs. A member polls at least once a round of messages, and a spinning one (grid/busy_poll.py)
once a turn of its spin. The data path runs on links (plain sockets); the ZeroMQ sockets carry
the rest (the supervisor, seeds, clients without a link) and are seldom busy.

So this poller waits on one epoll of every descriptor, a ZeroMQ socket's through the
descriptor it signals on (``ZMQ_FD``), and asks a ZeroMQ socket for its events only when that
descriptor fires or when the socket was used since it last asked. ZeroMQ's descriptor says
only that something may have changed, and a send on the socket may take in the news of
arrived messages without leaving the descriptor readable, so a socket sent on, or drained only
in part, must be looked at again before the loop sleeps: ``used`` says so. Elsewhere (not
Linux) it is ``zmq.Poller`` itself.
"""

from __future__ import annotations

import contextlib
import select
from typing import Any, cast

import zmq

from grid.link import POLLIN, POLLOUT, zmq_flags

_EVENTS = zmq.EVENTS
_EPOLLIN = getattr(select, "EPOLLIN", 0)  # (no epoll: zmq.Poller is used)

__all__ = ["EpollPoller", "make_poller"]


class EpollPoller:
    """``register``/``modify``/``unregister``/``poll`` as ``zmq.Poller`` has them, for
    ZeroMQ sockets and descriptors (ints); ``poll`` returns (socket or descriptor, events)
    with ZeroMQ's event bits. Call ``used(socket)`` after sending on a ZeroMQ socket or
    leaving messages in it."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._sockets: dict[int, zmq.Socket] = {}  # ZMQ_FD -> its socket
        self._unread: set[zmq.Socket] = set()  # sockets to ask before the next sleep

    def register(self, target: zmq.Socket | int, flags: int = POLLIN) -> None:
        if isinstance(target, zmq.Socket):
            fd = cast(int, target.getsockopt(zmq.FD))
            self._sockets[fd] = target
            self._epoll.register(fd, select.EPOLLIN)
            self._unread.add(target)  # whatever came before it was registered
            return
        self._epoll.register(target, _epoll_flags(flags))

    def modify(self, target: int, flags: int) -> None:
        self._epoll.modify(target, _epoll_flags(flags))

    def unregister(self, target: zmq.Socket | int) -> None:
        if isinstance(target, zmq.Socket):
            fd = next((fd for fd, sock in self._sockets.items() if sock is target), None)
            if fd is None:
                return
            del self._sockets[fd]
            self._unread.discard(target)
            target = fd
        # A descriptor closed already (a link closes itself when it breaks) left the epoll
        # with its close: EBADF or ENOENT then.
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(target)

    def used(self, sock: zmq.Socket) -> None:
        """``sock`` was sent on, or drained in part: ask it for its events before sleeping."""
        self._unread.add(sock)

    def poll(self, timeout_ms: int | None = None) -> list[tuple[Any, int]]:
        ready: list[tuple[Any, int]] = []
        if self._unread:
            unread, self._unread = self._unread, set()
            for sock in unread:
                if not sock.closed and cast(int, sock.getsockopt(_EVENTS)) & POLLIN:
                    ready.append((sock, POLLIN))
            if ready:
                timeout_ms = 0
        timeout = -1 if timeout_ms is None else timeout_ms / 1000
        sockets = self._sockets
        for fd, mask in self._epoll.poll(timeout):
            zsock = sockets.get(fd)
            if zsock is None:  # a descriptor: mostly a link with a message in
                ready.append((fd, POLLIN if mask == _EPOLLIN else zmq_flags(mask)))
            elif not zsock.closed and cast(int, zsock.getsockopt(_EVENTS)) & POLLIN \
                    and (zsock, POLLIN) not in ready:
                ready.append((zsock, POLLIN))
        return ready

    def close(self) -> None:
        self._epoll.close()


class _ZmqPoller(zmq.Poller):
    """``zmq.Poller`` with the one call ``EpollPoller`` adds (nothing to do there)."""

    def used(self, sock: zmq.Socket) -> None:
        pass

    def close(self) -> None:
        pass


def _epoll_flags(flags: int) -> int:
    return (select.EPOLLIN if flags & POLLIN else 0) | (select.EPOLLOUT if flags & POLLOUT else 0)


def make_poller() -> EpollPoller | _ZmqPoller:
    """An epoll poller where the platform has epoll, else ZeroMQ's."""
    return EpollPoller() if hasattr(select, "epoll") else _ZmqPoller()
