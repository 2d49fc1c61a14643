#!/usr/bin/env python3
"""Check models/nanodet-coco.onnx (decode folded in) against the raw six-head NanoDet, on real images.

For every image: letterbox to 416 (centred, pad 114), normalise as the folded model's metadata says,
run both models with ONNX Runtime (CPU), decode the raw heads here in numpy (independently of
tools/fold_nanodet.py), then score threshold + per-class NMS on both and compare: same boxes, same
classes. Also checks batch 4 against batch 1 and prints the CPU time per frame.

--study adds the evidence for the preprocessing and anchor choice (raw model, numpy decode):
  * input normalisation: BGR/RGB x mean-std or /255, on vtest frames and colour-dependent images;
  * anchor point i*stride vs (i+0.5)*stride: horizontal-flip test (a wrong anchor offset shifts boxes
    by -offset*stride in the image and by +offset*stride in the mirrored one).

    python tools/verify_model.py --raw RAW.onnx --model models/nanodet-coco.onnx \\
        --video samples/vtest.mp4 --frames 0,200,400,600,790 --image bus.jpg [--study --study-image X.jpg]
Exit status 1 if the two models disagree.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import av
import cv2
import numpy as np
import onnxruntime as ort

SIZE = 416
STRIDES = (8, 16, 32)
BINS = 11
SCORE_THR = 0.35
IOU_THR = 0.45
BOX_TOL = 1e-2  # px; fp32 re-association of the same maths


# ---------------------------------------------------------------- input
def read_frames(path: Path, indices: list[int]) -> list[tuple[str, np.ndarray]]:
    want = set(indices)
    out = []
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i in want:
                out.append((f"{path.name}#{i}", frame.to_ndarray(format="bgr24")))
            if i >= max(indices):
                break
    if len(out) != len(want):
        raise SystemExit(f"{path}: got {len(out)} of frames {indices}")
    return out


def letterbox(img: np.ndarray) -> tuple[np.ndarray, float, tuple[int, int]]:
    h, w = img.shape[:2]
    r = min(SIZE / h, SIZE / w)
    nh, nw = round(h * r), round(w * r)
    y0, x0 = (SIZE - nh) // 2, (SIZE - nw) // 2
    out = np.full((SIZE, SIZE, 3), 114, np.uint8)
    out[y0 : y0 + nh, x0 : x0 + nw] = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    return out, r, (x0, y0)


def normalise(bgr: np.ndarray, order: str, mean, std) -> np.ndarray:
    x: np.ndarray = bgr.astype(np.float32)
    if order == "rgb":
        x = x[..., ::-1]
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


# ---------------------------------------------------------------- raw model + numpy decode
class Raw:
    def __init__(self, path: Path):
        self.sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.input = self.sess.get_inputs()[0].name
        names = [o.name for o in self.sess.get_outputs()]
        shapes = {o.name: o.shape for o in self.sess.get_outputs()}
        cells = {(SIZE // s) ** 2: s for s in STRIDES}
        self.cls = {cells[shapes[n][1]]: n for n in names if shapes[n][2] == 80}
        self.reg = {cells[shapes[n][1]]: n for n in names if shapes[n][2] == 4 * BINS}
        assert sorted(self.cls) == sorted(self.reg) == list(STRIDES), shapes

    def heads(self, x: np.ndarray) -> dict[str, np.ndarray]:
        outs = self.sess.run(None, {self.input: x})
        return dict(zip([o.name for o in self.sess.get_outputs()], outs, strict=True))

    def decode(self, x: np.ndarray, anchor_offset: float = 0.5) -> np.ndarray:
        """-> [N, 84]: cx, cy, w, h (input px), 80 scores; cells of stride 8, 16, 32 in row-major order."""
        h = self.heads(x)
        rows = []
        for s in STRIDES:
            g = SIZE // s
            scores = h[self.cls[s]][0]  # [g*g, 80], already sigmoid
            logits = h[self.reg[s]][0].reshape(g * g, 4, BINS)
            e = np.exp(logits - logits.max(-1, keepdims=True))
            prob = e / e.sum(-1, keepdims=True)
            dist = (prob * np.arange(BINS, dtype=np.float32)).sum(-1) * s  # l, t, r, b
            iy, ix = np.divmod(np.arange(g * g), g)
            ax, ay = (ix + anchor_offset) * s, (iy + anchor_offset) * s
            x1, y1, x2, y2 = ax - dist[:, 0], ay - dist[:, 1], ax + dist[:, 2], ay + dist[:, 3]
            box = np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], 1)
            rows.append(np.concatenate([box, scores], 1))
        return np.concatenate(rows).astype(np.float32)


# ---------------------------------------------------------------- post-processing
def xyxy(cxcywh: np.ndarray) -> np.ndarray:
    cx, cy, w, h = cxcywh.T
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = lambda z: (z[:, 2] - z[:, 0]) * (z[:, 3] - z[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None] - inter + 1e-9)


def postprocess(pred: np.ndarray, thr: float = SCORE_THR) -> list[tuple[int, float, np.ndarray]]:
    """pred [N, 84] -> [(class, score, xyxy)], best first, per-class NMS."""
    scores = pred[:, 4:]
    cls = scores.argmax(1)
    conf = scores[np.arange(len(cls)), cls]
    m = conf > thr
    boxes, cls, conf = xyxy(pred[m, :4]), cls[m], conf[m]
    order = np.argsort(-conf, kind="stable")
    keep: list[int] = []
    for i in order:
        same = [k for k in keep if cls[k] == cls[i]]
        if same and iou(boxes[[i]], boxes[same]).max() > IOU_THR:
            continue
        keep.append(i)
    return [(int(cls[k]), float(conf[k]), boxes[k]) for k in keep]


# ---------------------------------------------------------------- study
def study(
    raw: Raw, images: list[tuple[str, np.ndarray]], colour: list[tuple[str, np.ndarray]], names
) -> None:
    print("\n== study: input normalisation (raw model, anchor (i+0.5)*stride, letterbox, score>0.35) ==")
    modes = {
        "BGR (x-mean)/std": ("bgr", [103.53, 116.28, 123.675], [57.375, 57.12, 58.395]),
        "RGB (x-mean)/std": ("rgb", [103.53, 116.28, 123.675], [57.375, 57.12, 58.395]),
        "RGB x/255": ("rgb", [0, 0, 0], [255, 255, 255]),
        "BGR x/255": ("bgr", [0, 0, 0], [255, 255, 255]),
    }
    head = ("normalisation", "frames", "top5 person score", "persons>0.5/frame", "dets/frame")
    print(f"{head[0]:18s} {head[1]:>6s} {head[2]:>17s} {head[3]:>17s} {head[4]:>10s}")
    for label, (order, mean, std) in modes.items():
        top5: list[float] = []
        n5: list[int] = []
        ndet: list[int] = []
        for _, img in images:
            dets = postprocess(raw.decode(normalise(letterbox(img)[0], order, mean, std)))
            p = sorted((s for c, s, _ in dets if c == 0), reverse=True)
            top5.append(float(np.mean(p[:5])) if p else 0.0)
            n5.append(sum(s > 0.5 for s in p))
            ndet.append(len(dets))
        print(f"{label:18s} {len(images):6d} {np.mean(top5):17.3f} {np.mean(n5):17.2f} {np.mean(ndet):10.2f}")
    print("\ncolour-dependent images (top detections > 0.30):")
    for name, img in colour:
        print(f"  {name}")
        for label, (order, mean, std) in modes.items():
            dets = postprocess(raw.decode(normalise(letterbox(img)[0], order, mean, std)), 0.30)[:6]
            print(f"    {label:18s} " + (", ".join(f"{names[c]} {s:.2f}" for c, s, _ in dets) or "-"))

    print("\n== study: anchor point (raw model, BGR mean/std) ==")
    print("horizontal-flip test: mean of cx(image) - mirrored cx(flipped image) over candidates (score>0.35)")
    print("matched at IoU>0.6, per stride; correct anchor -> ~0, wrong by 0.5 -> about -stride")
    order, mean, std = modes["BGR (x-mean)/std"]
    level = np.concatenate([np.full((SIZE // s) ** 2, s) for s in STRIDES])
    for off in (0.0, 0.5):
        diffs: dict[int, list[float]] = {s: [] for s in STRIDES}
        for _, img in images:
            lb = letterbox(img)[0]
            a = raw.decode(normalise(lb, order, mean, std), off)
            b = raw.decode(normalise(np.ascontiguousarray(lb[:, ::-1]), order, mean, std), off)
            b[:, 0] = SIZE - b[:, 0]
            for s in STRIDES:
                ma = (a[:, 4:].max(1) > SCORE_THR) & (level == s)
                mb = (b[:, 4:].max(1) > SCORE_THR) & (level == s)
                if ma.any() and mb.any():
                    m = iou(xyxy(a[ma, :4]), xyxy(b[mb, :4]))
                    ok = m.max(1) > 0.6
                    diffs[s] += list(a[ma][ok, 0] - b[mb][m.argmax(1)[ok], 0])
        cells = ", ".join(
            f"stride {s}: {np.mean(v):+6.2f} px (n={len(v)})" if v else f"stride {s}: - (n=0)"
            for s, v in diffs.items()
        )
        print(f"  anchor (i+{off})*stride: {cells}")


# ---------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, required=True, help="slimmed six-head conversion")
    ap.add_argument("--model", type=Path, required=True, help="folded model (output0)")
    ap.add_argument("--video", type=Path, action="append", default=[])
    ap.add_argument("--frames", default="0,200,400,600,790")
    ap.add_argument("--image", type=Path, action="append", default=[])
    ap.add_argument("--study", action="store_true")
    ap.add_argument("--study-image", type=Path, action="append", default=[])
    args = ap.parse_args()

    folded = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    meta = folded.get_modelmeta().custom_metadata_map
    names = json.loads(meta["names"])
    order, mean, std = meta["channel_order"], json.loads(meta["mean"]), json.loads(meta["std"])
    inp, out = folded.get_inputs()[0], folded.get_outputs()[0]
    print(
        f"ort {ort.__version__}; folded model {args.model.name}: input {inp.name} {inp.shape} {inp.type}, "
        f"output {out.name} {out.shape}"
    )
    print(f"metadata: layout={meta['layout']} channel_order={order} mean={mean} std={std} names={len(names)}")
    raw = Raw(args.raw)

    images: list[tuple[str, np.ndarray]] = []
    for path in args.image:
        img = cv2.imread(str(path))
        if img is None:
            raise SystemExit(f"cannot read {path}")
        images.append((path.name, img))
    frames = [int(f) for f in args.frames.split(",")]
    for video in args.video:
        images += read_frames(video, frames)

    ok = True
    inputs, outputs = [], []
    what = f"letterbox 416, score>{SCORE_THR}, NMS {IOU_THR}"
    print(f"\n== raw heads + numpy decode vs folded output0 ({what}) ==")
    for name, img in images:
        x = normalise(letterbox(img)[0], order, mean, std)
        ref = raw.decode(x)
        y = folded.run(None, {inp.name: x})[0]
        got = y[0].T
        inputs.append(x)
        outputs.append(y)
        d_box = float(np.abs(ref[:, :4] - got[:, :4]).max())
        d_cls = float(np.abs(ref[:, 4:] - got[:, 4:]).max())
        a, b = postprocess(ref), postprocess(got)
        same = len(a) == len(b) and all(ca == cb for (ca, _, _), (cb, _, _) in zip(a, b, strict=False))
        d_det = max(
            (float(np.abs(ba - bb).max()) for (_, _, ba), (_, _, bb) in zip(a, b, strict=False)), default=0.0
        )
        good = same and d_det < BOX_TOL and d_box < BOX_TOL and d_cls < 1e-5
        ok &= good
        print(
            f"{name}: raw {len(a)} dets, folded {len(b)} dets, same classes/order: {same}, "
            f"max|dbox| kept {d_det:.2e} px, all {ref.shape[0]} cells: box {d_box:.2e} px, "
            f"score {d_cls:.2e} -> {'OK' if good else 'MISMATCH'}"
        )
        for c, s, box in b:
            print(f"    {names[c]:14s} {s:.2f}  [{box[0]:6.1f} {box[1]:6.1f} {box[2]:6.1f} {box[3]:6.1f}]")

    if isinstance(inp.shape[0], str) and len(inputs) >= 4:
        y4 = folded.run(None, {inp.name: np.concatenate(inputs[:4])})[0]
        d = max(float(np.abs(y4[i] - outputs[i][0]).max()) for i in range(4))
        good = y4.shape == (4, *outputs[0].shape[1:]) and d < 1e-3
        ok &= good
        print(
            f"\nbatch 4 vs batch 1 ({', '.join(n for n, _ in images[:4])}): output {list(y4.shape)}, "
            f"max|diff| {d:.2e} -> {'OK' if good else 'MISMATCH'}"
        )
    else:
        print(f"\nbatch: static {inp.shape[0]}")

    x = inputs[0]
    folded.run(None, {inp.name: x})
    t = []
    for _ in range(10):
        t0 = time.perf_counter()
        folded.run(None, {inp.name: x})
        t.append(time.perf_counter() - t0)
    print(f"CPU time, batch 1: median {1000 * np.median(t):.1f} ms/frame")
    print(f"\nRESULT: {'PASS' if ok else 'FAIL'}")

    if args.study:
        frames_all = []
        for video in args.video:
            frames_all += read_frames(video, list(range(0, 795, 10)))
        extra = []
        for path in args.study_image:
            img = cv2.imread(str(path))
            if img is None:
                raise SystemExit(f"cannot read {path}")
            extra.append((path.name, img))
        study(
            raw,
            frames_all + [i for i in images if not i[0].startswith(tuple(v.name for v in args.video))],
            extra,
            names,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
