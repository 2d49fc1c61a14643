"""Stream ownership: one etcd key per stream (``<prefix>/owners/<stream id>`` -> the owner's name), attached
to the owner's lease and created in a transaction only if absent, so at most one node holds a stream at any
revision and a dead node's streams free themselves one TTL after its last keep-alive. A node remembers the
create revision of each key it holds: the key is its only while that revision stands (a later key of the same
name is someone else's), which guards the resume writes and the release."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from streamd.cluster.etcd import Entry, Etcd
from streamd.cluster.resume import Position


@dataclass
class Owners:
    """What one etcd read says: live nodes (name -> capacity) and owners (stream -> node, create revision)."""

    nodes: dict[str, int] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)  # node -> lease id
    owner: dict[str, str] = field(default_factory=dict)
    revision: dict[str, int] = field(default_factory=dict)  # stream -> its owner key's create revision
    positions: dict[str, Position] = field(default_factory=dict)
    read_at: int = 0  # the store revision of the read


class Keys:
    """The cluster's keys under ``prefix``."""

    def __init__(self, etcd: Etcd, prefix: str, node: str) -> None:
        self.etcd, self.prefix, self.node = etcd, prefix, node

    def owner_key(self, stream_id: str) -> str:
        return f"{self.prefix}/owners/{stream_id}"

    def resume_key(self, stream_id: str) -> str:
        return f"{self.prefix}/resume/{stream_id}"

    def read(self) -> Owners:
        """Nodes, owners and saved positions, in one read (one revision)."""
        entries, revision = self.etcd.prefix(self.prefix + "/")
        out = Owners(read_at=revision)
        for e in entries:
            kind, _, name = e.key[len(self.prefix) + 1 :].partition("/")
            if kind == "nodes":
                out.nodes[name] = _capacity(e)
                out.leases[name] = e.lease
            elif kind == "owners":
                out.owner[name] = _owner(e)
                out.revision[name] = e.create_revision
            elif kind == "resume" and (pos := Position.from_json(e.value)) is not None:
                out.positions[name] = pos
        return out

    def claim(self, stream_id: str, lease: int) -> int:
        """Take the stream if nobody holds it: the key's create revision, 0 when someone does."""
        value = json.dumps({"node": self.node, "since": round(time.time(), 3)})
        return self.etcd.create(self.owner_key(stream_id), value, lease)

    def release(self, stream_id: str, revision: int, final: Position | None) -> bool:
        """Give the stream up: save its final position, then delete the owner key (only while it is ours)."""
        if final is not None:
            self.etcd.put_if(
                {self.resume_key(stream_id): final.to_json()}, {self.owner_key(stream_id): revision}
            )
        return self.etcd.delete_if(self.owner_key(stream_id), revision)

    def save(self, positions: dict[str, Position], held: dict[str, int]) -> bool:
        """Save positions of streams still ours (one transaction, guarded by each owner key's revision)."""
        if not positions:
            return True
        puts = {self.resume_key(sid): pos.to_json() for sid, pos in positions.items()}
        return self.etcd.put_if(puts, {self.owner_key(sid): held[sid] for sid in positions})


def _capacity(e: Entry) -> int:
    try:
        return max(1, int(json.loads(e.value).get("capacity", 1)))
    except (ValueError, TypeError, AttributeError):
        return 1


def _owner(e: Entry) -> str:
    try:
        return str(json.loads(e.value)["node"])
    except (ValueError, TypeError, KeyError):
        return e.value
