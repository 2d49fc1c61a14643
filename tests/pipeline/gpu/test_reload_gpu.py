"""A reload disturbs nothing else, on the GPU path (torch engine, NVDEC when PyNvVideoCodec is there, two
worker processes): five reloads add, change and remove a stream beside 16 live streams; the untouched
streams show no gap and no pts jump over two frame periods (``tests/test_reload_untouched.py``)."""

from __future__ import annotations

import pytest

from tests.pipeline.gpu.test_gpu_pipeline_gpu import _cuda_reason
from tests.test_reload_untouched import run_reloads

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_cuda_reason() is not None, reason=str(_cuda_reason()))]


def test_reloads_never_pause_the_untouched_streams_on_the_gpu(tmp_path, assets) -> None:
    settings = (
        "engine:\n  type: torch\n  precision: fp16\n  max_batch: 16\n  compile: false\n"
        "pipeline:\n  workers: 2\n  batch_size: 16\n  spare_worker: false\n"
    )
    run_reloads(tmp_path, untouched=16, settings=settings)
