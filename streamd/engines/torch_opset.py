"""Opset 18 models for onnx2torch, which converts ops only up to their opset-17 definitions.

Opset 18 changed few ops (exporters write it by default now: Ultralytics' RT-DETR, torch ≥ 2.5): the Reduce*
family takes ``axes`` as an input instead of an attribute, ``Split`` gained ``num_outputs``, ``Pad`` an
``axes`` input. ``downgrade_18`` rewrites those nodes into their opset-13 form (constant ``axes`` back into
the attribute) and declares opset 17, where every other op keeps its definition; a node whose opset-18 form
has no such rewrite (a non-constant ``axes``, an op first defined or changed in 18 otherwise) is refused with
its name. The start-up check then compares the converted model with ONNX Runtime running the original file.
"""

from __future__ import annotations

from typing import Any

from streamd.engines.base import EngineError

REDUCE_18 = {
    "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare",
}  # fmt: skip
HANDLED = REDUCE_18 | {"Split", "Pad"}


def _constants(model: Any) -> dict[str, Any]:
    """Initializers and Constant node values by name, as numpy arrays."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def downgrade_18(model: Any) -> list[str]:
    """Rewrite ``model`` (in place) from opset 18 to 17 (module docstring); returns what was rewritten, e.g.
    ``["opset 18->17: ReduceMax x2, Split x4"]``; [] for a model of another opset."""
    from onnx import defs, helper

    opsets = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not opsets or opsets[0].version != 18:
        return []
    consts = _constants(model)
    counts: dict[str, int] = {}
    problems: list[str] = []
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        since = defs.get_schema(node.op_type, 18, "").since_version
        if since < 18:
            continue
        name = node.name or node.op_type
        if node.op_type in REDUCE_18:
            axes = node.input[1] if len(node.input) > 1 else ""
            noop = any(a.name == "noop_with_empty_axes" and a.i for a in node.attribute)
            if axes and axes not in consts:
                problems.append(f"{name}: {node.op_type} with computed axes")
                continue
            if not axes and noop:
                problems.append(f"{name}: {node.op_type} with noop_with_empty_axes")
                continue
            kept = [a for a in node.attribute if a.name != "noop_with_empty_axes"]
            del node.attribute[:]
            node.attribute.extend(kept)
            if axes:
                node.attribute.append(helper.make_attribute("axes", [int(v) for v in consts[axes].ravel()]))
                del node.input[1:]
        elif node.op_type == "Split":
            split = node.input[1] if len(node.input) > 1 else ""
            if not split:  # num_outputs: Split-13 splits evenly into as many outputs (checked against ORT)
                kept = [a for a in node.attribute if a.name != "num_outputs"]
                del node.attribute[:]
                node.attribute.extend(kept)
        elif node.op_type == "Pad":
            if len(node.input) > 3 and node.input[3]:
                problems.append(f"{name}: Pad with an axes input")
                continue
        else:
            problems.append(f"{name}: {node.op_type} as defined in opset 18")
            continue
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    if problems:
        raise EngineError(
            "the torch engine cannot run this opset-18 model as ONNX specifies it ("
            + "; ".join(problems[:4])
            + (" …" if len(problems) > 4 else "")
            + "); re-export with opset 17, or use engine.type: onnxruntime (or tensorrt)"
        )
    opsets[0].version = 17
    done = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))
    return [f"opset 18->17{': ' + done if done else ''}"]


def fold_static_topk(model: Any) -> int:
    """TopK whose K is computed in the graph (RT-DETR: ``min(300, anchors)`` from shapes) becomes TopK of a
    constant K when ONNX Runtime computes the same K at batch 1 and 2 (the input H/W are pinned by then), so
    the converted module reads a Python int: ``torch.topk`` takes no tensor K, and reading one from the GPU
    would stop CUDA graph capture. In place; returns how many TopK nodes were folded."""
    import copy

    import numpy as np
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    inits = {t.name for t in model.graph.initializer}
    computed = [n for n in model.graph.node if n.op_type == "TopK" and n.input[1] not in inits]
    if not computed:
        return 0
    probe = copy.deepcopy(model)
    for node in computed:
        probe.graph.output.append(helper.make_empty_tensor_value_info(node.input[1]))
    graph_input = next(i for i in model.graph.input if i.name not in inits)
    dims = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    names = [n.input[1] for n in computed]
    dtype = np.float16 if graph_input.type.tensor_type.elem_type == 10 else np.float32
    seen = []
    try:
        session = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for batch in (1, 2) if dims[0] <= 0 else (dims[0],):
            x = np.zeros((batch, *dims[1:]), dtype)
            seen.append(session.run(names, {graph_input.name: x}))
    except Exception:  # ONNX Runtime cannot probe it: K stays computed (the build-time check names it)
        return 0
    folded = 0
    for k, node in enumerate(computed):
        values = [np.asarray(run[k]) for run in seen]
        if any(v.shape != values[0].shape or (v != values[0]).any() for v in values):
            continue  # K follows the batch: leave it (the build-time check names it if it cannot run)
        name = f"{node.input[1]}__folded"
        model.graph.initializer.append(numpy_helper.from_array(values[0].astype(np.int64), name))
        node.input[1] = name
        folded += 1
    return folded
