"""The messages between the supervisor and a worker process, both ways, as typed values over one pipe.

    worker -> supervisor   ``Ready`` once built (again after ``Adopt``) · ``Lines`` per batch ·
                           ``WorkerStats`` at least once a second, also while held (the supervisor's sign
                           of life) · ``StartFailed`` when it cannot start · ``StreamsEdited`` after an
                           ``EditStreams`` · ``FrameJpeg`` after a ``SnapshotRequest`` · ``ClipStarted``
                           after a ``ClipRequest`` · ``Done`` at the end
    supervisor -> worker   ``Go`` start the streams (first start: once every worker is built) · ``Adopt`` a
                           spare takes over a dead worker's streams, then starts · ``EditStreams`` a reload
                           removes, changes or adds streams in place (the others never pause) · ``Stop``
                           drain and finish · ``Abort`` finish now · ``SnapshotRequest`` a JPEG of a stream's
                           latest frame for the status page · ``ClipRequest`` a clip (the control API)

Each side dispatches on the message's type (``match``). A stream's counters (``StreamCounters``) and latency
histograms add up (``StreamTotals``), so the supervisor sums them over every process that carried the stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import NamedTuple

from streamd.config import StreamConfig
from streamd.latency import Histograms, add_histograms


class Record(NamedTuple):
    """One finished frame as it travels to the supervisor: the line, and where the stream stands after it."""

    stream_id: str
    frame: int
    pts: float | None
    wall_time: float
    line: str


@dataclass(frozen=True)
class Resume:
    """Where a stream continues in another process: next frame index, last pts and its wall time."""

    index: int
    pts: float | None
    wall_time: float


@dataclass(frozen=True)
class StreamCounters:
    """A stream's counters in one process; ``+`` sums them over the processes that carried the stream."""

    decoded: int = 0
    skipped: int = 0  # decoded, not sent to the detector (detect_fps)
    decode_errors: int = 0
    read_errors: int = 0
    reconnects: int = 0
    stalls: int = 0
    dropped: int = 0  # decoded, dropped after decode because the pipeline was behind
    inferred: int = 0  # went through the detector

    def __add__(self, other: StreamCounters) -> StreamCounters:
        return StreamCounters(*(getattr(self, n) + getattr(other, n) for n in COUNTER_NAMES))

    def as_dict(self) -> dict[str, int]:
        return {n: getattr(self, n) for n in COUNTER_NAMES}


COUNTER_NAMES = tuple(f.name for f in fields(StreamCounters))

Crossings = dict[tuple[str, str, str], int]
"""Line crossings of a stream per (line, class label, direction "in" | "out") (``streams[].lines``)."""


def add_crossings(a: Mapping[tuple[str, str, str], int], b: Mapping[tuple[str, str, str], int]) -> Crossings:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


@dataclass(frozen=True)
class StreamTotals:
    """What adds up over every process that carried a stream: its counters, latency histograms and line
    crossings."""

    counters: StreamCounters = StreamCounters()
    latency: Histograms = field(default_factory=dict)
    crossings: Crossings = field(default_factory=dict)

    def __add__(self, other: StreamTotals) -> StreamTotals:
        return StreamTotals(
            self.counters + other.counters,
            add_histograms(self.latency, other.latency),
            add_crossings(self.crossings, other.crossings),
        )


def fold(into: dict[str, StreamTotals], more: Mapping[str, StreamTotals]) -> dict[str, StreamTotals]:
    """Add ``more``'s totals to ``into``'s, per stream id; returns ``into``."""
    for sid, totals in more.items():
        before = into.get(sid)
        into[sid] = totals if before is None else before + totals
    return into


@dataclass(frozen=True)
class StreamReport:
    """One stream as its worker sees it (part of ``WorkerStats``)."""

    state: str  # starting | running | reconnecting | no_decoder | stalled | ended | failed | removed
    counters: StreamCounters = StreamCounters()
    latency: Histograms = field(default_factory=dict)
    fps: float = 0.0  # results per second over the last window
    decode_fps: float = 0.0
    behind: bool = False  # a live stream behind real time (decoding under its rate, or dropping)
    decoder: str = ""
    last_error: str = ""
    last_packet_age_s: float | None = None  # when the worker sent it
    nominal_fps: float = 0.0  # the source's own frame rate (0: unknown)
    crossings: Crossings = field(default_factory=dict)  # streams[].lines, since this process took it

    @property
    def totals(self) -> StreamTotals:
        return StreamTotals(self.counters, self.latency, self.crossings)


@dataclass(frozen=True)
class WorkerStats:
    """A worker's counters: its pipeline's and each stream's (also of streams a reload removed from it)."""

    results: int = 0
    batches: int = 0
    frames: int = 0
    batch_size: int | None = None  # None: not reported yet
    early_batches: int = 0  # sent before they were full (batch timeout or every stream in)
    error: str | None = None  # a stage failed
    per_stream: dict[str, StreamReport] = field(default_factory=dict)

    def totals(self) -> dict[str, StreamTotals]:
        return {sid: s.totals for sid, s in self.per_stream.items()}

    def running(self) -> bool:
        """Some stream of this worker is running."""
        return any(s.state == "running" for s in self.per_stream.values())


# -- worker -> supervisor ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineBeat:
    """engine.shared: the engine process, once a second: batches run so far, their rows (the workers' batches
    it merged), and Submits waiting or in flight (no batch for long while some wait: the engine is wedged, and
    the supervisor kills it)."""

    batches: int
    waiting: int
    rows: int = 0


@dataclass(frozen=True)
class Ready:
    pid: int
    engine: str
    gpu: bool  # the engine runs on a GPU
    decoder: str


@dataclass(frozen=True)
class Lines:
    records: list[Record]  # one batch, each stream's frames in order


@dataclass(frozen=True)
class StartFailed:
    code: int  # the exit status it stands for (streamd.exitcodes)
    message: str


@dataclass(frozen=True)
class StreamsEdited:
    removed: list[str]
    refused: list[str]  # not taken (every stream of the worker had ended): to be started elsewhere


@dataclass(frozen=True)
class FrameJpeg:
    stream_id: str
    jpeg: bytes | None


@dataclass(frozen=True)
class ClipStarted:
    stream_id: str
    path: str | None  # the clip's file; None: nothing buffered yet, or no clips (with api in on) there


@dataclass(frozen=True)
class Done:
    failed: bool  # a stage failed or a stream gave up


# -- supervisor -> worker ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Go:
    pass


@dataclass(frozen=True)
class Adopt:
    streams: tuple[StreamConfig, ...]
    resume: dict[str, Resume]


@dataclass(frozen=True)
class EditStreams:
    remove: list[str]
    upsert: tuple[StreamConfig, ...]  # started, or replacing the running stream of the same id
    resume: dict[str, Resume]  # where an upserted stream new to this worker continues


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Abort:
    pass


@dataclass(frozen=True)
class SnapshotRequest:
    stream_id: str


@dataclass(frozen=True)
class ClipRequest:
    stream_id: str


ToSupervisor = Ready | Lines | WorkerStats | StartFailed | StreamsEdited | FrameJpeg | ClipStarted | Done
ToWorker = Go | Adopt | EditStreams | Stop | Abort | SnapshotRequest | ClipRequest
