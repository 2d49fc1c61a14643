"""Per-stage latency histograms of a stream: filled on the worker per frame result, shipped as plain data
with its stats, summed by the supervisor and exported by ``supervisor.metrics`` (no prometheus here)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping

LATENCY_STAGES = ("decode", "queue", "preprocess", "infer", "postprocess", "batch", "total", "arrival")
LATENCY_BUCKETS_MS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)


class LatencyHistograms:
    """Per-stage latency histograms of one stream (milliseconds, buckets ``LATENCY_BUCKETS_MS``).

    Fed on the worker, per frame result: ``observe(result.latency_ms)``. ``to_dict()`` is plain data for the
    stats message: ``{stage: {"counts": [per bucket, then +Inf], "sum": ms, "count": n}}`` (counts are per
    bucket, not cumulative)."""

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

    def to_dict(self) -> dict[str, dict]:
        return {
            s: {"counts": list(self._counts[s]), "sum": self._sum[s], "count": self._n[s]}
            for s in self._stages
            if self._n[s]
        }
