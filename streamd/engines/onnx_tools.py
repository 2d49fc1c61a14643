"""ONNX graph preparation shared by the engines: identity, batch, FP16 conversion, simplification.

Every function takes and returns an ``onnx.ModelProto`` and never changes its argument. What was done is
named by a short "recipe" string that goes into engine cache keys, so a change here that alters the result
must change the recipe's version suffix.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from streamd.engines.base import EngineError, OutputPart
from streamd.exitcodes import EX_CONFIG

log = logging.getLogger(__name__)

FP16_RECIPE = "fp16-io32-v1"  # convert_to_fp16: float tensors to FP16, graph inputs/outputs kept FP32
DYNAMIC_BATCH_RECIPE = "dynbatch-v1"  # make_batch_dynamic
FIXED_SIZE_RECIPE = "hw{w}x{h}-v1"  # fix_input_size: dynamic input H/W pinned at model.input_size
FP16_MAX = 65504.0

# Inputs that the ONNX spec types as float32 whatever the data type (Resize/Upsample scales; roi kept too).
_FP32_ONLY_INPUTS: dict[str, tuple[int, ...]] = {"Resize": (1, 2), "Upsample": (1,)}
_QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelIO:
    """The single input and output of a detector model. Dims are ints, or strings for symbolic ones.

    ``input_shape`` has H and W resolved: a dynamic H or W (symbolic, -1 or 0) is the size the model runs at
    (``model.input_size``); ``dynamic_hw`` names the ones the file leaves open (``("H", "W")``, or ``()``)."""

    input_name: str
    input_shape: tuple[int | str, ...]
    input_elem_type: int
    output_name: str  # the first output (the only one once ``onnx_outputs.pack_outputs`` ran)
    output_shape: tuple[int | str, ...]
    dynamic_hw: tuple[str, ...] = ()
    outputs: tuple[tuple[str, tuple[int | str, ...]], ...] = ()  # every output: (name, dims), graph order
    parts: tuple[OutputPart, ...] = ()  # a packed model's outputs (``onnx_outputs``); () for one output

    @property
    def batch(self) -> int | None:
        """The fixed batch size, or None when the batch dimension is dynamic."""
        first = self.input_shape[0]
        return first if isinstance(first, int) and first > 0 else None

    @property
    def chw(self) -> tuple[int, int, int]:
        c, h, w = self.input_shape[1:]
        return int(c), int(h), int(w)


def _dims(value_info: Any) -> tuple[int | str, ...]:
    dims: list[int | str] = []
    for d in value_info.type.tensor_type.shape.dim:
        dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?"))
    return tuple(dims)


def load(path: Path) -> Any:
    """Load an ONNX file (with external data next to it, if any); raise ``EngineError`` if unreadable."""
    import onnx

    try:
        return onnx.load(str(path))
    except Exception as exc:  # protobuf raises DecodeError, OSError, ...
        raise EngineError(f"model.path: cannot read ONNX model {path}: {exc}", EX_CONFIG) from exc


def _fixed(dim: int | str) -> bool:
    return isinstance(dim, int) and dim > 0


def model_io(model: Any, source: object = "model", input_size: tuple[int, int] | None = None) -> ModelIO:
    """Check the detector contract (one input [B, C, H, W] with a fixed C; outputs) and describe it.

    A dynamic H or W (symbolic, -1 or 0: e.g. Ultralytics' ``dynamic=True`` export, ``[batch, 3, height,
    width]``) takes its value from ``input_size`` ((width, height): ``model.input_size``); without one it is
    a config error naming ``model.input_size``. A fixed H or W is kept as the file says (the caller compares
    it with the config)."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    if len(inputs) != 1 or not graph.output:
        raise EngineError(
            f"model.path: expected a model with one input and at least one output, got {len(inputs)} inputs "
            f"and {len(graph.output)} outputs ({source})",
            EX_CONFIG,
        )
    shape = _dims(inputs[0])
    if len(shape) != 4 or not _fixed(shape[1]):
        hint = (
            "; it takes one image [C, H, W]: torchvision's own detection export (a list of images in, "
            "per-image results of varying length out) cannot batch, export the batched head instead "
            "(README: Bring your model)"
            if len(shape) == 3
            else ""
        )
        raise EngineError(
            f"model input: expected [B, C, H, W] with a fixed C; got {list(shape)} ({source}){hint}",
            EX_CONFIG,
        )
    dynamic = tuple(axis for axis, d in zip("HW", shape[2:], strict=True) if not _fixed(d))
    if dynamic and input_size is None:
        raise EngineError(
            f"model.input_size: the model's input {', '.join(dynamic)} {'are' if len(dynamic) > 1 else 'is'} "
            f"dynamic ({list(shape)}, {source}); set model.input_size: [width, height], the size it runs at "
            "(the size it was exported or trained at, e.g. [640, 640])",
            EX_CONFIG,
        )
    if dynamic and input_size is not None:
        w, h = input_size
        shape = (
            *shape[:2],
            shape[2] if _fixed(shape[2]) else int(h),
            shape[3] if _fixed(shape[3]) else int(w),
        )
    return ModelIO(
        inputs[0].name,
        shape,
        inputs[0].type.tensor_type.elem_type,
        graph.output[0].name,
        _dims(graph.output[0]),
        dynamic,
        tuple((o.name, _dims(o)) for o in graph.output),
    )


def fix_input_size(
    model: Any,
    source: object = "model",
    input_size: tuple[int, int] | None = None,
    log_level: int = logging.INFO,
) -> tuple[Any, ModelIO, tuple[str, ...]]:
    """(model, io, steps): a model whose input H/W are dynamic comes back as a copy with them pinned at
    ``input_size`` ((width, height)), so every engine builds, converts and runs it at one size (onnxslim
    folds its shape arithmetic, CUDA graphs and TensorRT profiles see one shape); ``steps`` then names the
    recipe (``hw<W>x<H>-v1``) and one line is logged at ``log_level``. Any other model comes back as is, with
    no step."""
    io = model_io(model, source, input_size)
    if not io.dynamic_hw:
        return model, io, ()
    m = copy.deepcopy(model)
    _, _, h, w = io.input_shape
    for vi in m.graph.input:
        if vi.name == io.input_name:
            dims = vi.type.tensor_type.shape.dim
            for index, value in ((2, h), (3, w)):
                dims[index].Clear()
                dims[index].dim_value = int(value)
    del m.graph.value_info[:]  # intermediate shapes named after the free dims; inference recomputes them
    log.log(
        log_level,
        "%s: input %s dynamic; it runs at model.input_size [%s, %s]",
        source,
        ", ".join(io.dynamic_hw),
        w,
        h,
    )
    return m, replace(model_io(m, source), dynamic_hw=io.dynamic_hw), (FIXED_SIZE_RECIPE.format(w=w, h=h),)


def has_qdq(model: Any) -> bool:
    """True for an explicitly quantised (Q/DQ) model, the only kind of INT8 model streamd builds."""
    return any(node.op_type in _QDQ_OPS for node in model.graph.node)


def _has_subgraphs(model: Any) -> bool:
    import onnx

    return any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for n in model.graph.node
        for a in n.attribute
    )


# ------------------------------------------------------------------------------------------------------------
# Dynamic batch


def make_batch_dynamic(model: Any, dim_name: str = "batch") -> Any | None:
    """A copy of a fixed-batch-1 model whose batch dimension is symbolic, or None if that cannot be shown.

    Shape inference runs with a probe batch (a prime no real dimension is likely to equal); Reshape targets
    whose leading 1 meets that probe in their data input become 0 ("copy the input's dim"), until the probe
    reaches the output. Callers should still compare outputs numerically (``verify_batch_dynamic``).
    """
    import onnx
    from onnx import numpy_helper

    io = model_io(model)
    if io.batch != 1:
        return None
    m = copy.deepcopy(model)
    graph = m.graph
    probe = 97
    init_by_name = {t.name: t for t in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1

    def set_batch(value: int | str) -> None:
        for vi in (*[i for i in graph.input if i.name == io.input_name], graph.output[0]):
            dims = vi.type.tensor_type.shape.dim
            if len(dims):
                dims[0].Clear()
                if isinstance(value, int):
                    dims[0].dim_value = value
                else:
                    dims[0].dim_param = value

    set_batch(probe)
    graph.output[0].type.tensor_type.shape.dim[0].Clear()
    del graph.value_info[:]
    for _ in range(len(graph.node) + 1):  # fixpoint: each round may carry the probe to later Reshapes
        inferred = onnx.shape_inference.infer_shapes(m)
        shapes = {vi.name: _dims(vi) for vi in (*inferred.graph.value_info, *inferred.graph.input)}
        changed = False
        for node in graph.node:
            if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] not in init_by_name:
                continue
            target = numpy_helper.to_array(init_by_name[node.input[1]])
            data_shape = shapes.get(node.input[0], ())
            if target.size and target[0] == 1 and data_shape and data_shape[0] == probe:
                fixed = target.copy()
                fixed[0] = 0
                name = node.input[1]
                if uses.get(name, 0) > 1:  # shared constant: this node gets its own copy
                    name = f"{name}__{dim_name}{len(init_by_name)}"
                    node.input[1] = name
                tensor = numpy_helper.from_array(fixed, name)
                if name in init_by_name:
                    init_by_name[name].CopyFrom(tensor)
                else:
                    graph.initializer.append(tensor)
                    init_by_name[name] = graph.initializer[-1]
                changed = True
        if not changed:
            break
    out_shape = _dims(onnx.shape_inference.infer_shapes(m).graph.output[0])
    if not out_shape or out_shape[0] != probe:
        return None
    set_batch(dim_name)
    return m


def verify_batch_dynamic(original: Any, dynamic: Any, batch: int = 2, atol: float = 1e-4) -> bool:
    """Run ``dynamic`` on a batch and ``original`` per image with ONNX Runtime (CPU); True if outputs
    agree."""
    import onnxruntime as ort

    io = model_io(original)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *io.chw)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    one = ort.InferenceSession(original.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    many = ort.InferenceSession(dynamic.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ref = np.concatenate([one.run(None, {io.input_name: x[i : i + 1]})[0] for i in range(batch)])
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # a failing run is an answer here, not an error to print
    try:
        got = many.run(None, {io.input_name: x}, quiet)[0]
    except Exception as exc:  # e.g. a Reshape to a fixed element count: the rewrite does not hold
        log.debug("batch-dynamic rewrite fails at batch %d: %s", batch, exc)
        return False
    return got.shape == ref.shape and bool(np.allclose(got, ref, atol=atol, rtol=1e-4))


# ------------------------------------------------------------------------------------------------------------
# FP16


def convert_to_fp16(model: Any) -> Any:
    """A copy of ``model`` computing in FP16 with its graph inputs and outputs still FP32.

    Float32 initializers, Constant values and tensor attributes become FP16 (values beyond ±65504 clamp, ±inf
    stays), ``Cast(to=FLOAT)`` becomes ``Cast(to=FLOAT16)``; a Cast to FP16 follows each float input and a
    Cast back to FP32 precedes each float output. Inputs the ONNX spec requires in FP32 (Resize scales/roi)
    stay FP32. TensorRT 11 builds this strongly typed network as FP16 (it has no FP16 builder flag).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if _has_subgraphs(model):
        raise EngineError("fp16: models with If/Loop/Scan subgraphs are not supported by the FP16 conversion")
    m = copy.deepcopy(model)
    graph = m.graph
    F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
    clamped = 0

    def to_fp16(array: np.ndarray) -> np.ndarray:
        nonlocal clamped
        finite = np.isfinite(array)
        big = finite & (np.abs(array) > FP16_MAX)
        clamped += int(big.sum())
        return np.where(big, np.sign(array) * FP16_MAX, array).astype(np.float16)

    keep32: set[str] = set()  # tensor names that must stay FP32
    for node in graph.node:
        for index in _FP32_ONLY_INPUTS.get(node.op_type, ()):
            if index < len(node.input) and node.input[index]:
                keep32.add(node.input[index])
    # Keep-FP32 names used anywhere else get an FP16 twin so the other consumers see FP16.
    for init in list(graph.initializer):
        if init.data_type != F32:
            continue
        array = numpy_helper.to_array(init)
        if init.name in keep32:
            other = [n for n in graph.node if init.name in n.input and n.op_type not in _FP32_ONLY_INPUTS]
            if other:
                twin = f"{init.name}__fp16"
                graph.initializer.append(numpy_helper.from_array(to_fp16(array), twin))
                for n in other:
                    n.input[:] = [twin if x == init.name else x for x in n.input]
            continue
        init.CopyFrom(numpy_helper.from_array(to_fp16(array), init.name))
    for node in graph.node:
        if node.op_type == "Cast":
            for attr in node.attribute:
                if attr.name == "to" and attr.i == F32 and node.output[0] not in keep32:
                    attr.i = F16
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == F32:
                if node.op_type == "Constant" and node.output[0] in keep32:
                    continue
                attr.t.CopyFrom(numpy_helper.from_array(to_fp16(numpy_helper.to_array(attr.t)), attr.t.name))
    # Graph inputs: cast to FP16 right after the input.
    initializer_names = {t.name for t in graph.initializer}
    new_nodes = []
    for inp in graph.input:
        if inp.name in initializer_names or inp.type.tensor_type.elem_type != F32:
            continue
        cast_out = f"{inp.name}__fp16"
        for node in graph.node:
            node.input[:] = [cast_out if x == inp.name else x for x in node.input]
        new_nodes.append(
            helper.make_node("Cast", [inp.name], [cast_out], name=f"{inp.name}__to_fp16", to=F16)
        )
    # Graph outputs: produced as FP16 under a new name, cast back to FP32 under the original name.
    tail_nodes = []
    for out in graph.output:
        if out.type.tensor_type.elem_type != F32:
            continue
        inner = f"{out.name}__fp16"
        for node in graph.node:
            node.output[:] = [inner if x == out.name else x for x in node.output]
            node.input[:] = [inner if x == out.name else x for x in node.input]
        tail_nodes.append(helper.make_node("Cast", [inner], [out.name], name=f"{out.name}__to_fp32", to=F32))
    # FP32-only inputs fed by computed tensors (now FP16): cast them back.
    produced = {o for n in graph.node for o in n.output}
    fix_nodes: list[tuple[Any, Any]] = []
    for node in graph.node:
        for index in _FP32_ONLY_INPUTS.get(node.op_type, ()):
            if index < len(node.input) and node.input[index] in produced:
                name = node.input[index]
                producer = next(n for n in graph.node if name in n.output)
                if producer.op_type == "Constant":
                    continue
                cast_out = f"{name}__fp32_{node.name or len(fix_nodes)}"
                fix_nodes.append((node, helper.make_node("Cast", [name], [cast_out], to=F32)))
                node.input[index] = cast_out
    ordered = list(new_nodes)
    for node in graph.node:
        ordered.extend(cast for target, cast in fix_nodes if target is node)
        ordered.append(node)
    ordered.extend(tail_nodes)
    del graph.node[:]
    graph.node.extend(ordered)
    del graph.value_info[:]  # element types changed; shape inference recomputes them
    if clamped:
        log.warning("fp16: %d weight values beyond ±%g were clamped", clamped, FP16_MAX)
    try:
        onnx.checker.check_model(m, full_check=True)
    except Exception as exc:  # checker raises ValidationError / InferenceError
        raise EngineError(f"fp16: the converted model does not type-check: {exc}") from exc
    return m


# ------------------------------------------------------------------------------------------------------------
# Simplification


def slim(model: Any) -> tuple[Any, str | None]:
    """Fold constants and static shape computations with onnxslim, if installed.

    Returns (model, recipe): recipe is ``onnxslim-<version>`` when it ran, None when onnxslim is missing or
    failed (the original model is returned then).
    """
    try:
        import onnxslim
    except ImportError:
        return model, None
    try:
        slimmed = onnxslim.slim(copy.deepcopy(model))
    except Exception as exc:  # onnxslim raises whatever its passes raise
        log.warning("onnxslim failed, using the model as is: %s", exc)
        return model, None
    return slimmed, f"onnxslim-{getattr(onnxslim, '__version__', 'unknown')}"
