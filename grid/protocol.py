"""Message types and their frames.

A message is a list of ZeroMQ frames: a msgpack header (a small map), then raw payload frames
(serialized keys and values are never re-encoded). Requests carry ``op``, a correlation ``id``
and the cluster name ``c``; replies carry the same ``id`` and ``ok``, or an error ``code`` and
``msg``. Batches of raw entries travel as one frame: a msgpack array of bin items, or, where
the receiver wants decoded objects, the serialized items laid end to end.
"""

from __future__ import annotations

import hmac
import threading
from typing import Any

import msgpack

from grid import errors

# Client → member: map operations on one key (header: ns, pid; frames: key[, value]).
GET, PUT, SET, REMOVE, DELETE = "get", "put", "set", "remove", "delete"
PUT_IF_ABSENT, REPLACE, CONTAINS = "put_if_absent", "replace", "contains"
KEY_OPS = frozenset({GET, PUT, SET, REMOVE, DELETE, PUT_IF_ABSENT, REPLACE, CONTAINS})
WRITE_KEY_OPS = frozenset({PUT, SET, REMOVE, DELETE, PUT_IF_ABSENT, REPLACE})
# Client → member: map operations on partitions (header: ns, pids[, counts]).
PUT_ALL, GET_ALL, SIZE, CLEAR, ENTRIES, REPLACE_CONTENTS = (
    "put_all", "get_all", "size", "clear", "entries", "replace_contents")
WRITE_OPS = WRITE_KEY_OPS | {PUT_ALL, CLEAR, REPLACE_CONTENTS}
# Client → member, first on each connection (header: cid): whose connection it is, so that a
# backup can answer that client's single-key writes in their owner's place (grid/cluster/chain.py).
HELLO = "hello"
# Anyone → member: cluster views.
TABLE, STATUS, PING = "table", "status", "ping"
# Client → master: migration and partition-lost events after a number (for listeners).
EVENTS = "events"
# Member ↔ member.
JOIN, PUBLISH, HEARTBEAT, BACKUP, FETCH_STATE = (
    "join", "publish", "heartbeat", "backup", "fetch_state")
# Migrations: master → data sender, data sender → destination, master → destination.
MIGRATE, FRAGMENT, COMMIT = "migrate", "fragment", "commit"
# Data sender → destination: the Merkle trees of what it already holds (seed 003), so that
# the fragments carry only what differs.
MIGRATION_TREES = "migration_trees"
# Replica sync (seed 004): owner → backup its versions (anti-entropy); backup → owner a
# request for fragments; backup → owner that it has taken the lent ones.
REPLICA_VERSIONS, REPLICA_SYNC, REPLICA_SYNC_DONE = (
    "replica_versions", "replica_sync", "replica_sync_done")
# A member (or the CLI for it) asks the master to move its replicas away and remove it.
LEAVE = "leave"
# Cluster state changes: client → master, then master → every member (lock, then commit or
# unlock); see grid/cluster/state_change.py.
CHANGE_STATE, STATE_LOCK, STATE_COMMIT, STATE_UNLOCK = (
    "change_state", "state_lock", "state_commit", "state_unlock")
# Lite member promotion: client → the lite member, which asks the master (seed 000).
PROMOTE_LOCAL, PROMOTE = "promote_local", "promote"
# CLI → each member: a point-in-time copy of its persistence folder (hot restart backup).
PERSIST_BACKUP = "persist_backup"
# Supervisor → member.
MEMBER_DIED, FORM, SHUTDOWN, SET_STATE = "member_died", "form", "shutdown", "set_state"
# Member → supervisor and CLI → supervisor.
FENCE, STOP, ADD_MEMBER, RESTART_MEMBER = "fence", "stop", "add_member", "restart_member"
# Only the supervisor and the members may send these (to a member; the supervisor's own
# commands likewise): the header must carry the cluster secret in SECRET_FIELD.
CONTROL_OPS = frozenset({MEMBER_DIED, FORM, SET_STATE, SHUTDOWN,
                         JOIN, PUBLISH, HEARTBEAT, BACKUP, FETCH_STATE,
                         MIGRATE, FRAGMENT, COMMIT, MIGRATION_TREES, LEAVE, CHANGE_STATE,
                         STATE_LOCK, STATE_COMMIT, STATE_UNLOCK, PROMOTE_LOCAL, PROMOTE,
                         PERSIST_BACKUP, REPLICA_VERSIONS, REPLICA_SYNC,
                         REPLICA_SYNC_DONE})
SUPERVISOR_OPS = frozenset({FENCE, STOP, ADD_MEMBER, RESTART_MEMBER})
SECRET_FIELD = "k"

# Error codes in replies, and the client-side classes they become.
WRONG_TARGET, NOT_READY, MIGRATING, MEMBER_LEFT = (
    "wrong_target", "not_ready", "migrating", "member_left")
WRONG_CLUSTER, STATE, LITE, PROTOCOL, TOO_LARGE, SERVER = (
    "wrong_cluster", "state", "lite", "protocol", "too_large", "server")
AUTH = "auth"
STATE_CHANGE, ILLEGAL_STATE, UNKNOWN_MEMBER = "state_change", "illegal_state", "unknown_member"

_CODE_CLASSES: dict[str, type[errors.GridError]] = {
    WRONG_TARGET: errors.WrongTargetError,
    NOT_READY: errors.NotReadyError,
    MIGRATING: errors.PartitionMigratingError,
    MEMBER_LEFT: errors.MemberLeftError,
    PROTOCOL: errors.ProtocolError,
    SERVER: errors.ServerError,
    STATE_CHANGE: errors.StateChangeError,
    ILLEGAL_STATE: errors.IllegalMemberStateError,
    UNKNOWN_MEMBER: errors.UnknownMemberError,
}


# Each thread's msgpack Packer for headers: packb makes one a call, which is half of packing a
# small header (0.57 µs against 0.34 µs here). A Packer keeps a buffer as large as the largest
# thing it packed: one that packed a large header (a partition table) is dropped.
_packers = threading.local()
KEEP_PACKER_BYTES = 64 * 1024


def pack_header(header: dict[str, Any]) -> bytes:
    try:
        pack = _packers.pack
    except AttributeError:
        pack = _packers.pack = msgpack.Packer(use_bin_type=True).pack
    data = pack(header)
    if len(data) > KEEP_PACKER_BYTES:
        del _packers.pack
    return data


def unpack_header(frame: bytes) -> dict[str, Any]:
    """Decode a header frame; anything but a msgpack map is an error. The fields are checked
    where they are used (the dispatcher checks ``op``; a handler its own fields)."""
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise errors.ProtocolError(f"undecodable header: {exc.__class__.__name__}") from None
    if not isinstance(header, dict):
        raise errors.ProtocolError("header is not a map")
    return header


def request(op: str, rid: int, cluster: str, **fields: Any) -> bytes:
    fields["op"], fields["id"], fields["c"] = op, rid, cluster
    return pack_header(fields)


def has_secret(header: dict[str, Any], secret: str) -> bool:
    """Whether a request carries the cluster secret. With no secret configured, none does."""
    given = header.get(SECRET_FIELD)
    if not secret or not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode(), secret.encode())


def reply_ok(rid: Any, **fields: Any) -> bytes:
    fields["id"], fields["ok"] = rid, True
    return pack_header(fields)


def reply_error(rid: Any, code: str, msg: str, **fields: Any) -> bytes:
    fields["id"], fields["ok"], fields["code"], fields["msg"] = rid, False, code, msg
    return pack_header(fields)


def error_from_reply(header: dict[str, Any]) -> errors.GridError:
    """The exception a client raises (or retries) for an error reply."""
    code, msg = header.get("code", SERVER), str(header.get("msg", ""))
    if code == STATE:
        return errors.ClusterStateError(str(header.get("op", "operation")),
                                        str(header.get("state", "?")))
    if code == AUTH:
        return errors.NotAuthorizedError(str(header.get("op", "this operation")))
    if code == LITE:
        return errors.MemberIsLiteError(str(header.get("member", "?")),
                                        str(header.get("op", "operation")))
    if code == TOO_LARGE:
        return errors.ValueTooLargeError(int(header.get("size", 0)),
                                         int(header.get("limit", 0)))
    if code == WRONG_CLUSTER:
        return errors.WrongClusterNameError(str(header.get("expected", "?")),
                                            str(header.get("actual", "?")),
                                            str(header.get("endpoint", "?")))
    return _CODE_CLASSES.get(code, errors.ServerError)(msg)


def pack_items(items: list[bytes]) -> bytes:
    """A batch of raw byte items as one frame (a msgpack array of bin)."""
    return msgpack.packb(items, use_bin_type=True)


def unpack_items(frame: bytes) -> list[bytes]:
    items = msgpack.unpackb(frame, raw=True, use_list=True)
    if not isinstance(items, list) or not set(map(type, items)) <= {bytes}:
        raise errors.ProtocolError("batch payload is not an array of binary items")
    return items
