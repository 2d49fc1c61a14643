"""The CUDA graphs an engine captured, shared by ``TorchEngine`` and ``TensorRTEngine``.

One graph per (batch, input pointer, output pointer): a graph replays the exact addresses it captured, and
the pipeline's slot buffers are few and long-lived, so a few graphs per slot cover every call. At most
``limit`` are kept; beyond that the oldest is dropped (``release`` frees it). A capture that fails is
remembered per ``scope`` (what the engine says makes it fail again: a batch size, a (batch, stream) pair) so
it is not retried on every call. Plain Python: no CUDA here; the engine captures, launches and frees.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

G = TypeVar("G")
GraphKey = tuple[int, int, int]  # (batch, input pointer, output pointer)
MAX_GRAPHS = 512


class GraphCache(Generic[G]):
    def __init__(self, release: Callable[[G], None] | None = None, limit: int = MAX_GRAPHS) -> None:
        self._graphs: dict[GraphKey, G] = {}
        self._failed: set[Hashable] = set()
        self._release = release
        self.limit = limit

    def get(self, key: GraphKey) -> G | None:
        return self._graphs.get(key)

    def add(self, key: GraphKey, graph: G) -> None:
        if len(self._graphs) >= self.limit:
            self._free(self._graphs.pop(next(iter(self._graphs))))
        self._graphs[key] = graph

    def failed(self, scope: Hashable) -> bool:
        """True once a capture in ``scope`` failed: run without a graph there."""
        return scope in self._failed

    def fail(self, scope: Hashable) -> None:
        self._failed.add(scope)

    @property
    def failures(self) -> int:
        """How many scopes failed to capture."""
        return len(self._failed)

    def clear(self) -> None:
        """Drop (and release) every graph; safe to call twice."""
        graphs, self._graphs = list(self._graphs.values()), {}
        for graph in graphs:
            self._free(graph)

    def __len__(self) -> int:
        return len(self._graphs)

    def _free(self, graph: G) -> None:
        if self._release is not None:
            self._release(graph)
