"""Several outputs -> one: every engine runs a multi-output detector as a one-output model.

``pack_outputs`` appends to the graph, for each output in graph order, ``Reshape(x, [0, -1])`` and
``Cast(to=FLOAT)``, then one ``Concat(axis=1)``: the model's only output becomes ``streamd_outputs`` [B, R],
each image's row holding every output flattened, at the offsets listed in ``OutputPart``. The pipeline's
buffers, CUDA graphs, TensorRT bindings and start-up verification then handle one output as before, and the
postprocess reads each part at its offset (``streamd.stages.postprocess.head``). Casting class ids and counts
to float32 is exact below 2^24.

``prepare_io`` is what the engines call: the input H/W pinned (``fix_input_size``), then the outputs packed.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
from typing import Any

import numpy as np

from streamd.engines.base import EngineError, OutputPart
from streamd.engines.onnx_tools import ModelIO, _dims, fix_input_size, model_io
from streamd.exitcodes import EX_CONFIG

log = logging.getLogger(__name__)

PACK_RECIPE = "pack-v1"  # bump when the packed graph changes
PACKED_NAME = "streamd_outputs"


def prepare_io(
    model: Any,
    source: object = "model",
    input_size: tuple[int, int] | None = None,
    log_level: int = logging.INFO,
) -> tuple[Any, ModelIO, tuple[str, ...]]:
    """(model, io, steps): ``fix_input_size``, then ``pack_outputs`` for a model with several outputs (its
    ``io.parts`` then list them and ``steps`` ends with ``pack-v1``)."""
    model, io, steps = fix_input_size(model, source, input_size, log_level)
    if len(io.outputs) < 2:
        return model, io, steps
    packed, parts = pack_outputs(model, source)
    log.log(
        log_level,
        "%s: %d outputs (%s) run as one packed output %s",
        source,
        len(parts),
        ", ".join(p.name for p in parts),
        PACKED_NAME,
    )
    return (
        packed,
        replace(model_io(packed, source), parts=parts, dynamic_hw=io.dynamic_hw),
        (*steps, PACK_RECIPE),
    )


def per_image_shapes(model: Any) -> list[tuple[str, tuple[int, ...], tuple[int | str, ...]]]:
    """(name, per-image shape, dims as written) of every output; shapes from ONNX shape inference, or from one
    ONNX Runtime run at batch 1 where inference leaves a dimension open. A first axis that is not the batch
    is a config error."""
    import onnx

    io = model_io(model)
    batch = io.input_shape[0]
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph.output
    found = [(o.name, _dims(o)) for o in inferred]
    written = dict(io.outputs)
    for name, dims in found:
        first = dims[0] if dims else None
        fixed_mismatch = isinstance(first, int) and isinstance(batch, int) and first > 0 and first != batch
        if not dims or fixed_mismatch or (isinstance(batch, str) and isinstance(first, int) and first > 0):
            raise EngineError(
                f"model.path: output {name} {list(written.get(name, dims))} has no batch axis first "
                f"(input {list(io.input_shape)}): streamd runs batched detectors whose every output is "
                "[B, ...]; torchvision's own detection export (a list of images in, per-image results of "
                "varying length out) cannot batch: export the model without its postprocess (README: "
                "Bring your model)",
                EX_CONFIG,
            )
    if all(isinstance(d, int) and d > 0 for _, dims in found for d in dims[1:]):
        return [(n, tuple(int(d) for d in dims[1:]), written.get(n, dims)) for n, dims in found]
    shapes = _run_shapes(model, io)
    return [(n, shapes[n], written.get(n, dims)) for n, dims in found]


def _run_shapes(model: Any, io: ModelIO) -> dict[str, tuple[int, ...]]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    batch = io.batch or 1
    dtype = np.float16 if io.input_elem_type == 10 else np.float32
    x = np.zeros((batch, *io.chw), dtype)
    names = [o.name for o in session.get_outputs()]
    return {
        n: tuple(int(d) for d in y.shape[1:])
        for n, y in zip(names, session.run(names, {io.input_name: x}), strict=True)
    }


def pack_outputs(model: Any, source: object = "model") -> tuple[Any, tuple[OutputPart, ...]]:
    """A copy of ``model`` whose outputs are packed into one [B, R] float32 output (module docstring)."""
    from onnx import TensorProto, helper, numpy_helper

    shapes = per_image_shapes(model)
    m = copy.deepcopy(model)
    graph = m.graph
    batch_dim = model_io(model).input_shape[0]
    flat_shape = numpy_helper.from_array(np.array([0, -1], np.int64), f"{PACKED_NAME}__flat")
    graph.initializer.append(flat_shape)
    pieces, parts, offset = [], [], 0
    for k, (name, shape, dims) in enumerate(shapes):
        flat, cast = f"{name}__{PACKED_NAME}_flat", f"{name}__{PACKED_NAME}_f32"
        # Named nodes: converters such as onnx2torch key their modules by node name.
        graph.node.append(
            helper.make_node("Reshape", [name, flat_shape.name], [flat], f"{PACKED_NAME}/flat{k}")
        )
        graph.node.append(
            helper.make_node("Cast", [flat], [cast], f"{PACKED_NAME}/cast{k}", to=TensorProto.FLOAT)
        )
        pieces.append(cast)
        part = OutputPart(name, shape, offset, dims)
        parts.append(part)
        offset += part.size
    graph.node.append(helper.make_node("Concat", pieces, [PACKED_NAME], f"{PACKED_NAME}/concat", axis=1))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(PACKED_NAME, TensorProto.FLOAT, [batch_dim, offset]))
    log.debug("%s: packed %d outputs into %s [%s, %d]", source, len(parts), PACKED_NAME, batch_dim, offset)
    return m, tuple(parts)
