"""Issue 9 acceptance on the CPU, bundled vtest clip (10 fps, 795 frames). Not collected by pytest (no test_
prefix): run it from the repository root; it runs the real daemon (``python -m streamd run``) three times.

    python tests/analytics/acceptance.py [--out DIR]

Prints, per point: detect_fps 5 (lines, skipped, dropped), classes [person] vs the unfiltered run (person
boxes matched by IoU), tracking on every frame (consecutive-frame person matches at IoU >= 0.5 keeping their
track_id, id switches per 100 frames) and a zone over the left half (enter/leave balance and counts).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from streamd.analytics.tracker import assign, iou_matrix  # noqa: E402

MODEL = """\
model:
  path: {root}/models/nanodet-coco.onnx
  score_threshold: 0.35
  iou_threshold: 0.5
{extra}"""


def run(
    name: str, stream_keys: str, out: Path, model_extra: str = "", top: str = ""
) -> tuple[list[dict], str]:
    cfg = out / f"{name}.yaml"
    cfg.write_text(
        f"streams:\n  - id: demo\n    url: {ROOT}/samples/vtest.mp4\n{stream_keys}"
        + MODEL.format(root=ROOT, extra=model_extra)
        + top
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "streamd", "run", "--no-status", str(cfg)],
        capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    (out / f"{name}.jsonl").write_text(proc.stdout)
    summary = next((ln for ln in proc.stderr.splitlines() if "streamd: done:" in ln), "")
    return [json.loads(line) for line in proc.stdout.splitlines()], summary


def boxes(record: dict, label: str = "person") -> tuple[np.ndarray, list]:
    dets = [d for d in record["detections"] if d["label"] == label]
    return np.array([d["box"] for d in dets], np.float64).reshape(-1, 4), [d.get("track_id") for d in dets]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="streamd-acceptance-"))
    out.mkdir(parents=True, exist_ok=True)

    # 1. detect_fps: 5
    recs, summary = run("detect-fps", "    detect_fps: 5\n", out)
    skipped = int(re.search(r"(\d+) skipped", summary).group(1))  # type: ignore[union-attr]
    dropped = int(re.search(r"(\d+) dropped after decode", summary).group(1))  # type: ignore[union-attr]
    print(f"[detect_fps 5] lines {len(recs)} for 795 frames; skipped {skipped}; dropped {dropped}")
    print(f"    summary: {summary.split('INFO ')[-1]}")

    # 3 + 4 (and the unfiltered boxes of 2): every frame, tracking on, a zone over the left half
    zone = "    zones:\n      - name: left\n        polygon: [[0, 0], [384, 0], [384, 576], [0, 576]]\n"
    full, summary = run("tracking-zone", zone, out, top="tracking:\n  enabled: true\n")
    frames = [r for r in full if "type" not in r]
    events = [r for r in full if r.get("type") == "event"]
    assert [r["frame"] for r in frames] == list(range(len(frames))), "frame lines out of order"
    n_tracked = sum(len(r["detections"]) for r in frames)

    # 2. classes: [person], against the plain run (no analytics)
    plain, _ = run("plain", "", out)
    persons, _ = run("person-only", "    classes: [person]\n", out)
    n_plain = sum(len(r["detections"]) for r in plain)
    labels = {d["label"] for r in persons for d in r["detections"]}
    n_same = n_total = n_diff_frames = 0
    worst = 1.0
    for a, b in zip(plain, persons, strict=True):
        pa, _ = boxes(a)
        pb, _ = boxes(b)
        n_total += len(pa)
        if len(pa) != len(pb):
            n_diff_frames += 1
        if len(pa) and len(pb):
            iou = iou_matrix(pa, pb)
            r, c = assign(iou, 0.99)
            n_same += len(r)
            worst = min(worst, float(iou[r, c].min()) if len(r) else 0.0)
    cut = sum(len(r["detections"]) >= 100 for r in plain)
    print(
        f"[classes person] labels in the filtered run: {sorted(labels)}; person boxes of the unfiltered run "
        f"matched at IoU >= 0.99: {n_same}/{n_total} (lowest IoU {worst:.4f}); frames whose person count "
        f"differs: {n_diff_frames}; unfiltered frames at max_detections (100): {cut}"
    )

    # 3. tracking: consecutive-frame person matches keep their id
    kept = switched = untracked = 0
    for a, b in itertools.pairwise(frames):
        pa, ia = boxes(a)
        pb, ib = boxes(b)
        r, c = assign(iou_matrix(pa, pb), 0.5)
        for i, j in zip(r, c, strict=True):
            if ia[i] is None or ib[j] is None:
                untracked += 1
            elif ia[i] == ib[j]:
                kept += 1
            else:
                switched += 1
    pairs = kept + switched + untracked
    ids = {d["track_id"] for r in frames for d in r["detections"] if "track_id" in d}
    print(
        f"[tracking] consecutive-frame person matches (IoU >= 0.5): {pairs}; same track_id {kept} "
        f"({100 * kept / max(pairs, 1):.2f} %), id switches {switched} "
        f"({100 * switched / len(frames):.2f} per 100 frames), a side untracked {untracked}; "
        f"distinct track ids {len(ids)}; detections written {n_tracked} of {n_plain} "
        "(duplicates of a tracked box start no track and are not written)"
    )

    # 4. zone events balance
    entered: set[tuple[int, str]] = set()
    unbalanced = 0
    for e in events:
        key = (e["track_id"], e["zone"])
        if e["event"] == "enter":
            if key in entered:
                unbalanced += 1
            entered.add(key)
        else:
            if key not in entered:
                unbalanced += 1
            entered.discard(key)
    n_enter = sum(e["event"] == "enter" for e in events)
    n_leave = len(events) - n_enter
    print(
        f"[zone left half] enter {n_enter}, leave {n_leave}, still inside at the end {len(entered)}; "
        f"leave without an earlier enter (or enter twice): {unbalanced}"
    )
    print(f"outputs in {out}")


if __name__ == "__main__":
    main()
