"""The torch engine keeps converted models CUDA-graph-capturable: shape arithmetic on the host, the host
values device ops read copied once and kept (``streamd.engines.torch``), checked on the CPU by
``tools/torch_graph_audit.py`` over the zoo's transformer and CNN families."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ZOO = Path(__file__).resolve().parents[1] / "data" / "zoo"


def _audit(name: str, copies: bool = True) -> list[tuple[str, str, str]]:
    from tools.torch_graph_audit import audit

    return audit(ZOO / name, (160, 160), copies=copies)


@pytest.mark.parametrize(
    "name",
    ["rtdetr-l-tiny-160-dyn.onnx", "yolov8s-tiny-160-dyn.onnx", "yolox-s-tiny-160-dyn.onnx",
     "tfod-ssdlite-tiny-160.onnx", "ssdlite-tiny-160-batched.onnx", "yolov10s-tiny-160-dyn.onnx"],
)  # fmt: skip
def test_zoo_models_have_nothing_a_cuda_graph_cannot_capture(torch_ready, name: str) -> None:
    assert _audit(name) == []


def test_rtdetr_needs_the_kept_device_copy(torch_ready) -> None:
    """RT-DETR's top-k gather adds batch offsets (Range over the batch size × 525, shape arithmetic) to
    device indices: without the kept copy that host value meets a device op (eager fails, capture too)."""
    found = _audit("rtdetr-l-tiny-160-dyn.onnx", copies=False)
    assert found and all("host tensor" in what for _, _, what in found), found


def test_ssdlite_needs_its_scalar_gather_indices_on_the_host(torch_ready, monkeypatch) -> None:
    """torchvision's box decoding gathers with 0-dim constant indices (``boxes[:, 0]``): on the device each
    is read back as a Python int during the forward pass — the sync that made capture fail on the H200
    (``gather_1``, "operation not permitted when stream is capturing")."""
    import streamd.engines.torch_place as engine_torch

    monkeypatch.setattr(engine_torch, "_reads_scalar_index", lambda *args: False)
    found = _audit("ssdlite-tiny-160-batched.onnx")
    assert found and {kind for _, kind, _ in found} == {"OnnxGather"}, found
