"""Does the torch engine compute what the ONNX model says? The TF-exported CenterNet (its Resize
coordinate modes are what onnx2torch mapped wrongly) on real frames.

models/centernet-mbv3-coco.onnx (tf2onnx, end2end [1, 100, 6], batch fixed at 1; tools/make_centernet.sh) on
N frames spread over samples/vtest.mp4, stretched to 512², RGB 0–255: ONNX Runtime CPU (the reference) vs the
torch engine (CUDA on a GPU box, else the CPU), per precision. Prints, per precision:

- agreement: the share of reference detections scoring above threshold + 0.05 that the engine reproduces
  (same class, IoU ≥ 0.95) — acceptance: ≥ 99 %; and the other way round;
- per-output error as the start-up check computes it (streamd.checks.verify.compare: rows paired, max over
  rows above the threshold, mean over all) against the documented tolerance for the precision;
- the start-up check's cost when it runs (cold cache) and on a warm start (cached verdict: skipped).

    python bench/bench_centernet.py                       # torch on CUDA if available, else CPU; 120 frames
    python bench/bench_centernet.py --device cpu --frames 100 --precision fp32
    python bench/bench_centernet.py --no-rewrite          # onnx2torch alone (before the fix), for comparison

Exit 0 when every precision meets the acceptance, 1 otherwise. ``--out DIR`` writes bench_centernet.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from streamd.checks.verify import (  # noqa: E402
    TOLERANCES,
    VerifyPlan,
    compare,
    create_engine,
    match_detections,
)
from streamd.engines.options import EngineOptions  # noqa: E402
from streamd.stages.postprocess.cpu import CpuPostprocessor, PostprocessSpec  # noqa: E402
from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec  # noqa: E402

MODEL = REPO / "models" / "centernet-mbv3-coco.onnx"
CLIP = REPO / "samples" / "vtest.mp4"
PRE = PreprocessSpec(512, 512, "rgb", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), "stretch")


def read_frames(n: int) -> np.ndarray:
    """``n`` frames evenly spread over the clip, preprocessed to [n, 3, 512, 512]."""
    cap = cv2.VideoCapture(str(CLIP))
    total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) or 795
    wanted = set(np.linspace(0, total - 1, n).round().astype(int).tolist())
    pre = CpuPreprocessor(PRE)
    batch = np.empty((len(wanted), 3, 512, 512), np.float32)
    i = k = 0
    while k < len(wanted):
        ok, frame = cap.read()
        if not ok:
            break
        if i in wanted:
            pre(frame, batch[k])
            k += 1
        i += 1
    return batch[:k]


def reference(batch: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: batch[i : i + 1]})[0] for i in range(len(batch))])


def agreement(ref: np.ndarray, got: np.ndarray, threshold: float) -> dict[str, float]:
    post = CpuPostprocessor(PostprocessSpec("end2end", 80, threshold))
    n = hit = n_back = hit_back = 0
    ious: list[float] = []
    for r, g in zip(post(ref), post(got), strict=True):
        a, b, i = match_detections(r, g, threshold + 0.05, 0.95)
        c, d, _ = match_detections(g, r, threshold + 0.05, 0.95)
        n, hit, n_back, hit_back = n + a, hit + b, n_back + c, hit_back + d
        ious += i
    return {
        "cpu_detections": n,
        "matched": hit / n if n else 1.0,
        "engine_detections": n_back,
        "matched_back": hit_back / n_back if n_back else 1.0,
        "median_iou": float(np.median(ious)) if ious else 0.0,
    }


def run(args: argparse.Namespace) -> int:
    import torch

    if args.no_rewrite:
        from streamd.engines import torch_ops

        torch_ops.rewrite_for_torch = lambda model: (model, [])  # type: ignore[assignment]
    device: int | str = (
        0 if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    )
    t0 = time.perf_counter()
    batch = read_frames(args.frames)
    ref = reference(batch)
    ref_s = time.perf_counter() - t0
    where = f"cuda:0 {torch.cuda.get_device_name(0)}" if device == 0 else "cpu"
    print(
        f"model {MODEL.name}; {len(batch)} vtest frames; ONNX Runtime CPU reference {ref_s:.1f} s; "
        f"torch {torch.__version__} on {where}"
    )
    plan = VerifyPlan(True, PRE, PostprocessSpec("end2end", 80, args.threshold), MODEL.name)
    rows = []
    failed = False
    with tempfile.TemporaryDirectory() as cache:
        for precision in args.precision:
            verify = False if args.no_rewrite else plan
            options = EngineOptions(max_batch=1, precision=precision, device=device, cache_dir=Path(cache))
            t = time.perf_counter()
            try:
                engine = create_engine("torch", MODEL, options, verify=verify)
            except Exception as exc:  # the start-up check refusing the engine is a result too
                print(f"{precision}: engine refused: {exc}")
                rows.append({"precision": precision, "refused": str(exc)})
                failed = True
                continue
            cold_s = time.perf_counter() - t
            v_cold = engine.verification or {}
            engine.close()
            t = time.perf_counter()
            engine = create_engine("torch", MODEL, options, verify=verify)
            warm_s = time.perf_counter() - t
            v_warm = engine.verification or {}
            t = time.perf_counter()
            got = np.concatenate([engine.infer(batch[i : i + 1]) for i in range(len(batch))])
            infer_s = time.perf_counter() - t
            engine.close()
            errors, _ = compare(
                ref,
                got,
                precision=precision,
                output_name="tower_0/detections",
                postprocess=PostprocessSpec("end2end", 80, args.threshold),
            )
            agree = agreement(ref, got, args.threshold)
            ok = agree["matched"] >= 0.99 and errors[0].passed
            failed |= not ok
            tol = TOLERANCES[precision if engine.name.endswith(precision) else "fp32"]
            row = {
                "precision": precision,
                "engine": engine.name,
                **agree,
                "max_abs": errors[0].max_abs,
                "mean_abs": errors[0].mean_abs,
                "tolerance_max": tol.max_rel * errors[0].scale,
                "tolerance_mean": tol.mean_rel * errors[0].scale,
                "check_ms_cold": v_cold.get("cost_ms"),
                "check_cached_on_warm_start": v_warm.get("cached"),
                "engine_build_s_cold": round(cold_s, 2),
                "engine_build_s_warm": round(warm_s, 2),
                "infer_ms_per_frame": round(infer_s / len(batch) * 1e3, 2),
                "pass": ok,
            }
            rows.append(row)
            print(
                f"{engine.name}: CPU detections > {args.threshold + 0.05:.2f}: {agree['cpu_detections']}, "
                f"matched at IoU ≥ 0.95: {agree['matched']:.2%} (engine's matched back "
                f"{agree['matched_back']:.2%}, median IoU {agree['median_iou']:.4f}); output max abs "
                f"{errors[0].max_abs:.3g} (tolerance {row['tolerance_max']:.3g}), "
                f"mean {errors[0].mean_abs:.3g} (tolerance {row['tolerance_mean']:.3g}); "
                f"start-up check {row['check_ms_cold']} ms cold, warm start "
                f"cached={row['check_cached_on_warm_start']} (build {cold_s:.1f} s cold / {warm_s:.1f} s "
                f"warm); {row['infer_ms_per_frame']} ms/frame -> {'PASS' if ok else 'FAIL'}"
            )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_centernet.json").write_text(json.dumps(rows, indent=2) + "\n")
        lines = [
            "| engine | CPU dets | matched (IoU ≥ 0.95) | max abs (tol) | mean abs (tol) | check ms "
            "| warm skip |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            if "refused" in r:
                lines.append(f"| torch {r['precision']} | refused | | | | | |")
                continue
            lines.append(
                f"| {r['engine']} | {r['cpu_detections']} | {r['matched']:.2%} | {r['max_abs']:.3g} "
                f"({r['tolerance_max']:.3g}) | {r['mean_abs']:.3g} ({r['tolerance_mean']:.3g}) | "
                f"{r['check_ms_cold']} | {r['check_cached_on_warm_start']} |"
            )
        (out / "bench_centernet.md").write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--precision", nargs="+", default=None, help="default: fp32 fp16 on CUDA, fp32 on the CPU")
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--threshold", type=float, default=0.3, help="score threshold (model.score_threshold)")
    p.add_argument("--no-rewrite", action="store_true", help="onnx2torch alone, no start-up check (before)")
    p.add_argument("--out", help="folder for bench_centernet.{json,md}")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.precision is None:
        import torch

        gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        args.precision = ["fp32", "fp16"] if gpu else ["fp32"]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
