"""The CUDA-graph cache shared by the torch and TensorRT engines (plain Python: runs without a GPU)."""

from __future__ import annotations

from streamd.gpu.graph_cache import GraphCache


def test_oldest_graph_is_released_beyond_the_limit() -> None:
    released: list[str] = []
    cache: GraphCache[str] = GraphCache(released.append, limit=2)
    cache.add((1, 10, 20), "a")
    cache.add((2, 10, 20), "b")
    cache.add((4, 10, 20), "c")
    assert released == ["a"] and len(cache) == 2
    assert cache.get((1, 10, 20)) is None and cache.get((4, 10, 20)) == "c"
    cache.clear()
    cache.clear()
    assert released == ["a", "b", "c"] and len(cache) == 0


def test_failures_are_remembered_per_scope() -> None:
    cache: GraphCache[object] = GraphCache()
    cache.fail((8, 123))
    assert cache.failed((8, 123)) and not cache.failed((8, 456)) and not cache.failed(8)
    cache.fail((8, 123))
    cache.fail(4)
    assert cache.failures == 2  # scopes, not attempts
