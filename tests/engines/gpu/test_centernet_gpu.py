"""Issue 13 acceptance on the GPU: the TF-exported end2end CenterNet (models/centernet-mbv3-coco.onnx,
tf2onnx, [1, 100, 6], batch 1) through the torch engine on CUDA matches ONNX Runtime CPU on 120 real vtest
frames: ≥ 99 % of the CPU detections scoring above threshold + 0.05 reproduced at IoU ≥ 0.95, per-output error
within the documented tolerance (streamd.checks.verify.TOLERANCES); the start-up check passes, reports its
cost, and is skipped on a warm start; the conversion without streamd's Resize rewrite is refused at start-up.
Results (JSON) go to ``$STREAMD_RESULTS`` if set. Skipped without CUDA, torch or onnx2torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("onnx2torch")

from bench.bench_centernet import MODEL, PRE, agreement, read_frames, reference  # noqa: E402
from streamd.checks.verify import (  # noqa: E402
    VerificationError,
    VerifyPlan,
    compare,
    create_engine,
)
from streamd.engines import Machine  # noqa: E402
from streamd.stages.postprocess.cpu import PostprocessSpec  # noqa: E402

pytestmark = pytest.mark.gpu
THRESHOLD = 0.3
POST = PostprocessSpec("end2end", 80, THRESHOLD)
PLAN = VerifyPlan(True, PRE, POST, MODEL.name)


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    batch = read_frames(120)
    assert len(batch) >= 100
    return batch, reference(batch)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_centernet_torch_cuda_matches_onnxruntime(data, precision, tmp_path):
    batch, ref = data
    engine = create_engine(
        "torch", MODEL, max_batch=1, precision=precision, device=0, cache_dir=tmp_path, verify=PLAN
    )
    cold = engine.verification
    got = np.concatenate([engine.infer(batch[i : i + 1]) for i in range(len(batch))])
    engine.close()
    warm_engine = create_engine(
        "torch", MODEL, max_batch=1, precision=precision, device=0, cache_dir=tmp_path, verify=PLAN
    )
    warm = warm_engine.verification
    warm_engine.close()
    errors, _ = compare(ref, got, precision=precision, output_name="tower_0/detections", postprocess=POST)
    agree = agreement(ref, got, THRESHOLD)
    result = {
        "precision": precision,
        **agree,
        "max_abs": errors[0].max_abs,
        "mean_abs": errors[0].mean_abs,
        "output_pass": errors[0].passed,
        "check_ms": cold["cost_ms"],
        "warm_cached": warm["cached"],
    }
    print(json.dumps(result))
    if os.environ.get("STREAMD_RESULTS"):
        path = Path(os.environ["STREAMD_RESULTS"]) / f"centernet_gpu_{precision}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
    assert cold["passed"] and not cold["cached"] and cold["cost_ms"] > 0
    assert warm["cached"] and warm["passed"]
    assert agree["cpu_detections"] >= 100
    assert agree["matched"] >= 0.99, result
    assert errors[0].passed, result


def test_centernet_before_the_fix_is_refused_and_auto_falls_back(tmp_path, monkeypatch):
    from streamd.engines import torch_ops

    monkeypatch.setattr(torch_ops, "rewrite_for_torch", lambda model: (model, []))
    with pytest.raises(VerificationError, match="tower_0/detections"):
        create_engine(
            "torch", MODEL, max_batch=1, precision="fp16", device=0, cache_dir=tmp_path, verify=PLAN
        )
    torch_box = Machine(tensorrt=False, torch_cuda=True)  # auto: torch first, then ONNX Runtime
    engine = create_engine(
        "auto",
        MODEL,
        max_batch=1,
        precision="fp16",
        device=0,
        cache_dir=tmp_path,
        verify=PLAN,
        machine=torch_box,
    )
    assert engine.name == "onnxruntime-cpu"
    engine.close()
