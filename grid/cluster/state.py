"""Cluster states (seed 000): what each allows.

ACTIVE allows everything; NO_MIGRATION lets members join but plans no migration; FROZEN
takes no new member and plans no migration but serves every operation; PASSIVE serves reads
only (a cluster that is shutting down or loading its data); STABLE_CLUSTER is FROZEN that
lets members that left come back and take back their partitions (seed 003).
"""

from __future__ import annotations

from enum import StrEnum


class ClusterState(StrEnum):
    ACTIVE = "ACTIVE"
    NO_MIGRATION = "NO_MIGRATION"
    FROZEN = "FROZEN"
    PASSIVE = "PASSIVE"
    # Seed 003: the topology is where it should be. No new member joins and nothing
    # rebalances, but a member that left may come back (restarted from its files) and takes
    # back the partitions it held when the state was entered (the stable table).
    STABLE_CLUSTER = "STABLE_CLUSTER"

    @property
    def join_allowed(self) -> bool:
        return self in (ClusterState.ACTIVE, ClusterState.NO_MIGRATION)

    @property
    def migration_allowed(self) -> bool:
        return self is ClusterState.ACTIVE

    @property
    def rejoin_allowed(self) -> bool:
        """A member that left may join again, to take back what the stable table gave it."""
        return self is ClusterState.STABLE_CLUSTER

    @property
    def writes_allowed(self) -> bool:
        return self is not ClusterState.PASSIVE
