"""Per-stage latency histograms of a stream: filled on the worker per frame result, shipped as plain data
with its stats, summed by the supervisor and exported by ``supervisor.metrics`` (no prometheus here)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

LATENCY_STAGES = ("decode", "queue", "preprocess", "infer", "postprocess", "batch", "total", "arrival")
LATENCY_BUCKETS_MS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)


@dataclass(frozen=True)
class StageHistogram:
    """One stage's histogram: ``counts`` per bucket of ``LATENCY_BUCKETS_MS`` then +Inf (not cumulative),
    ``sum`` in milliseconds, ``count`` observations; ``+`` adds two (e.g. of two processes)."""

    counts: tuple[int, ...]
    sum: float
    count: int

    def __add__(self, other: StageHistogram) -> StageHistogram:
        counts = tuple(a + b for a, b in zip(self.counts, other.counts, strict=True))
        return StageHistogram(counts, self.sum + other.sum, self.count + other.count)

    def to_dict(self) -> dict:
        """The form ``/metrics`` and the status page read: ``{"counts": [...], "sum": ms, "count": n}``."""
        return {"counts": list(self.counts), "sum": self.sum, "count": self.count}


Histograms = dict[str, StageHistogram]  # stage -> histogram; stages without an observation are absent


def add_histograms(a: Mapping[str, StageHistogram], b: Mapping[str, StageHistogram]) -> Histograms:
    """Stage by stage, ``a + b`` (a new mapping; neither argument changes)."""
    out = dict(a)
    for stage, h in b.items():
        out[stage] = out[stage] + h if stage in out else h
    return out


def histograms_to_dict(histograms: Mapping[str, StageHistogram]) -> dict[str, dict]:
    return {stage: h.to_dict() for stage, h in histograms.items()}


class LatencyHistograms:
    """Per-stage latency histograms of one stream (milliseconds, buckets ``LATENCY_BUCKETS_MS``).

    Fed on the worker, per frame result: ``observe(result.latency_ms)``. ``snapshot()`` is the value that
    travels in the stats message; ``to_dict()`` its plain form, ``{stage: {"counts": [per bucket, then
    +Inf], "sum": ms, "count": n}}``."""

    def __init__(self, stages: tuple[str, ...] = LATENCY_STAGES) -> None:
        self._stages = stages
        self._counts = {s: [0] * (len(LATENCY_BUCKETS_MS) + 1) for s in stages}
        self._sum = dict.fromkeys(stages, 0.0)
        self._n = dict.fromkeys(stages, 0)
        self._results = 0

    @property
    def results(self) -> int:
        """Frame results observed."""
        return self._results

    def observe(self, latency_ms: Mapping[str, float]) -> None:
        self._results += 1
        for stage, ms in latency_ms.items():
            counts = self._counts.get(stage)
            if counts is None:
                continue
            counts[bisect.bisect_left(LATENCY_BUCKETS_MS, ms)] += 1
            self._sum[stage] += ms
            self._n[stage] += 1

    def snapshot(self) -> Histograms:
        return {
            s: StageHistogram(tuple(self._counts[s]), self._sum[s], self._n[s])
            for s in self._stages
            if self._n[s]
        }

    def to_dict(self) -> dict[str, dict]:
        return histograms_to_dict(self.snapshot())
