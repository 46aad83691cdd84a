"""Cluster states (seed 000): what each allows.

ACTIVE allows everything; NO_MIGRATION lets members join but plans no migration; FROZEN
takes no new member and plans no migration but serves every operation; PASSIVE serves reads
only (a cluster that is shutting down or loading its data).
"""

from __future__ import annotations

from enum import StrEnum


class ClusterState(StrEnum):
    ACTIVE = "ACTIVE"
    NO_MIGRATION = "NO_MIGRATION"
    FROZEN = "FROZEN"
    PASSIVE = "PASSIVE"

    @property
    def join_allowed(self) -> bool:
        return self in (ClusterState.ACTIVE, ClusterState.NO_MIGRATION)

    @property
    def migration_allowed(self) -> bool:
        return self is ClusterState.ACTIVE

    @property
    def writes_allowed(self) -> bool:
        return self is not ClusterState.PASSIVE
