"""The member list: who is in the cluster, in join order, with a version the master raises.

The master is the oldest member, the first of the list (seed 002). Only the master changes
the list; the others take a published list when its version is higher than theirs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class MemberInfo:
    uuid: str
    name: str
    endpoint: str
    pid: int
    lite: bool = False
    link: str = ""  # host:port of its link listener (grid/link.py); "" when it has none

    def to_wire(self) -> list[Any]:
        return [self.uuid, self.name, self.endpoint, self.pid, self.lite, self.link]

    @classmethod
    def from_wire(cls, obj: Any) -> MemberInfo:
        # Five fields: a view saved before members had links (a hot restart reads it).
        if not isinstance(obj, list | tuple) or len(obj) not in (5, 6):
            raise ValueError("member info must be [uuid, name, endpoint, pid, lite, link]")
        uuid, name, endpoint, pid, lite = obj[:5]
        link = obj[5] if len(obj) == 6 else ""
        if not (isinstance(uuid, str) and isinstance(name, str) and isinstance(endpoint, str)
                and isinstance(pid, int) and isinstance(lite, bool) and isinstance(link, str)):
            raise ValueError("member info has fields of the wrong type")
        return cls(uuid, name, endpoint, pid, lite, link)


@dataclass(frozen=True, slots=True)
class MemberList:
    version: int = 0
    members: tuple[MemberInfo, ...] = field(default_factory=tuple)

    @property
    def master(self) -> MemberInfo | None:
        return self.members[0] if self.members else None

    @property
    def uuids(self) -> list[str]:
        return [m.uuid for m in self.members]

    @property
    def data_members(self) -> list[str]:
        """Uuids of the members that hold partitions (not lite), oldest first."""
        return [m.uuid for m in self.members if not m.lite]

    def get(self, uuid: str) -> MemberInfo | None:
        for m in self.members:
            if m.uuid == uuid:
                return m
        return None

    def __contains__(self, uuid: object) -> bool:
        return any(m.uuid == uuid for m in self.members)

    def __len__(self) -> int:
        return len(self.members)

    def with_member(self, info: MemberInfo) -> MemberList:
        """The list with a new member appended (the youngest), version + 1."""
        if info.uuid in self:
            raise ValueError(f"member {info.uuid} is already in the list")
        return MemberList(self.version + 1, self.members + (info,))

    def without(self, uuids: Iterable[str]) -> MemberList:
        gone = set(uuids)
        kept = tuple(m for m in self.members if m.uuid not in gone)
        if len(kept) == len(self.members):
            return self
        return MemberList(self.version + 1, kept)

    def promoted(self, uuid: str) -> MemberList:
        """The list with lite member ``uuid`` made a data member, version + 1 (seed 000)."""
        info = self.get(uuid)
        if info is None:
            raise ValueError(f"member {uuid} is not in the list")
        if not info.lite:
            raise ValueError(f"member {uuid} is a data member already")
        members = tuple(replace(m, lite=False) if m.uuid == uuid else m for m in self.members)
        return MemberList(self.version + 1, members)

    def with_version(self, version: int) -> MemberList:
        return replace(self, version=version)

    def first_alive(self, dead: Iterable[str]) -> MemberInfo | None:
        """The oldest member not known dead: who is (or must become) master."""
        gone = set(dead)
        return next((m for m in self.members if m.uuid not in gone), None)

    def to_wire(self) -> list[Any]:
        return [self.version, [m.to_wire() for m in self.members]]

    @classmethod
    def from_wire(cls, obj: Any) -> MemberList:
        if not isinstance(obj, list | tuple) or len(obj) != 2 or not isinstance(obj[0], int):
            raise ValueError("member list must be [version, [member, ...]]")
        return cls(obj[0], tuple(MemberInfo.from_wire(m) for m in obj[1]))
