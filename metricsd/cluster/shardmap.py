"""The shard map: which store members hold each slot, and where those members listen.

Keys in etcd, under a configurable root (default ``/metricsd``) and cluster name (default
``default``), so that several clusters can share one etcd:

===================================  =============================================================
key                                  value
===================================  =============================================================
``<root>/<cluster>/map``             the shard map, JSON (below). Written only by the leader config
                                     server, with a compare-and-swap on the key's revision guarded
                                     by its leader key; ``version`` grows by one per change.
``<root>/<cluster>/members/<id>``    one store member's record, JSON ``{"id": "store-1",
                                     "address": "127.0.0.1:7101", "state": "active"}``, written
                                     by the store itself under its lease, so a dead store's record
                                     expires with the lease and the leader reassigns its slots.
``<root>/<cluster>/leader``          the id of the leader config server, created with a
                                     compare-and-swap under the leader's lease (see election.py).
===================================  =============================================================

The map's JSON, with the member addresses copied in so that a proxy needs only this key::

    {"format": 1, "version": 7, "rf": 3,
     "slots": [["store-1", "store-2", "store-3"], ["store-2", "store-3", "store-1"], ...],
     "members": {"store-1": {"address": "127.0.0.1:7101", "state": "active"}, ...}}

``slots[i]`` lists slot i's replicas in order, on distinct members; the first is the preferred
one to read from. A slot has ``min(rf, number of members)`` replicas: a cluster smaller than RF
keeps every slot on every member. Member states: ``joining`` (registered, still catching up from
its peers), ``active`` and ``leaving`` (draining before shutdown).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FORMAT",
    "KeyLayout",
    "Member",
    "MemberState",
    "ShardMap",
    "ShardMapError",
    "validate_member_id",
]

FORMAT = 1
_MEMBER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ADDRESS_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


class ShardMapError(ValueError):
    """A shard map or member record that fails validation; the message says which field and why."""


class MemberState(enum.Enum):
    JOINING = "joining"
    ACTIVE = "active"
    LEAVING = "leaving"


def validate_member_id(member_id: str) -> None:
    """Member ids become etcd key segments: letters, digits, ``.``, ``_``, ``-``; at most 63."""
    if not isinstance(member_id, str) or not _MEMBER_ID_RE.match(member_id):
        raise ShardMapError(
            f"invalid member id {member_id!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def _validate_address(member_id: str, address: object) -> None:
    m = _ADDRESS_RE.match(address) if isinstance(address, str) else None
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ShardMapError(f"member {member_id}: invalid gRPC address {address!r}, want host:port")


@dataclass(frozen=True, slots=True)
class Member:
    """A store member: its id, the gRPC address proxies and peers dial, and its state."""

    id: str
    address: str
    state: MemberState = MemberState.ACTIVE

    def validate(self) -> None:
        validate_member_id(self.id)
        _validate_address(self.id, self.address)

    def to_json(self) -> bytes:
        """The member record stored under ``members/<id>``."""
        return json.dumps({"id": self.id, "address": self.address, "state": self.state.value}).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Member:
        doc = _load(data, "member record")
        if not isinstance(doc, dict):
            raise ShardMapError("member record: want a JSON object")
        return cls._from_fields(doc.get("id"), doc)

    @classmethod
    def _from_fields(cls, member_id: object, doc: Mapping[str, Any]) -> Member:
        if not isinstance(member_id, str):
            raise ShardMapError(f"member record: invalid id {member_id!r}")
        state_text = doc.get("state", MemberState.ACTIVE.value)
        try:
            state = MemberState(state_text)
        except ValueError:
            allowed = ", ".join(s.value for s in MemberState)
            raise ShardMapError(f"member {member_id}: unknown state {state_text!r} (one of {allowed})") from None
        member = cls(member_id, doc.get("address"), state)  # type: ignore[arg-type]  # checked below
        member.validate()
        return member


@dataclass(frozen=True)
class ShardMap:
    """An immutable, validated shard map. Build new ones with :func:`metricsd.cluster.assign.assign`.

    ``members`` holds every member named in ``slots`` (and may hold members with no slot yet).
    """

    version: int
    rf: int
    slots: tuple[tuple[str, ...], ...]
    members: Mapping[str, Member] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def empty(cls, num_slots: int, rf: int) -> ShardMap:
        """Version 0: no members, no replicas. What a cluster starts from."""
        return cls(version=0, rf=rf, slots=((),) * num_slots, members={})

    @property
    def num_slots(self) -> int:
        return len(self.slots)

    def replicas(self, slot: int) -> tuple[str, ...]:
        """Slot ``slot``'s replicas in preference order. Raises IndexError for a bad slot."""
        if not 0 <= slot < len(self.slots):
            raise IndexError(f"slot {slot} out of range 0..{len(self.slots) - 1}")
        return self.slots[slot]

    def address(self, member_id: str) -> str:
        return self.members[member_id].address

    def slots_of(self, member_id: str) -> list[int]:
        """The slots ``member_id`` holds a replica of, ascending. O(slots * rf)."""
        return [i for i, replicas in enumerate(self.slots) if member_id in replicas]

    def load(self) -> dict[str, int]:
        """Replicas held per member, including members that hold none."""
        counts = dict.fromkeys(self.members, 0)
        for replicas in self.slots:
            for m in replicas:
                counts[m] += 1
        return counts

    def validate(self) -> None:
        """Raise ShardMapError naming the first fault; a map that passes is safe to route on."""
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 0:
            raise ShardMapError(f"version must be an integer >= 0, got {self.version!r}")
        if not isinstance(self.rf, int) or isinstance(self.rf, bool) or self.rf < 1:
            raise ShardMapError(f"rf must be an integer >= 1, got {self.rf!r}")
        if not self.slots:
            raise ShardMapError("a shard map needs at least one slot")
        for member_id, member in self.members.items():
            if not isinstance(member, Member) or member.id != member_id:
                raise ShardMapError(f"members[{member_id!r}] does not hold member {member_id!r}")
            member.validate()
        for i, replicas in enumerate(self.slots):
            if not isinstance(replicas, tuple) or not all(isinstance(m, str) for m in replicas):
                raise ShardMapError(f"slot {i}: replicas must be a list of member ids")
            if len(set(replicas)) != len(replicas):
                raise ShardMapError(f"slot {i}: a member appears twice in {list(replicas)}")
            if len(replicas) > self.rf:
                raise ShardMapError(f"slot {i}: {len(replicas)} replicas exceed rf {self.rf}")
            unknown = [m for m in replicas if m not in self.members]
            if unknown:
                raise ShardMapError(f"slot {i}: unknown member(s) {', '.join(unknown)}")

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": self.version,
            "rf": self.rf,
            "slots": [list(r) for r in self.slots],
            "members": {
                m.id: {"address": m.address, "state": m.state.value}
                for m in sorted(self.members.values(), key=lambda m: m.id)
            },
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> ShardMap:
        """Parse and validate; raises ShardMapError on any fault, never a KeyError or TypeError."""
        doc = _load(data, "shard map")
        if not isinstance(doc, dict):
            raise ShardMapError("shard map: want a JSON object")
        if doc.get("format") != FORMAT:
            raise ShardMapError(f"shard map: unsupported format {doc.get('format')!r}, this build reads {FORMAT}")
        raw_slots = doc.get("slots")
        if not isinstance(raw_slots, list) or not all(isinstance(r, list) for r in raw_slots):
            raise ShardMapError("shard map: slots must be a list of lists of member ids")
        raw_members = doc.get("members", {})
        if not isinstance(raw_members, dict) or not all(isinstance(v, dict) for v in raw_members.values()):
            raise ShardMapError("shard map: members must be an object of member id to {address, state}")
        members = {mid: Member._from_fields(mid, fields) for mid, fields in raw_members.items()}
        return cls(
            version=doc.get("version"),  # type: ignore[arg-type]  # validated in __post_init__
            rf=doc.get("rf"),  # type: ignore[arg-type]
            slots=tuple(tuple(r) for r in raw_slots),
            members=members,
        )

    def __str__(self) -> str:
        load = ", ".join(f"{m}={n}" for m, n in sorted(self.load().items()))
        return f"ShardMap(v{self.version}, {self.num_slots} slots, rf {self.rf}, load: {load or 'none'})"


def _load(data: bytes | str, what: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ShardMapError(f"{what}: not valid JSON ({e})") from None


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """Where a cluster's keys live in etcd; see the module docstring for the values."""

    root: str = "/metricsd"
    cluster: str = "default"

    def __post_init__(self) -> None:
        if not self.root.startswith("/") or self.root.endswith("/"):
            raise ValueError(f"root must start with '/' and not end with one, got {self.root!r}")
        if not _MEMBER_ID_RE.match(self.cluster):
            raise ValueError(f"invalid cluster name {self.cluster!r}")

    @property
    def base(self) -> str:
        return f"{self.root}/{self.cluster}"

    @property
    def map_key(self) -> str:
        return f"{self.base}/map"

    @property
    def members_prefix(self) -> str:
        return f"{self.base}/members/"

    @property
    def leader_key(self) -> str:
        return f"{self.base}/leader"

    def member_key(self, member_id: str) -> str:
        validate_member_id(member_id)
        return self.members_prefix + member_id

    def member_id_of(self, key: str) -> str:
        """The member id of a key under :attr:`members_prefix`; ValueError for any other key."""
        if not key.startswith(self.members_prefix):
            raise ValueError(f"{key!r} is not a member key under {self.members_prefix!r}")
        return key[len(self.members_prefix) :]

    def members_from(self, items: Iterable[tuple[str, bytes]]) -> tuple[dict[str, Member], list[str]]:
        """Member records from (key, value) pairs of a range over :attr:`members_prefix`.

        Returns the valid members and one message per rejected record: one store's broken record
        must not stop the config server from assigning the others. A record whose body names
        another id than its key is rejected, since that mistake would route one store's slots to
        another.
        """
        members: dict[str, Member] = {}
        errors: list[str] = []
        for key, value in items:
            try:
                member = Member.from_json(value)
                if member.id != self.member_id_of(key):
                    raise ShardMapError(f"the record names member {member.id!r}")
            except (ShardMapError, ValueError) as e:
                errors.append(f"member record at {key!r} ignored: {e}")
                continue
            members[member.id] = member
        return members, errors
