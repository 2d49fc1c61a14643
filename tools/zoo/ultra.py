"""Ultralytics families: YOLOv8 / YOLO11 (raw head), YOLO26 / YOLOv10 (NMS-free end-to-end head), RT-DETR.

Each model is built from the model YAML shipped inside the `ultralytics` package (random init, no .pt
download) and exported with Ultralytics' own `model.export(format="onnx", ...)`, exactly as a user would.
`--tiny` keeps the same YAML and export call and only swaps the compound-scaling row (depth, width, max
channels) for a small one.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import Built, calibrate_batchnorm, scratch_dir, seed_everything, shift_score_bias

PACKAGES = ("ultralytics", "torch", "torchvision", "onnx", "onnxslim")
CALIBRATION = "BatchNorm statistics from vtest.mp4 frames 0,25,..,375 (zoo/common.py calibrate_batchnorm)"
RGB_01 = "images: float32 [B,3,H,W], RGB, 0..1 (pixel / 255), letterboxed to HxW, no mean/std"


@dataclass(frozen=True)
class UltraFamily:
    name: str
    yaml: str  # model YAML inside the ultralytics package
    detr: bool = False  # RTDETR(...) instead of YOLO(...)
    end2end: bool = False  # export with nms=False: Ultralytics' switch for the NMS-free one-to-one head
    raw_detr: bool = False  # RT-DETR without the head's top-k step: [B, queries, 4 + classes]
    notes: str = ""


FAMILIES = {
    f.name: f
    for f in (
        UltraFamily(
            "yolov8s",
            "yolov8s.yaml",
            notes="output0 [B, 4+80, A]: rows 0-3 box cx,cy,w,h in input pixels, rows 4.. class scores "
            "already sigmoid (no objectness); A = (S/8)^2+(S/16)^2+(S/32)^2; NMS is the consumer's job",
        ),
        UltraFamily("yolo11s", "yolo11s.yaml", notes="same layout as yolov8s"),
        UltraFamily(
            "yolo26s",
            "yolo26s.yaml",
            end2end=True,
            notes="output0 [B, 300, 6]: x1,y1,x2,y2 in input pixels, score (sigmoid), class index (float); "
            "NMS-free one-to-one head, top-300 by score, no NMS needed",
        ),
        UltraFamily("yolov10s", "yolov10s.yaml", end2end=True, notes="same layout as yolo26s"),
        UltraFamily(
            "rtdetr-l",
            "rtdetr-l.yaml",
            detr=True,
            notes="output0 [B, 300, 6] (this Ultralytics version): cx,cy,w,h normalised 0..1, score "
            "(sigmoid), class index (float); the head's own top-300 over queries x classes, so one query "
            "can appear with several classes; no NMS needed",
        ),
        UltraFamily(
            "rtdetr-l-raw",
            "rtdetr-l.yaml",
            detr=True,
            raw_detr=True,
            notes="output0 [B, 300, 4+80]: per query cx,cy,w,h normalised 0..1, then 80 class scores already "
            "sigmoid; the layout of Ultralytics <= 8.3 RT-DETR exports (and of DETR-family exports in "
            "general): the same model as rtdetr-l with its head's top-k step bypassed (zoo/ultra.py "
            "_keep_all_queries); no NMS needed",
        ),
    )
}

# Tiny rows for the `scales:` block: [depth, width, max_channels]. Width 1/16 keeps the files near 1 MB.
TINY_SCALE = [0.33, 0.0625, 1024]
TINY_DETR_WIDTH = 0.125


def _tiny_yaml(family: UltraFamily, workdir: Path) -> Path:
    """Write the package's model YAML with only a tiny `scales` row; the file name carries no scale letter so
    Ultralytics picks that row (it guesses the scale from names like yolov8s.yaml)."""
    import yaml
    from ultralytics.nn.tasks import yaml_model_load

    cfg: dict[str, Any] = dict(yaml_model_load(family.yaml))
    cfg.pop("scale", None)
    cfg.pop("yaml_file", None)
    cfg["scales"] = {"t": _scale(family)}
    if family.detr:
        _shrink_detr(cfg, TINY_DETR_WIDTH)
    path = workdir / f"zoo-tiny-{re.sub(r'-?[nslmx]$', '', Path(family.yaml).stem)}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _scale(family: UltraFamily) -> list[float]:
    return [TINY_SCALE[0], TINY_DETR_WIDTH, 1024] if family.detr else TINY_SCALE


def _shrink_detr(cfg: dict[str, Any], width: float) -> None:
    """RT-DETR's YAML spells HGStem/HGBlock channels and the decoder sizes explicitly (the width multiplier
    only reaches Conv/RepC3 rows), so scale those arguments here; 300 queries keep the output layout."""

    def ch(c: int) -> int:
        return max(8, round(c * width / 8) * 8)

    for row in cfg["backbone"]:
        if row[2] == "HGStem":
            row[3] = [ch(c) for c in row[3]]
        elif row[2] == "HGBlock":
            row[3] = [ch(row[3][0]), ch(row[3][1]), *row[3][2:]]
        elif row[2] == "DWConv":
            row[3] = [ch(row[3][0]), *row[3][1:]]
    for row in cfg["head"]:
        if row[2] == "AIFI":
            row[3] = [ch(row[3][0]), 4]  # feed-forward width, heads
        elif row[2] == "RTDETRDecoder":
            # nc, hidden, queries, points, heads, decoder layers, feed-forward
            row[3] = [row[3][0], 32, 300, 4, 4, 2, 64]


def _keep_all_queries(head: Any) -> None:
    """RT-DETR's decoder hands (boxes [B,Q,4] cx,cy,w,h normalised, sigmoid scores [B,Q,C]) to `postprocess`,
    which in this Ultralytics version picks the top 300 (query, class) pairs; concatenating them instead gives
    the [B, Q, 4+C] layout older Ultralytics versions exported."""
    import torch

    head.postprocess = lambda boxes, scores: torch.cat([boxes, scores], dim=-1)


def build(
    name: str, size: int, tiny: bool, seed: int, out: Path, static_batch: int | None, score_shift: float
) -> list[Built]:
    """Export the dynamic (batch, height, width) file and, unless static_batch is None, a static one."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    family = FAMILIES[name]
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}{'-tiny' if tiny else ''}-{size}"
    built: list[Built] = []
    with scratch_dir() as work:
        from ultralytics import RTDETR, YOLO

        from . import probe

        ctor = RTDETR if family.detr else YOLO
        calibration = probe.calibration_images(size, "rgb01")
        source = str(_tiny_yaml(family, work)) if tiny else family.yaml
        for dynamic in (True, False) if static_batch else (True,):
            start = time.perf_counter()
            seed_everything(seed)  # same weights in both files
            model = ctor(source)
            calibrate_batchnorm(model.model, calibration)
            if family.raw_detr:
                _keep_all_queries(model.model.model[-1])
            if score_shift:
                attrs = ("dec_score_head", "enc_score_head") if family.detr else ("cv3", "one2one_cv3")
                shift_score_bias(model.model.model[-1], attrs, score_shift)
            kwargs: dict[str, Any] = {"format": "onnx", "imgsz": size, "dynamic": dynamic, "device": "cpu"}
            if not dynamic:
                kwargs["batch"] = static_batch
            if family.end2end:
                kwargs["nms"] = False
            exported = Path(model.export(**kwargs))
            variant = "dynamic" if dynamic else f"static-b{static_batch}"
            target = out / f"{stem}-{'dyn' if dynamic else f'b{static_batch}'}.onnx"
            shutil.move(str(exported), target)
            args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            built.append(
                Built(
                    family=name,
                    variant=variant,
                    path=target,
                    exporter=f"{ctor.__name__}({Path(source).name!r}).export({args})",
                    packages=PACKAGES,
                    input_layout=RGB_01,
                    output_notes=family.notes,
                    build_s=time.perf_counter() - start,
                    extra={
                        "bn_calibration": CALIBRATION,
                        "score_shift": score_shift,
                        **({"tiny_scale": _scale(family)} if tiny else {}),
                    },
                )
            )
    return built
