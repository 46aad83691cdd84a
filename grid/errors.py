"""Every failure a user of the grid can cause or meet, each with its own class.

Messages say what happened and what to do. Classes marked retryable are the ones the client
retries on its own (with backoff, until the invocation timeout); the user sees them only wrapped
in an :class:`OperationTimeoutError`.
"""

from __future__ import annotations


class GridError(Exception):
    """Base of every error shmgrid raises."""

    retryable = False


class ClusterNotRunningError(GridError):
    """No cluster answers where we looked (registry file or address)."""

    def __init__(self, where: str, detail: str = "") -> None:
        msg = f"no shmgrid cluster is running at {where}"
        if detail:
            msg += f" ({detail})"
        msg += "; start one with `shmgrid start` or pass the address of a running member"
        super().__init__(msg)
        self.where = where


class WrongClusterNameError(GridError):
    def __init__(self, expected: str, actual: str, endpoint: str) -> None:
        super().__init__(
            f"the member at {endpoint} belongs to cluster {actual!r}, not {expected!r}; "
            f"connect with cluster_name={actual!r} or to the right address"
        )
        self.expected, self.actual, self.endpoint = expected, actual, endpoint


class OperationTimeoutError(GridError):
    def __init__(self, op: str, seconds: float, partition_id: int | None = None,
                 last_error: BaseException | None = None) -> None:
        where = f" on partition {partition_id}" if partition_id is not None else ""
        msg = f"{op}{where} did not complete within {seconds:g} s"
        if last_error is not None:
            msg += f" (last error: {last_error})"
        msg += "; check `shmgrid status`, or raise invocation_timeout"
        super().__init__(msg)
        self.op, self.seconds, self.partition_id, self.last_error = (
            op, seconds, partition_id, last_error)


class IndeterminateOperationStateError(OperationTimeoutError):
    """A write whose outcome is unknown: an attempt reached a member and no definite answer
    came back before the invocation timeout, so it may or may not have been applied (as
    Hazelcast's IndeterminateOperationStateException). Resending it is safe only where the
    write is idempotent; read the key to find out."""

    def __init__(self, op: str, seconds: float, partition_id: int | None = None,
                 last_error: BaseException | None = None) -> None:
        super().__init__(op, seconds, partition_id, last_error)
        self.args = (f"{op} may or may not have been applied: {self.args[0]}",)


class PartlyAppliedError(IndeterminateOperationStateError):
    """A write refused by a member (the cluster state, say) after part of it was applied or
    an earlier attempt may have been: a put_all whose other partitions were written, or a
    put whose first attempt went unanswered. Not a clean refusal: read the keys to find out.
    ``refusal`` is the member's error."""

    def __init__(self, op: str, refusal: GridError) -> None:
        GridError.__init__(self, f"{op} was refused ({refusal}) after part of it was applied "
                           f"or an earlier attempt may have been; read the keys to find out")
        self.op, self.seconds, self.partition_id, self.last_error = op, 0.0, None, refusal
        self.refusal = refusal


class ValueTooLargeError(GridError, ValueError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"serialized entry is {size} bytes, more than the limit of {limit} bytes "
            f"(max_value_bytes); split the value or raise the limit"
        )
        self.size, self.limit = size, limit


class KeyNotSerializableError(GridError, TypeError):
    def __init__(self, key: object) -> None:
        super().__init__(
            f"key {key!r} of type {type(key).__name__} cannot be a grid key; keys are str, "
            f"bytes, int, float, bool or tuples of these"
        )


class ValueNotSerializableError(GridError, TypeError):
    def __init__(self, value: object, cause: BaseException) -> None:
        super().__init__(
            f"value of type {type(value).__name__} cannot be serialized with msgpack ({cause}); "
            f"use dicts, lists, str, bytes, numbers, bools and None"
        )


class ClusterStateError(GridError):
    """The cluster's state (e.g. PASSIVE while it shuts down) does not allow the operation."""

    def __init__(self, op: str, state: str) -> None:
        super().__init__(
            f"{op} is refused while the cluster is {state}; wait until it is ACTIVE again "
            f"(`shmgrid status`)"
        )
        self.op, self.state = op, state


class StateChangeError(GridError):
    """A cluster state change did not happen (migrations in flight, a member that did not
    lock it, members that changed meanwhile, time up); every member kept the old state, so
    it is safe to ask again."""


class IllegalMemberStateError(GridError):
    """A promotion that cannot be: the member is a data member already, or the master changed
    while it ran (ask again)."""


class UnknownMemberError(GridError, ValueError):
    """The master does not know the member named in a request."""


class MemberIsLiteError(GridError):
    def __init__(self, member: str, op: str) -> None:
        super().__init__(
            f"member {member} is a lite member and holds no partitions, so it cannot serve {op}; "
            f"send data operations through the client, which routes them to partition owners"
        )


class NotAuthorizedError(GridError):
    """A control message without the cluster secret: only the supervisor and members send them."""

    def __init__(self, op: str) -> None:
        super().__init__(
            f"only the cluster's supervisor and its members may send {op!r}; clients use the "
            f"map API (grid.connect), and the shmgrid command reads the cluster secret from the "
            f"registry file"
        )
        self.op = op


class ProtocolError(GridError):
    """A malformed message; a member answers with it, never crashes."""


class ServerError(GridError):
    """A member failed while serving a request (its log has the details)."""


# Retryable conditions: the client hides these behind retries.
class RetryableError(GridError):
    retryable = True


class WrongTargetError(RetryableError):
    """The member asked is not (or no longer) the owner of the partition."""


class PartitionMigratingError(RetryableError):
    pass


class MemberLeftError(RetryableError):
    """The member asked left the cluster, or did not answer in time."""


class NotReadyError(RetryableError):
    """The cluster has not assigned partitions yet, or a new master is still recovering."""
