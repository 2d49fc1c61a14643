"""An on-disk FIFO of result lines, bounded in bytes: a network sink keeps lines there while its server is
away.

Records are ``stream_id<TAB>line`` (the line is compact JSON, one per record) appended to numbered segment
files (``00000001.spool``, ...). The reader takes records from the oldest segment (``peek``) and moves on only
once they were delivered (``commit``), so a failed send is sent again: delivery is at least once. The read
position is saved in ``head`` (at most every ``SAVE_EVERY_S`` and at close), so a restart resends at most what
was delivered since the last save — duplicates, never gaps. When appending would pass ``max_bytes``, whole
oldest segments are deleted and their unsent records counted as dropped (segments are at most 1/8 of the cap,
so at least 7/8 of the newest lines stay).

Not thread-safe: its user serialises the calls (``pending``/``size`` may be read without). A lock file
(``flock``) keeps a second process from sharing the folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

_SUFFIX = ".spool"
SAVE_EVERY_S = 0.5


class SpoolError(Exception):
    """The spool folder cannot be used (not writable, locked by another process)."""


class Spool:
    def __init__(self, folder: Path, max_bytes: int, segment_bytes: int | None = None) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(64 << 10, min(16 << 20, max_bytes // 8))
        self.dropped = 0  # records deleted unsent because the cap was reached
        self.pending = 0  # records not yet committed
        self.size = 0  # bytes of the segment files on disk
        self.epoch = 0  # +1 whenever the cap deleted unsent records: a peek from before may be gone
        self._counts: dict[int, int] = {}  # segment number -> records written to it
        self._sizes: dict[int, int] = {}
        self._head = (0, 0, 0)  # (segment, byte offset, records consumed in it)
        self._peeked = self._head
        self._out: object = None  # the tail segment, open for appending
        self._lock_fd = -1
        self._saved_at = 0.0

    # -- open/close ------------------------------------------------------------------------------------

    def open(self) -> int:
        """Create or take over the folder; returns how many records an earlier run left in it."""
        try:
            self.folder.mkdir(exist_ok=True)
            self._lock_fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise SpoolError(f"cannot use the spool folder {self.folder}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise SpoolError(f"the spool folder {self.folder} is in use by another process") from None
        segments = sorted(int(p.stem) for p in self.folder.glob("*" + _SUFFIX) if p.stem.isdigit())
        for n in segments:
            self._counts[n], self._sizes[n] = self._scan(n)
        self._head = self._read_head(segments)
        self._peeked = self._head
        for n in [n for n in segments if n < self._head[0]]:  # delivered before the last save
            self._delete(n)
        self.size = sum(self._sizes.values())
        self.pending = sum(self._counts.values()) - self._head[2]
        tail = max(self._counts, default=self._head[0] or 1)
        self._counts.setdefault(tail, 0)
        self._sizes.setdefault(tail, 0)
        if self._head[0] not in self._counts:
            self._head = self._peeked = (min(self._counts), 0, 0)
        self._out = open(self._path(tail), "ab")  # noqa: SIM115 (kept open for appending)
        return self.pending

    def close(self) -> None:
        """Save the read position; an empty spool leaves no segment behind. Safe to call twice."""
        if self._out is not None:
            self._out.close()  # type: ignore[attr-defined]
            self._out = None
            if self.pending == 0:
                for n in list(self._counts):
                    self._delete(n)
                self._head = self._peeked = (0, 0, 0)
            self._save_head(force=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- the FIFO --------------------------------------------------------------------------------------

    def append(self, records: list[tuple[str, str]]) -> int:
        """Add (stream_id, line) records at the end; returns how many records the cap made it drop (the
        oldest unsent ones). Raises OSError when the disk refuses the write (nothing of it is counted)."""
        data = [f"{sid}\t{line.rstrip(chr(10))}\n".encode() for sid, line in records]
        before = self.dropped
        tail = max(self._counts)
        if self._sizes[tail] >= self.segment_bytes:
            tail = self._roll(tail)
        incoming = sum(len(d) for d in data)
        while self.size + incoming > self.max_bytes and len(self._counts) > 1:
            self._drop_oldest()
        while data and self.size + incoming > self.max_bytes:  # one batch larger than what is left
            incoming -= len(data.pop(0))
            self.dropped += 1
        if data:
            blob = b"".join(data)
            self._out.write(blob)  # type: ignore[attr-defined]
            self._out.flush()  # type: ignore[attr-defined]  # in the kernel: survives our own crash
            self._counts[tail] += len(data)
            self._sizes[tail] += len(blob)
            self.size += len(blob)
            self.pending += len(data)
        return self.dropped - before

    def peek(self, n: int) -> list[tuple[str, str]]:
        """Up to ``n`` of the oldest records (of one segment), not taken off; ``commit`` takes them off."""
        seg, offset, used = self._head
        while used >= self._counts.get(seg, 0) and seg < max(self._counts):  # a finished segment
            self._delete(seg)
            seg, offset, used = min(self._counts), 0, 0
            self._head = self._peeked = (seg, offset, used)
            self._save_head(force=True)
        out: list[tuple[str, str]] = []
        if used >= self._counts.get(seg, 0):
            return out
        with open(self._path(seg), "rb") as f:
            f.seek(offset)
            while len(out) < n and used < self._counts[seg]:
                raw = f.readline()
                sid, _, line = raw.decode("utf-8", "replace").rstrip("\n").partition("\t")
                out.append((sid, line))
                offset += len(raw)
                used += 1
        self._peeked = (seg, offset, used)
        return out

    def commit(self) -> None:
        """The records of the last ``peek`` were delivered."""
        taken = self._peeked[2] - self._head[2] if self._peeked[0] == self._head[0] else 0
        self._head = self._peeked
        self.pending -= taken
        if self.pending == 0:  # all delivered: start a fresh segment, so delivered bytes leave the disk
            self._reset()
        self._save_head()

    # -- inside ----------------------------------------------------------------------------------------

    def _path(self, n: int) -> Path:
        return self.folder / f"{n:08d}{_SUFFIX}"

    def _roll(self, tail: int) -> int:
        self._out.close()  # type: ignore[attr-defined]
        new = tail + 1
        self._out = open(self._path(new), "ab")  # noqa: SIM115 (kept open for appending)
        self._counts[new] = self._sizes[new] = 0
        return new

    def _reset(self) -> None:
        tail = self._roll(max(self._counts))
        for n in [n for n in self._counts if n != tail]:
            self._delete(n)
        self._head = self._peeked = (tail, 0, 0)
        self._save_head(force=True)

    def _drop_oldest(self) -> None:
        seg = min(self._counts)
        unsent = self._counts[seg] - (self._head[2] if self._head[0] == seg else 0)
        self.dropped += unsent
        self.pending -= unsent
        self.epoch += 1
        self._delete(seg)
        nxt = min(self._counts)
        self._head = self._peeked = (nxt, 0, 0)
        self._save_head(force=True)

    def _delete(self, n: int) -> None:
        self._counts.pop(n, None)
        self.size -= self._sizes.pop(n, 0)
        with contextlib.suppress(FileNotFoundError):
            self._path(n).unlink()

    def _scan(self, n: int) -> tuple[int, int]:
        """Records and bytes of a segment; a record cut short by a crash mid-write is cut off."""
        path = self._path(n)
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            log.warning("spool %s: cut off a partial record at the end of %s", self.folder, path.name)
            os.truncate(path, end)
        return data.count(b"\n", 0, end), end

    def _read_head(self, segments: list[int]) -> tuple[int, int, int]:
        try:
            seg, offset, used = (int(x) for x in (self.folder / "head").read_text().split())
        except (OSError, ValueError):
            return (segments[0], 0, 0) if segments else (0, 0, 0)
        if seg not in self._counts or offset > self._sizes[seg] or used > self._counts[seg]:
            return (segments[0], 0, 0) if segments else (0, 0, 0)
        return seg, offset, used

    def _save_head(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at = now
        tmp = self.folder / "head.tmp"
        try:
            tmp.write_text("{} {} {}\n".format(*self._head))
            os.replace(tmp, self.folder / "head")
        except OSError as exc:  # only costs duplicates after a restart
            log.warning("spool %s: cannot save the read position: %s", self.folder, exc.strerror or exc)
