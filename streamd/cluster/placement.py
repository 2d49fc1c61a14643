"""Which node owns which stream: rendezvous (highest-random-weight) hashing weighted by capacity, with a
fair share per node and the current owners kept where they may stay.

Pure: stream ids, live nodes with their capacities and the current owners in, an owner per stream out; every
node that reads the same etcd revision computes the same answer. Each (node, stream) pair gets a score
``-capacity / ln(u)`` (``u`` uniform in (0, 1) from a hash of the pair), so a node wins a stream with
probability proportional to its capacity.

Hashing alone balances only on average (12 streams on 3 nodes give one node 6 or more about one time in
five), and a strict share computed from the members alone moves other streams when a node dies (the dead
node's streams fill a survivor past its share, which then sheds one of its own). So:

- each live node takes at most its share, ``ceil(S * capacity / total)``;
- a stream stays with its live owner while that owner is within its share (a node over its share after a
  node joins keeps the streams it scores highest and gives up the rest);
- every other stream (new, its owner gone, or given up) goes, in a fixed order, to the highest-scoring node
  with room left.

Hence a node dying moves exactly its streams; a node joining takes at most its share, only from nodes over
theirs (``tests/cluster/test_placement.py`` measures both).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping


def score(node: str, stream_id: str, capacity: float) -> float:
    """The pair's rendezvous weight; higher wins."""
    digest = hashlib.blake2b(f"{node}\x00{stream_id}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 0.5) / 2**64  # uniform in (0, 1), never 0 or 1
    return -capacity / math.log(u)


def shares(count: int, capacities: Mapping[str, float]) -> dict[str, int]:
    """The most streams each node takes: its capacity's share of ``count``, rounded up."""
    total = sum(capacities.values())
    return {n: math.ceil(count * c / total - 1e-9) for n, c in capacities.items()}


def _order(stream_id: str) -> bytes:
    return hashlib.blake2b(stream_id.encode(), digest_size=8).digest()


def place(
    stream_ids: Iterable[str], capacities: Mapping[str, float], owners: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Owner node of each stream. ``capacities``: live node -> capacity (> 0); ``owners``: stream -> its
    current owner (entries for dead nodes or unknown streams are ignored). No live node: no owner."""
    nodes = {n: float(c) for n, c in capacities.items() if c > 0}
    ids = sorted(set(stream_ids), key=_order)
    if not nodes:
        return {}
    room = shares(len(ids), nodes)
    out: dict[str, str] = {}
    held: dict[str, list[str]] = {n: [] for n in nodes}
    for sid in ids:
        current = (owners or {}).get(sid)
        if current is not None and current in held:
            held[current].append(sid)
    for node, mine in held.items():  # within its share a node keeps what it holds, best-scoring first
        weight = nodes[node]
        mine.sort(key=lambda s: score(node, s, weight), reverse=True)
        for sid in mine[: room[node]]:
            out[sid] = node
        room[node] -= min(len(mine), room[node])
    for sid in ids:
        if sid in out:
            continue
        ranked = sorted(nodes, key=lambda n: (score(n, sid, nodes[n]), n), reverse=True)
        node = next((n for n in ranked if room[n] > 0), ranked[0])
        room[node] -= 1
        out[sid] = node
    return out


def moved(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """Streams whose owner differs (present in both)."""
    return sorted(sid for sid, node in after.items() if sid in before and before[sid] != node)
