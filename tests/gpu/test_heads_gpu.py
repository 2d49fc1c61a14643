"""The generic decode kernel (detr, yolox, several outputs) vs the CPU twin, on the device.

Every family of tests/heads_data.py, float32 and float16 rows: same detections (count, classes, boxes at IoU
≥ 0.99, scores within 1e-5). Heads without exp (DETR with given scores, TF, SSD-style) are bit-identical like
the fixed layouts; with exp (YOLOX's grid, sigmoid, softmax) CUDA's expf and numpy's may differ in the last
bit, so those compare within tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamd.stages.postprocess.cpu import CpuPostprocessor, PostprocessSpec
from streamd.stages.postprocess.resolve import resolve_head
from tests.gpu.test_postprocess_gpu import assert_same, box_iou, run_gpu
from tests.heads_data import FAMILIES

pytestmark = pytest.mark.gpu

EXACT = {"detr-one-output", "tf-od-api", "torchvision-ssd", "mapped-xywh"}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generic_kernel_matches_cpu_twin(
    ctx: object, loader: object, stream: object, family: str, dtype: str
) -> None:
    f = FAMILIES[family]
    head = resolve_head(f.settings, f.parts())
    rows = f.rows(np.random.default_rng(len(family)), 6)
    if dtype == "float16":
        rows = rows.astype(np.float16).astype(np.float32)
    spec = PostprocessSpec(head.layout, head.num_classes, 0.3, 0.5, 100, 1000, head=head)
    got = run_gpu(ctx, loader, stream, spec, rows, head.candidates, dtype)
    want = CpuPostprocessor(spec)(rows)
    assert sum(len(d) for d in want) > 0, "the synthetic outputs should give detections"
    if family in EXACT:
        assert_same(got, want, family)
        return
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert len(g) == len(w), f"{family} frame {i}: {len(g)} detections, CPU twin has {len(w)}"
        assert np.array_equal(g.class_id, w.class_id), f"{family} frame {i}: classes differ"
        if len(g):
            assert box_iou(g.xyxy, w.xyxy).min() >= 0.99
            np.testing.assert_allclose(g.score, w.score, rtol=1e-5, atol=1e-7)
