"""One node of a streamd cluster: which of the cluster's streams this node runs, kept in step with etcd.

A thread (``_loop``) reads the cluster's keys every ``POLL_S`` (nodes, owners, saved positions: one read),
places every stream (``placement.place``), claims the streams placed here that nobody holds, gives up the
ones placed elsewhere (after they stopped here: final position saved, then the owner key deleted) and saves
the positions of the streams it runs. Every etcd call has a timeout and runs on that thread or the lease's
(``membership``), never on the supervisor's loop: the supervisor only calls ``apply`` on its tick, which
hands the wanted streams to its reload machinery (``Supervisor.change_streams``: only the touched streams
start or stop), and ``may_write`` before each line goes to the sinks (the fence).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any, Protocol

from streamd.cluster.etcd import Etcd, EtcdError
from streamd.cluster.membership import Membership
from streamd.cluster.ownership import Keys, Owners
from streamd.cluster.placement import place
from streamd.cluster.resume import Position, RateMeter, continue_from
from streamd.cluster.streams import StreamList
from streamd.config import Config, StreamConfig
from streamd.protocol import Resume

log = logging.getLogger("streamd.cluster")

POLL_S = 0.5
STOP_TIMEOUT_S = 15.0  # a stream given up that has not stopped by then is released anyway (not final)


class Host(Protocol):
    """What the node needs of the supervisor (main thread only)."""

    config: Config

    def change_streams(self, streams: tuple[StreamConfig, ...]) -> str: ...
    def running_streams(self) -> set[str]: ...
    def stream_positions(self, stream_ids: tuple[str, ...]) -> dict[str, Resume]: ...
    def seed_positions(self, positions: dict[str, Resume]) -> None: ...


class ClusterNode:
    def __init__(self, config: Config, capacity: int) -> None:
        cfg = config.cluster
        self.cfg, self.name, self.capacity = cfg, cfg.node, capacity
        self.membership = Membership(
            Etcd(cfg.etcd, cfg.timeout_s),
            prefix=cfg.prefix,
            node=cfg.node,
            capacity=capacity,
            ttl_s=cfg.lease_ttl_s,
            margin_s=cfg.margin_s,
        )
        self._etcd = Etcd(cfg.etcd, cfg.timeout_s)  # this object's thread has its own connection
        self.keys = Keys(self._etcd, cfg.prefix, cfg.node)
        self.streams = StreamList(self._etcd, config)
        # What the loop thread shares with the supervisor's and the metrics threads, below (reentrant: a move
        # is noted while the lock is held).
        self._lock = threading.RLock()
        self.held: dict[str, int] = {}  # stream -> create revision of our owner key
        self._allowed: set[str] = set()  # streams whose lines may be written (the fence, with the lease)
        self._wanted: dict[str, StreamConfig] = {}  # streams that should run here
        self._seed: dict[str, Resume] = {}  # where newly claimed streams continue
        self._releasing: dict[str, tuple[str, float]] = {}  # stream -> (why, monotonic time asked)
        self._stopped: set[str] = set()  # released streams the supervisor no longer runs
        self._local: dict[str, Resume] = {}  # positions of the streams running here (from the supervisor)
        self._generation = 0
        self._rates = RateMeter()
        self._saved: dict[str, Resume] = {}
        self._last_save = 0.0
        self._seen_owner: dict[str, str] = {}
        self.view = Owners()
        self._lease_info: dict[str, tuple[int, int]] = {}  # node -> (seconds left, granted)
        self._last_lease_info = 0.0
        self.fenced_lines = 0
        self.moves_in: collections.Counter[str] = collections.Counter()
        self.moves_out: collections.Counter[str] = collections.Counter()
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- start -----------------------------------------------------------------------------------------------
    def join(self, settle_s: float) -> tuple[StreamConfig, ...]:
        """Register, give nodes starting at the same moment ``settle_s`` to register too, claim this node's
        share; returns the streams to start with. Raises EtcdError."""
        self.membership.join(wait_s=self.cfg.lease_ttl_s + 1.0)
        self._generation = self.membership.generation
        self.streams.refresh(first=True)
        time.sleep(settle_s)
        self.step()
        with self._lock:
            wanted = dict(self._wanted)
        return tuple(s for s in self.streams.streams if s.id in wanted)

    def start(self) -> None:
        self.membership.start()
        self._thread = threading.Thread(target=self._loop, name="cluster", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.step()
            except EtcdError as exc:
                log.debug("cluster: %s", exc)  # the lease thread says when etcd is away, once
            except Exception:  # the loop must outlive any surprise: the fence still holds
                log.exception("cluster: placement step failed")

    # -- the fence (reader threads) --------------------------------------------------------------------------
    def may_write(self, stream_id: str) -> bool:
        """Before a line goes to the sinks: this node holds the stream and its lease deadline is ahead."""
        m = self.membership
        if stream_id in self._allowed and m.valid and m.generation == self._generation:
            return True
        self.fenced_lines += 1
        return False

    # -- the placement step (loop thread) --------------------------------------------------------------------
    def step(self) -> None:
        m = self.membership
        if not m.valid or m.generation != self._generation:
            self._drop_all("its lease expired or etcd was unreachable past the lease deadline")
            self._generation = m.generation
            if not m.valid:
                return
        self.streams.refresh()
        view = self.keys.read()
        self.view = view
        ids = [s.id for s in self.streams.streams]
        by_id = self.streams.by_id
        with self._lock:
            for sid in self._wanted:  # a changed stream restarts with its new settings (reload's rules)
                self._wanted[sid] = by_id.get(sid, self._wanted[sid])
            for sid, rev in list(self.held.items()):
                if view.revision.get(sid) != rev:  # our key is gone or is another node's now
                    self._lost(sid, "its owner key was deleted or taken over")
        for sid, node in view.owner.items():  # ours but dropped (fenced while the lease lived on): free it
            if node == self.name and sid not in self.held:
                self.keys.etcd.delete_if(self.keys.owner_key(sid), view.revision[sid])
                return  # placed again from the next read
        plan = place(ids, view.nodes, view.owner)
        for sid in ids:
            if plan.get(sid) == self.name and sid not in view.owner and sid not in self.held and m.valid:
                self._claim(sid, view)
        for sid in list(self.held):
            if sid in self._releasing:
                continue
            if sid not in ids:
                self._give_up(sid, "removed from the stream list")
            elif plan.get(sid) != self.name:
                self._give_up(sid, f"rebalance: placed on {plan.get(sid)}")
        self._finish_releases()
        self._save_positions()
        self._seen_owner = {**self._seen_owner, **view.owner}
        self._read_leases(view)

    def _claim(self, sid: str, view: Owners) -> None:
        revision = self.keys.claim(sid, self.membership.lease)
        if not revision:
            return
        pos = view.positions.get(sid)
        before = self._seen_owner.get(sid) or (pos.node if pos else "")
        if before == self.name:
            why = "back on this node after it lost its lease"
        elif pos is None:
            why = "placed here (new stream)"
        elif pos.final:
            why = f"handed over by {pos.node}"
        elif before and before not in view.nodes:
            why = f"failover: {before} left (lease expired)"
        else:
            why = f"failover: {before or 'its owner'} stopped holding it"
        if pos is not None and pos.rate:
            self._rates.rate.setdefault(sid, pos.rate)
        with self._lock:
            self.held[sid] = revision
            self._allowed.add(sid)
            if pos is not None:
                self._seed[sid] = continue_from(pos, time.time())
            cfg = self.streams.by_id.get(sid)
            if cfg is not None:
                self._wanted[sid] = cfg
        self._move("in", sid, before if before != self.name else "", self.name, why)

    def _give_up(self, sid: str, why: str) -> None:
        with self._lock:
            self._wanted.pop(sid, None)
            self._releasing[sid] = (why, time.monotonic())

    def _finish_releases(self) -> None:
        """Streams given up: once stopped here, stop writing their lines, then (next step, so a line already
        past the fence is counted in the position) save the final position and delete the owner key."""
        now = time.monotonic()
        for sid, (why, asked) in list(self._releasing.items()):
            stopped = sid in self._stopped
            late = now - asked > STOP_TIMEOUT_S
            if not (stopped or late):
                continue
            if sid in self._allowed:
                with self._lock:
                    self._allowed.discard(sid)
                continue
            with self._lock:
                local = self._local.get(sid)
                rev = self.held.pop(sid, None)
                del self._releasing[sid]
                self._stopped.discard(sid)
                self._local.pop(sid, None)
            final = None
            if local is not None:
                final = Position(local, self._rates.rate.get(sid, 0.0), self.name, final=stopped)
            self._rates.forget(sid)
            if rev is not None:
                self.keys.release(sid, rev, final)
            self._move("out", sid, self.name, "", why)

    def _lost(self, sid: str, why: str) -> None:
        """(lock held) A stream that is no longer ours: stop writing its lines at once, stop it."""
        self.held.pop(sid, None)
        self._allowed.discard(sid)
        self._wanted.pop(sid, None)
        self._releasing.pop(sid, None)
        self._local.pop(sid, None)
        self._move("out", sid, self.name, "", f"lost: {why}")

    def _drop_all(self, why: str) -> None:
        with self._lock:
            for sid in list(self.held):
                self._lost(sid, why)

    def _save_positions(self) -> None:
        now = time.monotonic()
        if now - self._last_save < self.cfg.resume_every_s:
            return
        self._last_save = now
        with self._lock:
            local = {sid: r for sid, r in self._local.items() if sid in self._allowed and sid in self.held}
            held = {sid: self.held[sid] for sid in local}
        positions = {}
        for sid, r in local.items():
            rate = self._rates.update(sid, r)
            if self._saved.get(sid) != r:
                positions[sid] = Position(r, rate, self.name, final=False)
        if positions and self.keys.save(positions, held):
            self._saved.update({sid: p.resume for sid, p in positions.items()})

    def _read_leases(self, view: Owners) -> None:
        """Every 2 s: how long each node's lease has left (its age since its last keep-alive)."""
        now = time.monotonic()
        if now - self._last_lease_info < 2.0:
            return
        self._last_lease_info = now
        info = {}
        for node, lease in view.leases.items():
            try:
                info[node] = self._etcd.time_to_live(lease)
            except EtcdError:
                break
        self._lease_info = info

    def _move(self, way: str, sid: str, src: str, dst: str, why: str) -> None:
        with self._lock:
            (self.moves_in if way == "in" else self.moves_out)[why.split(":")[0]] += 1
            self.recent.append(
                {"t": round(time.time(), 3), "stream": sid, "from": src, "to": dst, "reason": why}
            )
        if way == "in":
            log.info("cluster: stream %s moved to %s from %s: %s", sid, dst, src or "nowhere", why)
        else:
            log.info("cluster: stream %s moved off %s: %s", sid, src, why)

    # -- the supervisor's side (main thread) -----------------------------------------------------------------
    def apply(self, host: Host) -> None:
        """On the supervisor's tick: run the wanted streams (reload's rules), tell the loop which given-up
        streams have stopped and where the running ones stand."""
        running = host.running_streams()
        with self._lock:
            wanted = dict(self._wanted)
            seed, self._seed = self._seed, {}
            for sid in self._releasing:
                if sid not in running:
                    self._stopped.add(sid)
            ids = tuple(self.held)
        positions = host.stream_positions(ids)
        with self._lock:
            self._local.update(positions)
        if seed:
            host.seed_positions(seed)
        current = {s.id: s for s in host.config.streams}
        if current != wanted:
            order = {s.id: k for k, s in enumerate(self.streams.streams)}
            streams = tuple(sorted(wanted.values(), key=lambda s: order.get(s.id, len(order))))
            what = host.change_streams(streams)
            log.info("cluster: node %s runs %d stream(s): %s", self.name, len(streams), what)

    def reloaded(self, new: Config) -> Config:
        """SIGHUP with a valid file: the file's stream list becomes the cluster's (unless it comes from etcd);
        returns ``new`` with only this node's streams, settings as in the new list."""
        self.streams.reload(new)
        with self._lock:
            by_id = self.streams.by_id
            for sid in [s for s in self._wanted if s not in by_id]:
                self._wanted.pop(sid)
            self._wanted.update({sid: by_id[sid] for sid in self._wanted})
            mine = set(self._wanted)
        return dataclasses.replace(new, streams=tuple(s for s in self.streams.streams if s.id in mine))

    # -- status ----------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """For /api/status, /metrics and the status page (the metrics server's thread)."""
        view, now = self.view, time.monotonic()
        m = self.membership
        with self._lock:
            here, moves_in, moves_out = sorted(self.held), dict(self.moves_in), dict(self.moves_out)
            recent = list(self.recent)[-10:]
        nodes = {}
        for node, capacity in sorted(view.nodes.items()):
            left, granted = self._lease_info.get(node, (-1, 0))
            nodes[node] = {
                "capacity": capacity,
                "streams": sorted(s for s, n in view.owner.items() if n == node),
                "lease_left_s": left if left >= 0 else None,
                "lease_age_s": granted - left if left >= 0 and granted else None,
            }
        return {
            "node": self.name,
            "capacity": self.capacity,
            "lease_ttl_s": self.cfg.lease_ttl_s,
            "lease_valid": m.valid,
            "lease_age_s": round(now - m.last_ack, 2) if m.lease else None,
            "lease_left_s": round(max(0.0, m.deadline - now), 2) if m.lease else 0.0,
            "leases_lost": m.lost,
            "streams_total": len(self.streams.streams),
            "streams_here": here,
            "nodes": nodes,
            "moves_in": moves_in,
            "moves_out": moves_out,
            "recent_moves": recent,
            "fenced_lines": self.fenced_lines,
            "stream_list": self.streams.status(),
        }

    def close(self, positions: dict[str, Resume]) -> None:
        """Leaving (the workers stopped): save final positions, release every stream, revoke the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.cfg.timeout_s * 2 + 1)
        try:
            for sid, rev in list(self.held.items()):
                r = positions.get(sid)
                final = Position(r, self._rates.rate.get(sid, 0.0), self.name, True) if r else None
                if self.membership.valid:
                    self.keys.release(sid, rev, final)
        except EtcdError as exc:
            log.warning("cluster: could not release the streams (%s); they move when the lease expires", exc)
        self.membership.close()
        self._etcd.close()
        self.membership.etcd.close()
