"""Detector families on the GPU vs ONNX Runtime CPU: the engine ``engine.type`` picks (``auto``: torch + CUDA
on a box without TensorRT) with its start-up check, and the GPU decode + NMS kernels, against ONNX Runtime CPU
with the CPU twin, on the same preprocessed frames of real footage.

For each config (a streamd config whose ``model:`` section describes one model; ``--zoo DIR`` makes one per
model of a ``tools/model_zoo.py`` manifest): the first ``--frames`` frames of the clip are decoded and
preprocessed once on the CPU; ONNX Runtime CPU + ``CpuPostprocessor`` give the reference detections, the GPU
engine (``create_engine`` with the start-up check, as ``streamd run`` does) + ``GpuPostprocessor`` the others.
Reported per model: the check's verdict, the layout ``auto`` chose, reference and GPU detection counts and the
share matched both ways by class at IoU ≥ 0.95 (reference detections above ``score_threshold + margin``);
beside it the same share counting only detections 0.01 above the threshold (``matched_above_edge``), with the
twin searched on the other side decoded 0.01 below it (``matched_hysteresis_0.01``: a score that crossed the
threshold in rounding still needs its twin box), over boxes at least 1 / 2 px a side (``matched_min_*px``),
and the median size of the unmatched boxes. ``--precisions strict``: the torch engine as auto's last GPU rung
builds it (fp32, no TF32, no cuDNN autotuning), measured even when its check refuses it.

  python bench/bench_families.py --zoo /tmp/zoo --frames 100 --json /tmp/families.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamd.checks.compare import agree, match_detections  # noqa: E402
from streamd.config import load_config  # noqa: E402
from streamd.resources import bundled_path  # noqa: E402

CLIP = bundled_path("samples", "vtest.mp4")
CPU_DRY_RUN = False  # --cpu: the engine on the CPU and the CPU twin (a check of this script, not a result)


def read_frames(path: Path, n: int) -> list[np.ndarray]:
    """The first ``n`` frames, BGR (OpenCV: the GPU box has no PyAV)."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    out = []
    while len(out) < n:
        ok, frame = cap.read()
        if not ok:
            break
        out.append(frame)
    cap.release()
    return out


def gpu_detections(engine: Any, spec: Any, raw: np.ndarray) -> list[Any]:
    """The GPU kernels on the engine's raw output (uploaded once per batch)."""
    from streamd.gpu.cuda import Context, DeviceBuffer, Stream
    from streamd.stages.postprocess.cuda import GpuPostprocessor

    ctx = Context(0)
    stream = Stream(ctx)
    post = GpuPostprocessor(spec, ctx, max_batch=len(raw), num_anchors=spec.head.candidates)
    dev = DeviceBuffer(raw.nbytes)
    dev.upload(np.ascontiguousarray(raw, np.float32), stream)
    results, host = post.new_results(), post.new_host_results()
    post(dev, len(raw), stream, results)
    results.download(host, stream, len(raw))
    stream.synchronize()
    out = host.detections(len(raw))
    for obj in (post, results, host, dev):
        obj.close()
    return out


def run_model(
    config_path: Path, n_frames: int, engine_type: str, precisions: list[str], margin: float
) -> list:
    """One row per precision: the GPU engine + kernels vs ONNX Runtime CPU + the CPU twin (computed once)."""
    from streamd.checks.verify import create_engine
    from streamd.engines.options import EngineOptions
    from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec

    config = load_config(config_path)
    m = config.model
    w, h = m.input_size
    pre = CpuPreprocessor(PreprocessSpec(w, h, m.channel_order, m.mean, m.std, m.resize, m.pad_value))
    images = read_frames(CLIP, n_frames)
    batch = np.empty((len(images), 3, h, w), np.float32)
    for i, image in enumerate(images):
        pre(image, batch[i])
    size = (int(w), int(h))
    ref_engine = create_engine(
        "onnxruntime", m.path, EngineOptions(max_batch=8, precision="fp32", device="cpu", input_size=size),
        verify=False,
    )  # fmt: skip
    t0 = time.perf_counter()
    ref_out = np.concatenate([ref_engine.infer(batch[i : i + 8]) for i in range(0, len(batch), 8)])
    ref_s = time.perf_counter() - t0
    ref_engine.close()
    rows = []
    for precision in precisions:
        try:
            row = _gpu_row(config, batch, ref_out, engine_type, precision, margin)
        except Exception as exc:  # one precision's failure is a row
            row = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        rows.append({"config": str(config_path), "model": m.path.name, "precision": precision,
                     "frames": len(images), "ref_cpu_s": round(ref_s, 1), **row})  # fmt: skip
    return rows


def _gpu_row(config: Any, batch: np.ndarray, ref_out: np.ndarray, engine_type: str, precision: str,
             margin: float) -> dict:  # fmt: skip
    from streamd.checks.verify import VerifyPlan, create_engine
    from streamd.engines.base import VerificationError, parts_of
    from streamd.engines.options import EngineOptions
    from streamd.stages.postprocess.cpu import CpuPostprocessor, PostprocessSpec
    from streamd.stages.postprocess.head import HeadSettings
    from streamd.stages.postprocess.resolve import resolve_head

    m = config.model
    size = (int(m.input_size[0]), int(m.input_size[1]))
    t0 = time.perf_counter()
    device: int | str = "cpu" if CPU_DRY_RUN else 0
    # fp32 rows: true FP32 (no TF32 in convolutions and matmuls), what ONNX Runtime CPU computes; "strict":
    # the torch engine as auto's last GPU rung builds it (no TF32, no cuDNN autotuning), measured even when
    # its check refuses it
    strict = precision == "strict"
    if strict:
        engine_type = "torch"
    options = EngineOptions(
        max_batch=8,
        precision="fp32" if strict else precision,
        device=device,
        input_size=size,
        tf32=precision not in ("fp32", "strict"),
        cudnn_benchmark=not strict,
    )
    refused = ""
    try:
        gpu = create_engine(engine_type, m.path, options, verify=VerifyPlan.from_config(config))
    except VerificationError as exc:  # measured anyway, unverified: the row says why it was refused
        refused = str(exc)[:600]
        gpu = create_engine(engine_type, m.path, options, verify=False)
    start_s = time.perf_counter() - t0
    try:
        head = resolve_head(HeadSettings.from_model(m), parts_of(gpu))
        spec = PostprocessSpec(
            head.layout, len(m.class_names), m.score_threshold, m.iou_threshold, m.max_detections, m.top_k,
            head=head,
        )  # fmt: skip
        gpu_out = np.concatenate([gpu.infer(batch[i : i + 8]) for i in range(0, len(batch), 8)])
        ref = CpuPostprocessor(spec)(ref_out.astype(np.float32))
        if CPU_DRY_RUN:  # the flow without a GPU: the CPU twin in place of the kernels
            got = CpuPostprocessor(spec)(gpu_out.astype(np.float32))
        else:
            got = [
                d for i in range(0, len(gpu_out), 8) for d in gpu_detections(gpu, spec, gpu_out[i : i + 8])
            ]
        nms = m.iou_threshold if head.nms else None

        def share(cut: float) -> tuple[int, int, float, list[float]]:
            n_ref = n_got = hit_ref = hit_got = 0
            ious: list[float] = []
            for r, g in zip(ref, got, strict=True):
                a, b, c, d, iou = agree(r, g, cut, 0.95, nms)
                n_ref, hit_ref, n_got, hit_got = n_ref + a, hit_ref + b, n_got + c, hit_got + d
                ious += iou
            matched = min(hit_ref / n_ref if n_ref else 1.0, hit_got / n_got if n_got else 1.0)
            return n_ref, n_got, round(matched, 4), ious

        def share_sized(cut: float, side: float) -> float:
            """matched over boxes of at least ``side`` px a side (each direction counts its own side's)."""
            big_ref, big_got = _at_least(ref, side), _at_least(got, side)
            n_ref = hit_ref = n_got = hit_got = 0
            for r, g, br, bg in zip(ref, got, big_ref, big_got, strict=True):
                a, b, _, _, _ = agree(br, g, cut, 0.95, nms)
                _, _, c, d, _ = agree(r, bg, cut, 0.95, nms)
                n_ref, hit_ref, n_got, hit_got = n_ref + a, hit_ref + b, n_got + c, hit_got + d
            return round(min(hit_ref / n_ref if n_ref else 1.0, hit_got / n_got if n_got else 1.0), 4)

        # hysteresis: a detection above the threshold on one side is matched by a twin (same class, IoU >=
        # 0.95) on the other side decoded at threshold - 0.01 — a score that crossed the threshold in
        # rounding still needs its twin box (the CPU twin decodes the GPU's raw output at the lower cut)
        low = dataclasses.replace(spec, score_threshold=max(0.0, m.score_threshold + margin - 0.01))
        ref_low = CpuPostprocessor(low)(ref_out.astype(np.float32))
        got_low = CpuPostprocessor(low)(gpu_out.astype(np.float32))
        cut = m.score_threshold + margin
        hyst = [match_detections(r, gl, cut, 0.95) for r, gl in zip(ref, got_low, strict=True)]
        hyst_back = [match_detections(g, rl, cut, 0.95) for g, rl in zip(got, ref_low, strict=True)]
        n_a, h_a = sum(x[0] for x in hyst), sum(x[1] for x in hyst)
        n_b, h_b = sum(x[0] for x in hyst_back), sum(x[1] for x in hyst_back)
        matched_hysteresis = round(min(h_a / n_a if n_a else 1.0, h_b / n_b if n_b else 1.0), 4)
        n_ref, n_got, matched, ious = share(m.score_threshold + margin)
        matched_sized = {f"matched_min_{s:g}px": share_sized(m.score_threshold + margin, s) for s in (1, 2)}
        sizes = _unmatched_sizes(ref, got, m.score_threshold + margin)
        # the same 0.01 above the threshold: how much of the rest is detections at the threshold's edge
        matched_edge = share(m.score_threshold + margin + 0.01)[2]
        verdict = getattr(gpu, "verification", None) or {}
        return {
            "refused": refused,
            "engine": gpu.name,
            "layout": head.layout,
            "note": head.note,
            "verified": False if refused else verdict.get("passed"),
            "verify_matched": verdict.get("matched"),
            "verify_outputs": [(o["name"], round(o["max_abs"], 5)) for o in verdict.get("outputs", [])],
            "threshold": m.score_threshold,
            "ref_detections": n_ref,
            "gpu_detections": n_got,
            "matched": matched,
            "matched_above_edge": matched_edge,
            "tf32": _tf32(gpu),
            "worst_iou": round(min(ious, default=1.0), 4),
            "matched_hysteresis_0.01": matched_hysteresis,
            **matched_sized,
            **sizes,
            "start_s": round(start_s, 1),
        }
    finally:
        gpu.close()


def _at_least(dets: list[Any], side: float) -> list[Any]:
    """Each frame's detections whose box is at least ``side`` px wide and high."""
    from streamd.types import Detections

    out = []
    for d in dets:
        wh = d.xyxy[:, 2:] - d.xyxy[:, :2]
        keep = (wh >= side).all(axis=1)
        out.append(Detections(d.xyxy[keep], d.score[keep], d.class_id[keep]))
    return out


def _unmatched_sizes(ref: list[Any], got: list[Any], cut: float) -> dict[str, Any]:
    """Median box size (sqrt of the area, input pixels) of all reference detections above ``cut`` and of
    those without a same-class twin at IoU >= 0.95: IoU is ill-conditioned on boxes of a few pixels (a
    0.05 px shift of a 1 px box costs 0.05 of IoU), which is where random-weight models disagree."""
    from streamd.checks.compare import _iou

    every: list[float] = []
    lost: list[float] = []
    for r, g in zip(ref, got, strict=True):
        keep = r.score > cut
        boxes, classes = r.xyxy[keep].astype(np.float64), r.class_id[keep]
        if not len(boxes):
            continue
        side = np.sqrt(np.maximum(boxes[:, 2] - boxes[:, 0], 0) * np.maximum(boxes[:, 3] - boxes[:, 1], 0))
        iou = _iou(boxes, g.xyxy.astype(np.float64)) * (classes[:, None] == g.class_id[None])
        best = iou.max(axis=1, initial=0.0)
        every += side.tolist()
        lost += side[best < 0.95].tolist()
    return {
        "median_box_px": round(float(np.median(every)), 2) if every else None,
        "unmatched_median_box_px": round(float(np.median(lost)), 2) if lost else None,
        "unmatched_small_share": round(float(np.mean(np.array(lost) < 4.0)), 3) if lost else None,
    }


def _tf32(engine: Any) -> bool | None:
    """Whether FP32 matmuls/convolutions may use TF32 (the torch engine's process-wide switch)."""
    if not str(getattr(engine, "name", "")).startswith("torch-cuda"):
        return None
    import torch

    return bool(torch.backends.cudnn.allow_tf32)


ZOO_MODEL = """model:
  path: {path}
  input_size: [{size}, {size}]
{prep}  score_threshold: {threshold}
{extra}streams:
  - id: cam
    url: {clip}
sinks:
  - type: stdout
"""
RGB01 = "  channel_order: rgb\n  mean: [0, 0, 0]\n  std: [255, 255, 255]\n"
BGR255 = "  channel_order: bgr\n  mean: [0, 0, 0]\n  std: [1, 1, 1]\n"


def _threshold(entry: dict) -> float:
    """The highest probe threshold that still leaves 10 detections on the probe frame (random weights)."""
    above = {float(k): v for k, v in entry.get("probe", {}).get("detections_above", {}).items()}
    good = [t for t, n in above.items() if n >= 10]
    return max(good) if good else min(above, default=0.25)


def zoo_configs(zoo: Path, out: Path) -> list[Path]:
    """One config per model of a ``tools/model_zoo.py --manifest`` folder (its ``MANIFEST.json``)."""
    files = json.loads((zoo / "MANIFEST.json").read_text())["files"]
    configs = []
    for name, entry in sorted(files.items()):
        if entry.get("variant") == "standard":  # torchvision's own export: one image, refused by design
            continue
        yolox = entry["family"].startswith("yolox")
        extra = "  layout: yolox\n" if yolox else ""
        if "ssdlite" in entry["family"]:  # torchvision's 90 COCO labels (background dropped)
            extra += "  class_names: [" + ", ".join(f"c{i}" for i in range(90)) + "]\n"
        path = out / f"{Path(name).stem}.yaml"
        path.write_text(
            ZOO_MODEL.format(
                path=(zoo / name).resolve(),
                size=entry["input_size"][0],
                prep=BGR255 if yolox else RGB01,
                threshold=_threshold(entry),
                extra=extra,
                clip=CLIP,
            )
        )
        configs.append(path)
    return configs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("configs", nargs="*", type=Path, help="streamd configs, one model each")
    parser.add_argument("--zoo", type=Path, help="a tools/model_zoo.py output folder (MANIFEST.json)")
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--precisions", nargs="+", default=["fp16", "fp32"])
    parser.add_argument("--margin", type=float, default=0.0, help="reference detections above thr + margin")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cpu", action="store_true", help="dry run without a GPU (engine on the CPU)")
    parser.add_argument("--shard", default="0/1", help="K/N: every N-th config from the K-th (parallel runs)")
    args = parser.parse_args()
    global CPU_DRY_RUN
    CPU_DRY_RUN = args.cpu
    configs = list(args.configs)
    if args.zoo:
        import tempfile

        work = Path(tempfile.mkdtemp(prefix="families-"))  # the zoo folder may be read-only (the repo's)
        configs += zoo_configs(args.zoo, work)
    k, n = (int(v) for v in args.shard.split("/"))
    rows = []
    for cfg in configs[k::n]:
        try:
            got = run_model(cfg, args.frames, args.engine, args.precisions, args.margin)
        except Exception as exc:  # one model's failure is a row, not the end of the run
            got = [{"config": str(cfg), "error": f"{type(exc).__name__}: {exc}"[:400]}]
        for row in got:
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all("error" not in r and r["matched"] >= 0.99 and r["verified"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
