"""GPU fixtures. Without a usable CUDA GPU (no cuda.bindings, no driver, no device) every test here is
skipped with the reason. Kernels compile into a per-session temporary cubin cache."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamd.gpu.cuda import gpu_available


@pytest.fixture(scope="session")
def ctx() -> Iterator[object]:
    ok, why = gpu_available()
    if not ok:
        pytest.skip(f"no usable CUDA GPU: {why}")
    from streamd.gpu.cuda import Context

    context = Context(0)
    yield context
    context.synchronize()
    context.close()


@pytest.fixture(scope="session")
def loader(ctx: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from streamd.gpu.kernels import KernelLoader

    kernel_loader = KernelLoader(ctx, cache_dir=tmp_path_factory.mktemp("cubins"))  # type: ignore[arg-type]
    yield kernel_loader
    kernel_loader.close()


@pytest.fixture()
def stream(ctx: object) -> Iterator[object]:
    from streamd.gpu.cuda import Stream

    s = Stream(ctx)  # type: ignore[arg-type]
    yield s
    s.synchronize()
    s.close()
