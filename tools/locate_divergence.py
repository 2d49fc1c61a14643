"""Find the first ONNX node whose torch translation computes something else than ONNX Runtime.

Every float output of every single-output node becomes a graph output; the model then runs through ONNX
Runtime CPU and through the torch engine's conversion (onnxslim, streamd's rewrites, onnx2torch) on one real
frame (samples/vtest.mp4 frame 0, stretched, preprocessed as given), and the intermediate tensors are compared
in graph order. The first node whose output differs beyond ``--tol`` (relative to its largest value) while
all its inputs agree is the culprit; its op type and attributes are printed.

    python tools/locate_divergence.py models/centernet-mbv3-coco.onnx --rgb --std 1 1 1
    python tools/locate_divergence.py models/centernet-mbv3-coco.onnx --rgb --std 1 1 1 --no-rewrite  # before

Use it when the start-up check (streamd.checks.verify) refuses a torch engine.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
_COMPARISONS = {"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "ArgMax", "ArgMin"}
sys.path.insert(0, str(REPO))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--rgb", action="store_true", help="channel order rgb (default bgr)")
    p.add_argument("--mean", type=float, nargs=3, default=(0.0, 0.0, 0.0))
    p.add_argument("--std", type=float, nargs=3, default=(255.0, 255.0, 255.0))
    p.add_argument("--tol", type=float, default=1e-3, help="relative error that counts as diverging")
    p.add_argument("--no-rewrite", action="store_true", help="onnx2torch alone (without streamd's rewrites)")
    args = p.parse_args()

    import cv2
    import onnx
    import onnxruntime as ort
    import torch

    from streamd.engines import onnx_tools, torch_ops
    from streamd.engines.torch import convert_onnx
    from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec

    if args.no_rewrite:
        torch_ops.rewrite_for_torch = lambda model: (model, [])  # type: ignore[assignment]
    model = onnx_tools.load(args.model)
    io = onnx_tools.model_io(model, args.model)
    model, _ = onnx_tools.slim(model)  # the graph the engine converts; node names as it sees them
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi for vi in (*inferred.graph.value_info, *inferred.graph.output)}
    probe = copy.deepcopy(model)
    existing = {o.name for o in probe.graph.output}
    order: list[tuple[str, str]] = []  # (tensor, node) in graph order
    for node in probe.graph.node:
        if len(node.output) != 1 or node.output[0] not in types:
            continue
        vi = types[node.output[0]]
        if vi.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            continue
        order.append((node.output[0], node.name or node.op_type))
        if node.output[0] not in existing:
            probe.graph.output.append(vi)
    c, h, w = io.chw
    spec = PreprocessSpec(w, h, "rgb" if args.rgb else "bgr", tuple(args.mean), tuple(args.std), "stretch")
    ok, frame = cv2.VideoCapture(str(REPO / "samples" / "vtest.mp4")).read()
    assert ok, "samples/vtest.mp4"
    x = np.empty((1, c, h, w), np.float32)
    CpuPreprocessor(spec)(frame, x[0])
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    ref = dict(zip(names, session.run(None, {io.input_name: x}), strict=True))
    module, steps = convert_onnx(probe, args.model.name)
    with torch.inference_mode():
        out = module(torch.from_numpy(x))
    outs = out if isinstance(out, (tuple, list)) else [out]
    got = {n: o.numpy() for n, o in zip(names, outs, strict=True)}
    print(f"{args.model.name}: {len(order)} float node outputs compared; conversion steps {list(steps)}")
    nodes = {n.output[0]: n for n in probe.graph.node if len(n.output) == 1}
    bad: set[str] = set()
    first = None
    for tensor, _name in order:
        r, g = ref[tensor], got[tensor]
        err = float(np.abs(r.astype(np.float64) - g).max()) if r.shape == g.shape else float("inf")
        scale = max(float(np.abs(r).max()), 1e-6)
        if err > args.tol * scale:
            node = nodes[tensor]
            inputs_ok = not any(i in bad for i in node.input)
            bad.add(tensor)
            if inputs_ok and first is None:
                first = (node, err, scale)
    if first is None:
        print("no diverging node: the conversion computes what ONNX Runtime computes on this frame")
        return 0
    final = io.output_name
    final_err = (
        float(np.abs(ref[final].astype(np.float64) - got[final]).max()) if final in got else float("nan")
    )
    node, err, scale = first
    upstream = [n for n in probe.graph.node if n.output and any(o == node.input[0] for o in n.output)]
    if (upstream and upstream[0].op_type in _COMPARISONS) or node.op_type in _COMPARISONS:
        print(
            f"note: {node.name!r} follows a float comparison ({(upstream or [node])[0].op_type}): "
            "a rounding-level difference in its inputs flips single elements; judge by the final output "
            f"({final}: max abs error {final_err:.4g})"
        )
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
    print(f"first diverging node: {node.name!r} ({node.op_type}) max abs error {err:.4g} (scale {scale:.4g})")
    print(f"  attributes: {attrs}")
    print(f"  inputs (all agree): {list(node.input)}")
    print(
        f"  {len(bad)} of {len(order)} node outputs differ from there on; final output {final}: max abs "
        f"error {final_err:.4g}"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
