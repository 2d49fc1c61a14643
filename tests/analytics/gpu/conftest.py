"""GPU fixtures for the analytics tests: the same CUDA context, kernel loader and stream as tests/gpu (each
skips cleanly without a usable GPU)."""

from tests.gpu.conftest import ctx, loader, stream

__all__ = ["ctx", "loader", "stream"]
