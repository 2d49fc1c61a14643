"""The cluster in ``/metrics``: nodes, their streams and leases, moves and fenced lines, from the node's
``status()`` dict (the supervisor puts it in its snapshot as ``cluster``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def cluster_families(status: Mapping[str, Any] | None) -> Iterator[Any]:
    """Prometheus metric families (nothing when the cluster is off)."""
    if not status:
        return
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    me = status["node"]
    nodes = GaugeMetricFamily("streamd_cluster_node_streams", "Streams each live node owns.", labels=["node"])
    capacity = GaugeMetricFamily(
        "streamd_cluster_node_capacity", "Capacity each node declares.", labels=["node"]
    )
    lease_age = GaugeMetricFamily(
        "streamd_cluster_node_lease_age_seconds",
        "Seconds since each node's lease was last renewed, as etcd says.",
        labels=["node"],
    )
    for name, n in status.get("nodes", {}).items():
        nodes.add_metric([name], len(n.get("streams", ())))
        capacity.add_metric([name], n.get("capacity", 0))
        if n.get("lease_age_s") is not None:
            lease_age.add_metric([name], n["lease_age_s"])
    yield from (nodes, capacity, lease_age)
    own = GaugeMetricFamily(
        "streamd_cluster_lease_valid",
        "1 while this node's lease is valid (it may write lines).",
        labels=["node"],
    )
    own.add_metric([me], int(bool(status.get("lease_valid"))))
    left = GaugeMetricFamily(
        "streamd_cluster_lease_left_seconds", "Seconds before this node's fencing deadline.", labels=["node"]
    )
    left.add_metric([me], status.get("lease_left_s") or 0.0)
    lost = CounterMetricFamily("streamd_cluster_leases_lost", "Leases this node lost.", labels=["node"])
    lost.add_metric([me], status.get("leases_lost", 0))
    fenced = CounterMetricFamily(
        "streamd_cluster_fenced_lines",
        "Lines not written because this node no longer held the stream.",
        labels=["node"],
    )
    fenced.add_metric([me], status.get("fenced_lines", 0))
    moves = CounterMetricFamily(
        "streamd_cluster_moves",
        "Streams that moved to (in) or from (out) this node, by reason.",
        labels=["node", "direction", "reason"],
    )
    for direction in ("in", "out"):
        for reason, n in status.get(f"moves_{direction}", {}).items():
            moves.add_metric([me, direction, reason], n)
    yield from (own, left, lost, fenced, moves)
