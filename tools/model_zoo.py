#!/usr/bin/env python3
"""Build ONNX detection models of the families users bring to streamd, each exported by its own tool.

Development tool only: it needs the zoo venv (torch, torchvision, ultralytics, yolox, onnx, onnxslim,
onnxruntime), never streamd's runtime. Weights are random (seeded): fine for throughput and equivalence tests,
meaningless as detectors. See docs/model_zoo.md.

  python tools/model_zoo.py list
  python tools/model_zoo.py build yolov8s --out /tmp/zoo                  # 640, dynamic + static batch 1
  python tools/model_zoo.py build all --tiny --manifest --out tests/data/zoo

Without PyPI (the GPU box): install the wheels listed in tools/zoo_wheels.txt, fetched here with:
  pip download --no-deps --only-binary=:all: --python-version 3.12 \\
      --platform manylinux_2_28_x86_64 -d .whl-zoo -r tools/zoo_wheels.txt
  pip download --no-deps --no-binary=:all: -d .whl-zoo yolox==0.3.0      # sdist, used as a library
then there: pip install --no-index --no-deps --target /tmp/site .whl-zoo/*.whl && PYTHONPATH=/tmp/site \\
      python tools/model_zoo.py build all --out /tmp/zoo --sdist-dir .whl-zoo
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from zoo import common, probe, tv, ultra, yolox_family

REPO = Path(__file__).resolve().parents[1]
_LIST_NOTE = {
    "yolo26s": " (nms=False: NMS-free head)",
    "yolov10s": " (nms=False: NMS-free head)",
    "rtdetr-l-raw": " (head's top-k bypassed: [B, 300, 4+80])",
}
FAMILIES = {
    **{name: f"Ultralytics {f.yaml}{_LIST_NOTE.get(name, '')}" for name, f in ultra.FAMILIES.items()},
    "yolox-s": "YOLOX-s, official yolox package, decode_in_inference=False",
    "ssdlite": "torchvision ssdlite320_mobilenet_v3_large: its own export + a batched boxes/scores wrapper",
    "tfod-ssdlite": "4 outputs imitating the TF Object Detection API contract, from the SSDlite wrapper",
}
ABOUT = (
    "Built by tools/model_zoo.py from the packages' own model definitions with seeded random weights "
    "(BatchNorm statistics from the bundled clip, class-score bias shifted: see docs/model_zoo.md); "
    "meaningless as detectors, for layout/engine/equivalence tests only. 'probe' = ONNX Runtime CPU on one "
    "frame of the clip."
)
DEFAULT_SIZE = {"ssdlite": 320, "tfod-ssdlite": 320}
TINY_SIZE = 160


def build_one(
    name: str, size: int, seed: int, shift: float, static: int | None, args: argparse.Namespace
) -> list[common.Built]:
    if name in ultra.FAMILIES:
        return ultra.build(name, size, args.tiny, seed, args.out, static, shift)
    if name == "yolox-s":
        return yolox_family.build(size, args.tiny, seed, args.out, static, args.sdist_dir, shift)
    if name == "ssdlite":
        return tv.build_ssdlite(size, args.tiny, seed, args.out, shift)
    return tv.build_tfod(size, args.tiny, seed, args.out, shift)


def record(built: common.Built, size: int, command: str) -> dict[str, object]:
    entry: dict[str, object] = {
        "family": built.family,
        "variant": built.variant,
        "file": built.path.name,
        "sha256": common.sha256(built.path),
        "bytes": built.path.stat().st_size,
        "input_size": [size, size],
        **common.describe_io(built.path),
        "opset": common.opset(built.path),
        "input_layout": built.input_layout,
        "output_notes": built.output_notes,
        "exporter": built.exporter,
        "versions": common.versions(built.packages),
        "build_s": round(built.build_s, 1),
        "command": command,
        **built.extra,
    }
    kind = "bgr255" if built.family == "yolox-s" else "rgb01"
    frame = probe.read_frame(probe.SAMPLE)
    entry["probe"] = {
        "frame": f"{probe.SAMPLE.relative_to(REPO)} #30",
        **probe.run(built.path, built.family, built.variant, frame, kind, size),
    }
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="families this tool builds")
    b = sub.add_parser("build", help="build one family (or 'all')")
    b.add_argument("family", choices=[*FAMILIES, "all"])
    b.add_argument(
        "--size", type=int, default=0, help="square input size (default 640; SSDlite 320; tiny 160)"
    )
    b.add_argument("--tiny", action="store_true", help="same family and export path, scaled down to ~1-2 MB")
    b.add_argument("--seed", type=int, default=None, help="weight seed (default 0)")
    b.add_argument(
        "--score-shift",
        type=float,
        default=None,
        help="add to the class-score bias after init (default: the family's entry in SCORE_SHIFT; "
        "0 = the package's own init)",
    )
    b.add_argument(
        "--static-batch",
        type=int,
        default=-1,
        help="batch of the static-batch file; 0 = none (default: 1; with --tiny only yolov8s)",
    )
    b.add_argument("--out", type=Path, required=True, help="folder for the .onnx files")
    b.add_argument("--sdist-dir", type=Path, default=REPO / ".whl-zoo", help="where yolox-*.tar.gz lies")
    b.add_argument("--manifest", action="store_true", help="probe each file and update OUT/MANIFEST.json")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for name, what in FAMILIES.items():
            print(f"{name:14s} {what}")
        return 0
    shown_out = str(args.out)
    args.out = args.out.resolve()  # Ultralytics exports inside a scratch working directory
    names = list(FAMILIES) if args.family == "all" else [args.family]
    manifest_path = args.out / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if args.manifest and manifest_path.exists() else {}
    files = manifest.setdefault("files", {})
    for name in names:
        size = args.size or (TINY_SIZE if args.tiny else DEFAULT_SIZE.get(name, 640))
        seed = args.seed if args.seed is not None else 0
        shift = args.score_shift if args.score_shift is not None else SCORE_SHIFT.get((name, args.tiny), 0.0)
        static = args.static_batch or None
        if args.tiny and args.static_batch == -1:  # committed tiny set: one static-batch file is enough
            static = 1 if name == "yolov8s" else None
        elif static is not None and static < 0:
            static = 1
        command = [
            "python",
            "tools/model_zoo.py",
            "build",
            name,
            *(["--tiny"] if args.tiny else []),
            "--size",
            str(size),
            "--seed",
            str(seed),
            "--score-shift",
            f"{shift:g}",
            "--static-batch",
            str(static or 0),
            "--out",
            shown_out,
        ]
        for built in build_one(name, size, seed, shift, static, args):
            mb = built.path.stat().st_size / 1e6
            print(f"{built.path}  {mb:.2f} MB  {built.build_s:.1f} s", flush=True)
            if args.manifest:
                files[built.path.name] = {"seed": seed, **record(built, size, shlex.join(command))}
                print("   probe:", json.dumps(files[built.path.name]["probe"]), flush=True)
    if args.manifest:
        manifest["about"] = ABOUT
        manifest["files"] = dict(sorted(files.items()))
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


# Added to the class-score bias after random init (zoo/common.py shift_score_bias says why):
# chosen so the files leave some detections above 0.05-0.3 on a real frame (MANIFEST.json "probe" records it).
# SSDlite is a softmax model: its entry is a gain on the class-logit weights instead (zoo/tv.py _sharpen).
SCORE_SHIFT: dict[tuple[str, bool], float] = {
    # (family, tiny): 640 / 320 files first, then the 160 tiny ones
    ("yolov8s", False): 6.0,
    ("yolo11s", False): 6.0,
    ("yolo26s", False): 4.0,
    ("yolov10s", False): 4.5,
    ("rtdetr-l", False): 1.5,
    ("rtdetr-l-raw", False): 1.5,
    ("yolox-s", False): 2.5,
    ("ssdlite", False): 1.5,
    ("tfod-ssdlite", False): 1.5,
    ("yolov8s", True): 7.0,
    ("yolo11s", True): 7.0,
    ("yolo26s", True): 6.5,
    ("yolov10s", True): 0.0,
    ("rtdetr-l", True): 2.0,
    ("rtdetr-l-raw", True): 2.0,
    ("yolox-s", True): 3.5,
    ("ssdlite", True): 5.0,
    ("tfod-ssdlite", True): 5.0,
}

if __name__ == "__main__":
    sys.exit(main())
