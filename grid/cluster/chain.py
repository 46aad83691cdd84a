"""Chained answers: the synchronous backup answers a write in its owner's place.

A write is answered once every synchronous backup applied it. With the owner answering, that
is four hops: client → owner → backup → owner → client. When the table names one synchronous
backup, the backup can answer the client itself once it applied the operation: three hops on
the critical path, and the same four messages (the backup still acknowledges to its owner,
which releases the answers queued behind the write, as reply_order.py requires). Hazelcast's
scheme (backups acknowledge to the caller as well as to the owner) costs a message more.

A batch write (``put_all``) is chained the same way when one backup holds every partition
of it that the owner writes (keys of one hash tag; a cluster of two members), and the owner's
answer would say no more than "done" (no partition to send elsewhere). The backup answers once
it applied every part, each in sequence.

What the answer says must be what the owner would have said: the previous value. A backup
that applied the operation in sequence (its replica version was one behind, and the namespace
is not dirty) held what the owner held before it, so its previous value is the owner's. Any
other backup leaves the answer to the owner, as does every case below where the owner's answer
needs more than the backup's having applied it:

- more than one synchronous backup (each must have applied it: only the owner learns that);
- the owner's log must be on disk first (``persistence_fsync = always``);
- a resend joined the write (it waits on the owner's ticket);
- a batch that is a resend (an earlier attempt wrote some of it, perhaps not yet backed up);
- the backup does not know the caller's connection (``HELLO`` not seen, or the link closed).

The backup tells its owner in its acknowledgement whether it answered. If that answer is lost
with a broken connection, the client's attempt times out and its resend is answered from the
invocation records, as a lost owner's answer is.

Pure state: no sockets, no clocks.
"""

from __future__ import annotations

MAX_CLIENTS = 10_000  # connections remembered per member; the oldest are forgotten first


def owner_may_chain(sync_backups: int, waiters: int, durable_wait: bool) -> bool:
    """Whether an owner lets its backup answer a write (``sync_backups``: the synchronous
    backups of all the partitions it writes, together)."""
    return sync_backups == 1 and waiters == 1 and not durable_wait


def backup_may_answer_batch(parts: int, applied: int) -> bool:
    """Whether a backup answers a batch write it was let answer: only when it applied every
    part (a part refused, by a table that says we do not back it up, or not applied, being
    older than what a replica sync brought, leaves the answer to the owner)."""
    return applied == parts


class ClientConnections:
    """Client id → the connection (ident) it greeted this member on, and back."""

    def __init__(self, max_clients: int = MAX_CLIENTS) -> None:
        if max_clients <= 0:
            raise ValueError("max_clients must be positive")
        self.max_clients = max_clients
        self._idents: dict[str, bytes] = {}
        self._clients: dict[bytes, str] = {}

    def greeted(self, client_id: str, ident: bytes) -> None:
        """``client_id`` said hello on connection ``ident`` (its newest connection wins)."""
        old = self._idents.pop(client_id, None)
        if old is not None:
            self._clients.pop(old, None)
        previous = self._clients.pop(ident, None)  # a connection speaks for one client
        if previous is not None:
            self._idents.pop(previous, None)
        self._idents[client_id] = ident
        self._clients[ident] = client_id
        while len(self._idents) > self.max_clients:
            forgotten = next(iter(self._idents))
            self._clients.pop(self._idents.pop(forgotten), None)

    def closed(self, ident: bytes) -> None:
        """Connection ``ident`` is gone: its client cannot be answered on it any more."""
        client_id = self._clients.pop(ident, None)
        if client_id is not None:
            self._idents.pop(client_id, None)

    def ident(self, client_id: str) -> bytes | None:
        return self._idents.get(client_id)

    def __len__(self) -> int:
        return len(self._idents)
