"""YOLOX-s through Megvii's own export path (the steps of YOLOX's tools/export_onnx.py, run as a library).

The official `yolox` package supplies the experiment (`get_exp(None, "yolox-s")`), the model, `replace_module`
and the export-friendly `SiLU`; this module only strings those calls together, with random weights instead of
a checkpoint. `yolox` from PyPI is an sdist that compiles a COCO-eval op at install; where that is not wanted
(the GPU box), the sdist's tree is put on sys.path as is (`ensure_importable`).
"""

from __future__ import annotations

import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from .common import Built, calibrate_batchnorm, seed_everything, shift_score_bias

PACKAGES = ("yolox", "torch", "onnx", "onnxslim")
NOTES = (
    "output [B, A, 5+80] (decode_in_inference=False): cols 0-1 x,y = grid-cell offset (undecoded: "
    "(x + grid_x) * stride gives the centre in input pixels), cols 2-3 = log-space w,h (exp(w) * stride), "
    "col 4 objectness already sigmoid, cols 5.. class scores already sigmoid; score = obj * cls; rows "
    "ordered stride 8 then 16 then 32, each row-major (y outer, x inner); A = (S/8)^2+(S/16)^2+(S/32)^2"
)
BGR_255 = "images: float32 [B,3,H,W], BGR, 0..255, no mean/std (YOLOX >= 0.2 preprocessing, legacy=False)"
TINY_WIDTH = "0.125"
CALIBRATION = "BatchNorm statistics from vtest.mp4 frames 0,25,..,375 (zoo/common.py calibrate_batchnorm)"


def ensure_importable(sdist_dir: Path) -> None:
    """Use an installed `yolox`, else the Megvii sdist (yolox-*.tar.gz) in `sdist_dir`, unpacked once."""
    try:
        import yolox  # noqa: F401

        return
    except ImportError:
        pass
    archives = sorted(sdist_dir.glob("yolox-*.tar.gz"))
    if not archives:
        raise SystemExit(
            f"yolox is not installed and no yolox-*.tar.gz is in {sdist_dir}: see tools/zoo_wheels.txt"
        )
    root = sdist_dir / archives[-1].name.removesuffix(".tar.gz")
    if not (root / "yolox").is_dir():
        with tarfile.open(archives[-1]) as tar:
            tar.extractall(sdist_dir, filter="data")
    sys.path.insert(0, str(root))


def build(
    size: int, tiny: bool, seed: int, out: Path, static_batch: int | None, sdist_dir: Path, score_shift: float
) -> list[Built]:
    ensure_importable(sdist_dir)
    import torch
    from torch import nn
    from yolox.exp import get_exp
    from yolox.models.network_blocks import SiLU
    from yolox.utils import replace_module

    from . import probe

    out.mkdir(parents=True, exist_ok=True)
    stem = f"yolox-s{'-tiny' if tiny else ''}-{size}"
    built: list[Built] = []
    for dynamic in (True, False) if static_batch else (True,):
        start = time.perf_counter()
        seed_everything(seed)
        exp = get_exp(None, "yolox-s")
        opts = ["width", TINY_WIDTH] if tiny else []
        exp.merge(opts)  # the export script's command-line overrides (strings, cast by the experiment)
        exp.test_size = (size, size)  # merge() would cast a "(h, w)" string to a tuple of characters
        model = exp.get_model()
        model.eval()
        calibrate_batchnorm(model, probe.calibration_images(size, "bgr255"))
        if score_shift:  # objectness and class branches both start at the 0.01 prior; score = obj * cls
            shift_score_bias(model.head, ("cls_preds", "obj_preds"), score_shift)
        model = replace_module(model, nn.SiLU, SiLU)
        model.head.decode_in_inference = False
        batch = 1 if dynamic or not static_batch else static_batch
        dummy = torch.randn(batch, 3, exp.test_size[0], exp.test_size[1])
        target = out / f"{stem}-{'dyn' if dynamic else f'b{static_batch}'}.onnx"
        torch.onnx.export(
            model,
            (dummy,),
            str(target),
            input_names=["images"],
            output_names=["output"],
            dynamic_axes={"images": {0: "batch"}, "output": {0: "batch"}} if dynamic else None,
            opset_version=11,
            dynamo=False,  # the TorchScript exporter YOLOX's script calls (torch.onnx._export)
        )
        _simplify(target)
        decode_error = _check_raw_layout(
            model, dummy.new_tensor(probe.calibration_images(size, "bgr255")[:2])
        )
        built.append(
            Built(
                family="yolox-s",
                variant="dynamic" if dynamic else f"static-b{static_batch}",
                path=target,
                exporter="YOLOX tools/export_onnx.py steps: get_exp(None, 'yolox-s').merge("
                f"{opts!r}), test_size=({size}, {size}); replace_module(SiLU); "
                "head.decode_in_inference=False; torch.onnx.export(opset 11, "
                f"input 'images', output 'output'{', dynamic batch' if dynamic else ''}); onnxslim",
                packages=PACKAGES,
                input_layout=BGR_255,
                output_notes=NOTES,
                build_s=time.perf_counter() - start,
                extra={
                    "bn_calibration": CALIBRATION,
                    "score_shift": score_shift,
                    "raw_layout_check": f"max |NOTES decode - YOLOX's decode| = {decode_error:.2g}",
                },
            )
        )
    return built


def _check_raw_layout(model: Any, images: Any) -> float:
    """Decode the raw output as NOTES says; compare with YOLOX's own decode_in_inference=True output."""
    import torch

    head = model.head
    with torch.no_grad():
        head.decode_in_inference = False
        raw = model(images)
        head.decode_in_inference = True
        decoded = model(images)
        head.decode_in_inference = False
    size = images.shape[-1]
    grids, strides = [], []
    for stride in (8, 16, 32):
        n = size // stride
        ys, xs = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        grids.append(torch.stack((xs, ys), dim=-1).reshape(-1, 2))
        strides.append(torch.full((n * n, 1), stride))
    grid, stride_col = torch.cat(grids).float(), torch.cat(strides).float()
    mine = torch.cat(
        [(raw[..., :2] + grid) * stride_col, torch.exp(raw[..., 2:4]) * stride_col, raw[..., 4:]], dim=-1
    )
    return float((mine - decoded).abs().max())


def _simplify(path: Path) -> None:
    """YOLOX runs onnx-simplifier after export; onnxsim has no wheel for current Pythons, so onnxslim (the
    simplifier Ultralytics uses) does the same job: constant folding and dead-node removal."""
    import onnx
    import onnxslim

    onnx.save(onnxslim.slim(onnx.load(str(path))), str(path))
