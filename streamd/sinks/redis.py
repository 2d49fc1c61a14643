"""Redis Streams sink: every line XADDed to a Redis Stream, at least once, via an on-disk spool while the
server is away.

Why Redis Streams: one shared, persistent log that every node appends to and any number of readers
consume (consumer groups, XREAD from an id), trimmed by length (``MAXLEN ~``); the ``redis`` client is
synchronous with a timeout on every call, which fits a sink's threads (NATS JetStream's client is
asyncio-only).

Two threads, so that a server that does not answer (a host that is down: connects time out) never holds
lines up: the writer takes lines off the queue and hands them to the sender in memory while all is well, or
appends them to the spool (``spool.py``) once the sender falls behind; from then on every line goes to the
spool until it is empty again, so lines keep their order. The sender sends batches of ``batch_size`` lines as
pipelined ``XADD key MAXLEN ~ maxlen * line <json> node <host>``, one round trip each (a reply is the server's
acknowledgement), the spool's oldest first, and takes a batch off the spool only once it was acknowledged.
After a failure it retries with backoff (0.5 s doubling up to ``retry_max_s``). A batch whose send failed may
have reached the server in part, so it can arrive twice (``resent`` counts such lines); none is lost unless
the spool's byte cap is reached: then its oldest lines are deleted and counted as dropped, which the exit
status counts. At close, lines still undelivered go to the spool and are sent first at the next start.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from streamd.config.sinks import RedisSinkConfig
from streamd.exitcodes import EX_CANTCREAT, EX_CONFIG, StartupError
from streamd.sinks.base import _CLOSE, LineSink
from streamd.sinks.spool import Spool, SpoolError

log = logging.getLogger(__name__)

_FIRST_RETRY_S = 0.5
# Error replies that say "not now" rather than "never": the batch is sent again later, not dropped. The client
# turns some into exception classes (their text without the code), others stay ResponseError("CODE ...").
_TRANSIENT_CODES: tuple[str, ...] = ("LOADING", "BUSY", "OOM", "READONLY", "MASTERDOWN", "TRYAGAIN", "NOPERM")
_TRANSIENT_CODES += ("CLUSTERDOWN", "MISCONF", "NOAUTH")
_TRANSIENT_CLASSES: tuple[str, ...] = ("OutOfMemoryError", "ReadOnlyError", "NoPermissionError")
_TRANSIENT_CLASSES += ("TryAgainError", "ClusterDownError", "MasterDownError")


def _transient(error: Exception) -> bool:
    import redis

    names = {c.__name__ for c in type(error).__mro__}
    return (
        isinstance(error, redis.ConnectionError)
        or bool(names.intersection(_TRANSIENT_CLASSES))
        or str(error).startswith(_TRANSIENT_CODES)
    )


# Spool folders open in this process: a reload's new sink waits for the one it replaces to let go.
_HELD: set[Path] = set()
_HELD_LOCK = threading.Lock()


def read_password(cfg: RedisSinkConfig) -> str | None:
    """The password from ``password_file`` (first line) or ``password_env``; None when neither is set."""
    if cfg.password_file is not None:
        try:
            text = cfg.password_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise StartupError(
                f"sink redis: cannot read password_file {cfg.password_file}: {exc.strerror or exc}", EX_CONFIG
            ) from None
        return text.splitlines()[0] if text else ""
    if cfg.password_env:
        value = os.environ.get(cfg.password_env)
        if value is None:
            raise StartupError(
                f"sink redis: password_env names {cfg.password_env}, which is not set in the environment",
                EX_CONFIG,
            )
        return value
    return None


class RedisSink(LineSink):
    kind = "redis"

    def __init__(self, cfg: RedisSinkConfig) -> None:
        super().__init__(
            f"redis:{cfg.host}:{cfg.port}", cfg.queue_size, skip_empty=cfg.skip_empty, drops_ok=cfg.drops_ok
        )
        self.cfg = cfg
        self.close_grace_s = cfg.timeout_s + 2.0  # a round trip under way at the deadline may run its timeout
        self.node = socket.gethostname()  # each entry says which node wrote it
        self.resent = 0  # lines sent again after a failed attempt (upper bound on duplicates)
        self.reconnects = 0
        self.spool = Spool(cfg.spool_dir, cfg.spool_max_bytes)
        self._client: Any = None
        self._password: str | None = None
        self._spool_later = False  # the spool is taken when the writer starts (a reload's replacement)
        self._holds_spool = False
        self._connected = False
        self._unreachable: str | None = None  # why the server cannot be reached (None: fine or not tried yet)
        self._tried = threading.Event()  # the first attempt is over (wait_usable)
        # Shared by the writer and the sender, under _cond: lines in memory, the batch in flight, the spool.
        self._cond = threading.Condition()
        self._mem: collections.deque[list[tuple[str, str]]] = collections.deque()
        self._mem_lines = 0
        self._mem_cap = 4 * cfg.batch_size  # lines in memory before the writer spills to the spool
        self._inflight: list[tuple[str, str]] | None = None
        self._inflight_src = "mem"  # "mem", or "spool": the spool's head, taken off once acknowledged
        self._inflight_epoch = 0
        self._closing = False
        self._sender = threading.Thread(target=self._send_main, name=f"sink-{self.name}-send", daemon=True)
        self._deadline = float("inf")
        self._next_try = 0.0
        self._delay = _FIRST_RETRY_S
        self._down_since: float | None = None
        self._ever_connected = False

    # -- start/close ---------------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            import redis  # noqa: F401 (imported here only to say so when it is missing)
        except ImportError:
            raise StartupError(
                "sink redis: the Python package 'redis' is not installed; pip install 'streamd[redis]'",
                EX_CONFIG,
            ) from None
        self._password = read_password(self.cfg)
        with _HELD_LOCK:
            held_here = self.cfg.spool_dir in _HELD
        if held_here:  # a reload replaces the sink that holds it: taken once that one closed (_serve)
            self._spool_later = True
        else:
            self._open_spool()
        self._client = self._make_client(self.cfg.timeout_s)

    def _make_client(self, timeout: float) -> Any:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        cfg = self.cfg
        return redis.Redis(
            host=cfg.host,
            port=cfg.port,
            db=cfg.db,
            username=cfg.username or None,
            password=self._password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # one attempt per call: the sender does its own backoff
        )

    def _open_spool(self) -> None:
        try:
            left = self.spool.open()
        except SpoolError as exc:
            raise StartupError(f"sink redis: {exc}", EX_CANTCREAT) from None
        with _HELD_LOCK:
            _HELD.add(self.cfg.spool_dir)
        self._holds_spool = True
        if left:
            log.warning("sink %s: %d line(s) waiting in the spool; sent first", self.name, left)

    def wait_usable(self, timeout: float) -> str | None:
        """None once the server answered, else why not (a reload says so; the sink stays, spools, and keeps
        trying). A sink a reload holds back has not tried yet: it asks the server now."""
        if not self._sender.is_alive() and not self._tried.is_set():
            import redis

            client = self._make_client(max(0.1, min(timeout, self.cfg.timeout_s)))
            try:
                client.ping()
                return None
            except redis.RedisError as exc:
                return f"the server cannot take lines ({type(exc).__name__}: {exc})"
            finally:
                client.close()
        self._tried.wait(timeout)
        if self._connected:
            return None
        return self._unreachable or f"no answer from the server within {timeout:g} s"

    def close(self, timeout: float = 10.0) -> None:
        self._deadline = time.monotonic() + timeout
        with self._cond:
            self._cond.notify_all()
        super().close(timeout)
        if self._thread.is_alive() or self._sender.is_alive():
            return  # still using the spool and the client; they are left to the process exit
        left = self.spool.pending
        self.spool.close()
        if self._holds_spool:
            self._holds_spool = False
            with _HELD_LOCK:
                _HELD.discard(self.cfg.spool_dir)
        if left:
            log.warning(
                "sink %s: %d line(s) stay in the spool %s; they are sent when streamd starts again",
                self.name, left, self.cfg.spool_dir,
            )  # fmt: skip
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- the writer thread: queue -> sender (memory) or spool (disk) ---------------------------------------

    def _serve(self) -> None:
        if self._spool_later:
            try:
                self._open_spool()
            except StartupError as exc:  # the sink it replaced did not let go of it
                self._fail(str(exc))
                while self._get() is not _CLOSE:
                    self._count_out(1)
                return
        self._sender.start()
        closing = False
        while not closing:
            batch: list[tuple[str, str]] = []
            item = self._get(timeout=0.5)
            while item is not None and len(batch) < self.cfg.batch_size:
                if item is _CLOSE:
                    closing = True
                    break
                batch.append(item)
                item = self._get(timeout=0) if len(batch) < self.cfg.batch_size else None
            if batch:
                self._stage(batch)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._sender.join(max(0.0, self._deadline - time.monotonic()) + self.cfg.timeout_s + 0.5)
        with self._cond:  # what the sender could not deliver waits on disk for the next start
            if self._inflight is not None and self._inflight_src == "mem":
                self._mem.appendleft(self._inflight)  # the spool is empty while memory is used: order kept
                self._inflight = None
            if self._mem:
                self._spill([])

    def _stage(self, batch: list[tuple[str, str]]) -> None:
        with self._cond:
            if not self.spool.pending and self._mem_lines + len(batch) <= self._mem_cap:
                self._mem.append(batch)
                self._mem_lines += len(batch)
            else:
                self._spill(batch)
            self._cond.notify_all()

    def _spill(self, batch: list[tuple[str, str]]) -> None:
        """(Holding the lock.) Memory, then ``batch``, to the spool. A batch the sender has in flight from
        memory goes first: it becomes the spool's head, which the sender takes off once it is acknowledged."""
        records: list[tuple[str, str]] = []
        moved = self._inflight is not None and self._inflight_src == "mem"
        if moved:
            records += self._inflight or []
        for b in self._mem:
            records += b
        self._mem.clear()
        self._mem_lines = 0
        records += batch
        try:
            dropped = self.spool.append(records)
        except OSError as exc:
            lost = len(records) - (len(self._inflight or []) if moved else 0)
            self._count_out(lost)
            self.log_once(
                "spool-write", logging.ERROR, "cannot write the spool (%s); lines dropped and counted",
                exc.strerror or exc,
            )  # fmt: skip
            return
        if moved:
            self._inflight_src, self._inflight_epoch = "spool", self.spool.epoch
        if dropped:
            self._count_out(dropped)
            self.log_once(
                "spool-full", logging.ERROR,
                "the spool reached spool_max_bytes (%d); its oldest lines are dropped and counted",
                self.cfg.spool_max_bytes,
            )  # fmt: skip

    def _count_out(self, n: int) -> None:
        with self._count_lock:
            self._dropped_out += n

    # -- the sender thread: memory or spool -> Redis -------------------------------------------------------

    def _send_main(self) -> None:
        try:
            self._send_loop()
        except Exception as exc:  # a bug here must not leave lines piling up unseen
            log.exception("sink %s: sender thread failed", self.name)
            self._fail(f"{type(exc).__name__}: {exc}")

    def _send_loop(self) -> None:
        self._probe()
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    left = self._inflight is not None or self._mem or self.spool.pending
                    if self._closing and (not left or now >= self._deadline):
                        return
                    if now < self._next_try:
                        self._cond.wait(min(self._next_try, self._deadline) - now)
                        continue
                    if self._inflight is None and left:
                        self._pick()
                    if self._inflight is not None or not self._connected or self.broken:
                        break
                    self._cond.wait(0.5)
                if self.broken:
                    return
                batch = self._inflight
            if batch is None:  # nothing to send while the server is away: is it back?
                self._probe()
                continue
            ok = self._send(batch)
            with self._cond:
                if ok:
                    if self._inflight_src == "spool":
                        self._take_off_spool(len(batch))
                    self._inflight = None
                else:
                    self.resent += len(batch)  # sent again; it may have arrived in part
                    if self._inflight_src == "spool":
                        self._inflight = None  # taken again from the spool's head
                self._cond.notify_all()

    def _pick(self) -> None:
        """(Holding the lock.) The next batch: the spool's oldest lines, else the oldest in memory."""
        if self.spool.pending:
            try:
                self._inflight = self.spool.peek(self.cfg.batch_size)
            except OSError as exc:
                self._fail(f"cannot read the spool {self.cfg.spool_dir}: {exc.strerror or exc}")
                return
            self._inflight_src, self._inflight_epoch = "spool", self.spool.epoch
        elif self._mem:
            self._inflight = self._mem.popleft()
            self._mem_lines -= len(self._inflight)
            self._inflight_src = "mem"

    def _take_off_spool(self, n: int) -> None:
        """(Holding the lock.) The spool's head batch was acknowledged. If the cap deleted it meanwhile
        (the epoch moved), nothing is taken off: it was counted as dropped, and the head now is newer."""
        if self.spool.epoch != self._inflight_epoch:
            return
        if len(self.spool.peek(n)) == n:
            self.spool.commit()
        if not self.spool.pending:
            log.info("sink %s: the spool is empty again; sending from memory", self.name)

    def _send(self, batch: list[tuple[str, str]]) -> bool:
        """One round trip of XADDs; False when the server could not be reached (the batch is not taken)."""
        import redis

        pipe = self._client.pipeline(transaction=False)
        maxlen = self.cfg.maxlen or None
        for stream_id, line in batch:
            key = self.cfg.key.replace("{stream}", stream_id)
            pipe.xadd(key, {"line": line.rstrip("\n"), "node": self.node}, maxlen=maxlen, approximate=True)
        try:
            replies = pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._down(f"{type(exc).__name__}: {exc}")
            return False
        except redis.RedisError as exc:  # e.g. NOAUTH / WRONGPASS: the server answers but refuses us
            self._down(f"refused: {type(exc).__name__}: {exc}")
            return False
        errors = [r for r in replies if isinstance(r, Exception)]
        later = [e for e in errors if _transient(e)]
        if later:  # the server cannot take lines now (full, loading, read-only, not logged in): resend all
            self._down(f"refused for now: {type(later[0]).__name__}: {later[0]}")
            return False
        refused = errors  # e.g. WRONGTYPE: the key holds something else; resending cannot help
        if refused:
            self._count_out(len(refused))
            self.log_once(
                f"refused:{type(refused[0]).__name__}",
                logging.ERROR,
                "the server refused %d line(s) (%s); such lines are dropped and counted",
                len(refused),
                refused[0],
            )
        self.written += len(batch) - len(refused)
        self._up()
        return True

    def _probe(self) -> None:
        """PING: is the server there (wait_usable, the broken flag) before any line needs it?"""
        import redis

        try:
            self._client.ping()
        except redis.RedisError as exc:
            self._down(f"{type(exc).__name__}: {exc}")
        else:
            self._up()

    def _up(self) -> None:
        if not self._connected:
            down = None if self._down_since is None else time.monotonic() - self._down_since
            again = "again " if self._ever_connected else ""
            if down is not None:
                self.reconnects += int(self._ever_connected)
                log.warning(
                    "sink %s: the server answers %safter %.1f s; sending %d spooled line(s) first",
                    self.name, again, down, self.spool.pending,
                )  # fmt: skip
            else:
                log.info("sink %s: connected", self.name)
            self._ever_connected = True
        self._connected, self._unreachable, self._down_since = True, None, None
        self._delay, self._next_try = _FIRST_RETRY_S, 0.0
        self._tried.set()

    def _down(self, why: str) -> None:
        """Log once per outage; retry with backoff."""
        if self._connected or self._unreachable is None:
            self._down_since = time.monotonic()
            log.error(
                "sink %s: the server cannot take lines (%s); they go to the spool %s (up to %d bytes), "
                "retrying with backoff up to %g s",
                self.name, why, self.cfg.spool_dir, self.cfg.spool_max_bytes, self.cfg.retry_max_s,
            )  # fmt: skip
        self._connected, self._unreachable = False, why
        self._next_try = time.monotonic() + self._delay
        self._delay = min(self._delay * 2, self.cfg.retry_max_s)
        self._tried.set()

    def stats(self) -> dict:
        """``queued``: every line not yet acknowledged (queue, memory, spool); ``broken`` while the server
        cannot be reached."""
        inflight = self._inflight
        in_flight = len(inflight) if inflight is not None and self._inflight_src == "mem" else 0
        return {
            **super().stats(),
            "queued": self.queued + self._mem_lines + self.spool.pending + in_flight,
            "broken": self.broken or self._unreachable,
            "connected": self._connected,
            "reconnects": self.reconnects,
            "spooled": self.spool.pending,
            "spool_bytes": self.spool.size,
            "spool_dropped": self.spool.dropped,
            "resent": self.resent,
        }
