"""This node in the cluster: its etcd lease, kept alive by a thread, and its node key (name -> capacity).

Everything the node owns in etcd is attached to the lease, so a node that dies or loses etcd loses its keys
one TTL later and the others take its streams. The node must stop writing before that can happen, so it keeps
a local **deadline**: the monotonic time a keep-alive that etcd acknowledged was *sent*, plus the TTL, minus a
margin. Lines for its streams are written only before the deadline (``streamd.cluster.node`` fences them):
a node that was paused (SIGSTOP), cut off from etcd or starved of CPU past the deadline writes nothing more
for its streams until it has a lease again and has claimed them anew.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable

from streamd.cluster.etcd import Etcd, EtcdError

log = logging.getLogger("streamd.cluster")


class Membership:
    """The lease and node key of ``node``. ``etcd``: a client for this object's own thread."""

    def __init__(
        self,
        etcd: Etcd,
        *,
        prefix: str,
        node: str,
        capacity: int,
        ttl_s: int,
        margin_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.etcd = etcd
        self.node, self.capacity, self.ttl_s, self.margin_s = node, capacity, ttl_s, margin_s
        self.key = f"{prefix}/nodes/{node}"
        self._clock = clock
        self.lease = 0
        self.generation = 0  # +1 when a lease is lost: what was held under the old one is not held now
        self.deadline = 0.0  # monotonic: lines may be written before this
        self.last_ack = 0.0  # monotonic: the send time of the last acknowledged keep-alive
        self.joined_at = 0.0  # wall time of the current lease
        self.lost = 0  # leases lost (expired, or etcd away past the deadline)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._down_since: float | None = None
        self._old_lease = (
            0  # a lease given up for lost that etcd may still hold (it was away): revoked on return
        )

    @property
    def valid(self) -> bool:
        return self.lease != 0 and self._clock() < self.deadline

    def join(self, wait_s: float) -> None:
        """Take a lease and the node key; raises EtcdError. A key of the same name still held by another
        lease (this node's previous run, killed; or another node with this name) is waited for up to
        ``wait_s`` — an older run's lease expires within its TTL."""
        give_up = self._clock() + wait_s
        while True:
            self._grant()
            if self._create_key():
                return
            self.etcd.revoke(self.lease)
            self.lease = 0
            if self._clock() >= give_up:
                raise EtcdError(
                    f"node name {self.node!r} is held by another running node (key {self.key}); give each "
                    "node its own cluster.node (or STREAMD_NODE_NAME)"
                )
            time.sleep(0.5)

    def _grant(self) -> None:
        sent = self._clock()
        self.lease = self.etcd.grant(self.ttl_s)
        self.last_ack, self.joined_at = sent, time.time()
        self.deadline = sent + self.ttl_s - self.margin_s

    def _create_key(self) -> bool:
        value = json.dumps({"capacity": self.capacity, "pid": os.getpid(), "since": round(time.time(), 3)})
        return self.etcd.create(self.key, value, self.lease) != 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._keep_alive, name="cluster-lease", daemon=True)
        self._thread.start()

    def _keep_alive(self) -> None:
        """Renew the lease a few times per TTL; when it has expired (paused, etcd away), take a new one and
        the node key again (the node's streams were fenced at the deadline and are claimed anew)."""
        every = max(0.2, self.ttl_s / 4)
        while not self._stop.wait(every if self.lease else 0.5):
            sent = self._clock()
            try:
                if self.lease and self.etcd.keepalive(self.lease) > 0:
                    self.last_ack, self.deadline = sent, sent + self.ttl_s - self.margin_s
                    self._up()
                    continue
                if self.lease:  # expired in etcd: everything attached to it is gone
                    self._lose("its lease expired in etcd")
                if self._old_lease:  # its keys (node, owners) go now rather than at its expiry
                    self.etcd.revoke_if_alive(self._old_lease)
                    self._old_lease = 0
                self._grant()
                if not self._create_key():  # our old key, from an older lease, not expired yet
                    self.etcd.revoke(self.lease)
                    self.lease = 0
                    continue
                self._up()
                log.warning("cluster: node %s rejoined with a new lease", self.node)
            except EtcdError as exc:
                if self._down_since is None:
                    self._down_since = self._clock()
                    log.error(
                        "cluster: etcd unreachable (%s); keeping the streams until the lease deadline "
                        "(%.1f s)",
                        exc,
                        max(0.0, self.deadline - self._clock()),
                    )
                if self.lease and self._clock() >= self.deadline:
                    self._lose("etcd unreachable past the lease deadline")

    def _lose(self, why: str) -> None:
        self._old_lease = self.lease
        self.lease, self.deadline = 0, 0.0
        self.generation += 1  # before any new lease: the streams held under this one stay fenced
        self.lost += 1
        log.error(
            "cluster: node %s lost its lease (%s): its streams stop (fenced); rejoining", self.node, why
        )

    def _up(self) -> None:
        if self._down_since is not None:
            log.info("cluster: etcd reachable again after %.1f s", self._clock() - self._down_since)
            self._down_since = None

    def close(self) -> None:
        """Leave: the lease is revoked, so the node's keys go at once (its streams move without waiting)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.etcd.timeout_s + 1)
        if self.lease:
            try:
                self.etcd.revoke(self.lease)
            except EtcdError as exc:
                log.warning(
                    "cluster: could not revoke the lease (%s); its keys expire within %d s", exc, self.ttl_s
                )
            self.lease = 0
