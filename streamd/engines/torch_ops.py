"""Where onnx2torch's translation of an ONNX op differs from the ONNX spec, streamd's own version of the op.

``rewrite_for_torch`` is the ONNX-level step run just before onnx2torch: every ``Resize`` node is moved to the
``streamd`` domain, whose converter (registered here) builds ``ExactResize``. onnx2torch maps ``Resize``
onto ``torch.nn.functional.interpolate``, which has one coordinate convention per mode, so a ``linear`` Resize
with ``coordinate_transformation_mode: asymmetric`` (what tf2onnx writes for TensorFlow's ``ResizeBilinear``
with ``align_corners=False, half_pixel_centers=False``) samples half a pixel off, and ``nearest`` ignores
``nearest_mode`` and the coordinate mode. onnx2torch only warns; the model then runs and detects the wrong
boxes. ``ExactResize`` implements the ONNX formula for every coordinate mode and ``nearest`` (every
``nearest_mode``), ``linear`` and ``cubic`` (``cubic_coeff_a``, ``exclude_outside``), ``tf_crop_and_resize``
with its ``extrapolation_value``, as a separable gather + weighted sum per resized axis (index tables built on
the host once per input shape, so CUDA graphs capture it); the resizes whose formula ``F.interpolate``
computes itself (bilinear half_pixel / align_corners, nearest asymmetric-floor by powers of two) go to it.

``check_convertible`` names every op (and op mode) the torch engine cannot run, at build time, instead of a
silently different result. The recipe string ``TORCH_REWRITE_RECIPE`` goes into cache keys and verdicts.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from typing import Any

from streamd.engines.base import EngineError
from streamd.engines.torch_opset import downgrade_18, fold_static_topk
from streamd.engines.torch_resize import exact_resize_class, grid_sample_class

log = logging.getLogger(__name__)

DOMAIN = "streamd"
TORCH_REWRITE_RECIPE = "torch-rewrite-v4"  # bump when a rewrite changes results

_COORD_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


_REGISTERED = False


def register_converters() -> None:
    """Register the ``streamd`` converters with onnx2torch (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from onnx2torch.node_converters.registry import add_converter
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    resize_cls = exact_resize_class()
    GridSample = grid_sample_class()

    @add_converter(operation_type="Resize", version=1, domain=DOMAIN)
    def _resize(node: Any, graph: Any) -> Any:
        a = node.attributes
        module = resize_cls(
            mode=a.get("mode", "nearest"),
            coord=a.get("coordinate_transformation_mode", "half_pixel"),
            nearest_mode=a.get("nearest_mode", "round_prefer_floor"),
            cubic_a=float(a.get("cubic_coeff_a", -0.75)),
            exclude_outside=bool(a.get("exclude_outside", 0)),
            extrapolation_value=float(a.get("extrapolation_value", 0.0)),
        )
        return OperationConverterResult(torch_module=module, onnx_mapping=onnx_mapping_from_node(node))

    @add_converter(operation_type="LayerNormalization", version=1, domain=DOMAIN)
    def _layer_norm(node: Any, graph: Any) -> Any:
        from onnx2torch.node_converters.layer_norm import OnnxLayerNorm

        a = node.attributes  # normalized_shape from the input at run time, not from (symbolic) value_info
        module = OnnxLayerNorm(axis=a.get("axis", -1), epsilon=a.get("epsilon", 1e-5))
        return OperationConverterResult(torch_module=module, onnx_mapping=onnx_mapping_from_node(node))

    @add_converter(operation_type="GridSample", version=1, domain=DOMAIN)
    def _grid_sample(node: Any, graph: Any) -> Any:
        a = node.attributes
        module = GridSample(
            _GRID_MODES[a.get("mode", "bilinear")],
            a.get("padding_mode", "zeros"),
            bool(a.get("align_corners", 0)),
        )
        return OperationConverterResult(torch_module=module, onnx_mapping=onnx_mapping_from_node(node))

    _REGISTERED = True


# ------------------------------------------------------------------------------------------------------------
# The ONNX rewrite and the build-time check


def _resize_problem(node: Any, opset: int) -> str | None:
    mode = _attr(node, "mode", "nearest")
    coord = _attr(node, "coordinate_transformation_mode", "half_pixel")
    nearest = _attr(node, "nearest_mode", "round_prefer_floor")
    if opset < 11:
        return f"Resize from opset {opset} (before 11) is not supported; re-export with opset ≥ 11"
    if mode not in ("nearest", "linear", "cubic"):
        return f"Resize mode {mode!r} is not supported"
    if coord not in _COORD_MODES:
        return f"Resize coordinate_transformation_mode {coord!r} is not supported"
    if mode == "nearest" and nearest not in _NEAREST_MODES:
        return f"Resize nearest_mode {nearest!r} is not supported"
    if _attr(node, "antialias", 0):
        return "Resize with antialias=1 is not supported"
    if _attr(node, "axes", None):
        return "Resize with the axes attribute is not supported"
    if _attr(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        return "Resize keep_aspect_ratio_policy other than stretch is not supported"
    return None


def rewrite_for_torch(model: Any) -> tuple[Any, list[str]]:
    """A copy of ``model`` with the ops onnx2torch gets wrong moved to streamd's converters; returns (model,
    what was rewritten, e.g. ``["Resize x3 (linear/asymmetric)"]``). Raises ``EngineError`` for a mode that
    neither supports."""
    import copy

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    m = copy.deepcopy(model)
    topk = fold_static_topk(m)  # ONNX Runtime runs it: before any node moves to the streamd domain
    counts: dict[str, int] = {}
    shapes: dict[str, tuple[int | None, ...]] | None = None
    for node in m.graph.node:
        auto_pad = _attr(node, "auto_pad", "NOTSET")
        if node.op_type in _AUTO_PAD_OPS and node.domain in ("", "ai.onnx") and auto_pad != "NOTSET":
            if shapes is None:
                shapes = _static_shapes(m)
            _explicit_pads(node, auto_pad, shapes.get(node.input[0]), m)
            counts[f"auto_pad {auto_pad}"] = counts.get(f"auto_pad {auto_pad}", 0) + 1
    for node in m.graph.node:
        if node.op_type != "Resize" or node.domain not in ("", "ai.onnx"):
            continue
        problem = _resize_problem(node, opset)
        if problem:
            raise EngineError(f"torch engine: node {node.name!r}: {problem}")
        node.domain = DOMAIN
        kind = (
            f"{_attr(node, 'mode', 'nearest')}/{_attr(node, 'coordinate_transformation_mode', 'half_pixel')}"
        )
        counts[kind] = counts.get(kind, 0) + 1
    clips = _clip_inputs(m)
    grid = norms = 0
    for node in m.graph.node:
        # onnx2torch's LayerNormalization reads its normalized shape from value_info, 0 where a dim is
        # symbolic (transformer heads behind a dynamic batch): streamd's takes it from the input when run.
        if node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx"):
            node.domain = DOMAIN
            norms += 1
        # onnx2torch has no GridSample (RT-DETR's deformable attention)
        if node.op_type == "GridSample" and node.domain in ("", "ai.onnx"):
            problem = _grid_sample_problem(node)
            if problem:
                raise EngineError(f"torch engine: node {node.name!r}: {problem}")
            node.domain = DOMAIN
            grid += 1
    if (counts or grid or norms) and not any(o.domain == DOMAIN for o in m.opset_import):
        m.opset_import.add(domain=DOMAIN, version=1)
    done = [
        f"{kind} x{n}" if kind.startswith("auto_pad") else f"Resize x{n} ({kind})"
        for kind, n in sorted(counts.items())
    ]
    done += [f"GridSample x{grid}"] if grid else []
    done += [f"LayerNormalization x{norms}"] if norms else []
    done += [f"TopK x{topk} (K folded)"] if topk else []
    done += [f"Clip x{clips} (absent min/max)"] if clips else []
    return m, done + downgrade_18(m)


def _clip_inputs(model: Any) -> int:
    """onnx2torch reads Clip's min/max as constants and fails on an absent one written as an empty name
    (``Clip(x, "", max)``, ``Clip(x, min, "")``): trailing empty inputs are dropped, an empty min before a
    max becomes a -inf constant. Returns how many nodes changed."""
    import numpy as np
    from onnx import numpy_helper

    changed = 0
    neg_inf = f"{DOMAIN}__clip_min_neg_inf"
    for node in model.graph.node:
        if node.op_type != "Clip" or node.domain not in ("", "ai.onnx") or "" not in node.input[1:]:
            continue
        while len(node.input) > 1 and node.input[-1] == "":
            del node.input[-1]
        if len(node.input) == 3 and node.input[1] == "":
            if not any(t.name == neg_inf for t in model.graph.initializer):
                model.graph.initializer.append(
                    numpy_helper.from_array(np.array(-np.inf, np.float32), neg_inf)
                )
            node.input[1] = neg_inf
        changed += 1
    return changed


def _grid_sample_problem(node: Any) -> str | None:
    mode = _attr(node, "mode", "bilinear")
    if mode not in _GRID_MODES:
        return f"GridSample mode {mode!r} is not supported"
    if _attr(node, "padding_mode", "zeros") not in ("zeros", "border", "reflection"):
        return f"GridSample padding_mode {_attr(node, 'padding_mode', 'zeros')!r} is not supported"
    return None


_GRID_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest", "bicubic": "bicubic",
               "cubic": "bicubic"}  # fmt: skip


_AUTO_PAD_OPS = ("Conv", "MaxPool", "AveragePool", "LpPool")


def _static_shapes(model: Any) -> dict[str, tuple[int | None, ...]]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes: dict[str, tuple[int | None, ...]] = {}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
    return shapes


def _explicit_pads(node: Any, auto_pad: str, shape: tuple[int | None, ...] | None, model: Any) -> None:
    """Replace ``auto_pad`` SAME_UPPER/SAME_LOWER/VALID (onnx2torch implements none of them for strided
    ops) by the explicit ``pads`` the ONNX spec defines: total = max(0, (ceil(in / s) - 1)·s + (k - 1)·d + 1
    - in), the odd pixel at the end (SAME_UPPER) or the beginning (SAME_LOWER)."""
    from onnx import helper, numpy_helper

    if auto_pad == "VALID":
        spatial = len(_attr(node, "kernel_shape", []) or [])
        if not spatial:
            inits = {t.name: t for t in model.graph.initializer}
            spatial = (
                len(numpy_helper.to_array(inits[node.input[1]]).shape) - 2 if node.input[1] in inits else 0
            )
        pads = [0] * (2 * spatial)
    else:
        if shape is None or len(shape) < 3 or any(d is None for d in shape[2:]):
            raise EngineError(
                f"torch engine: node {node.name!r}: auto_pad {auto_pad} needs a static input shape "
                f"(got {list(shape) if shape else 'unknown'}); re-export with explicit pads"
            )
        size = [int(d) for d in shape[2:] if d is not None]
        kernel = list(_attr(node, "kernel_shape", []) or [])
        if not kernel:  # Conv: from the weight's shape
            inits = {t.name: t for t in model.graph.initializer}
            if node.input[1] not in inits:
                raise EngineError(f"torch engine: node {node.name!r}: auto_pad with a computed weight")
            kernel = list(numpy_helper.to_array(inits[node.input[1]]).shape[2:])
        n = len(size)
        strides = list(_attr(node, "strides", None) or [1] * n)
        dilations = list(_attr(node, "dilations", None) or [1] * n)
        begin, end = [], []
        for i in range(n):
            out = -(-size[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size[i])
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
        pads = begin + end
    kept = [a for a in node.attribute if a.name not in ("auto_pad", "pads")]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.append(helper.make_attribute("pads", pads))


# op type -> reason: ops whose onnx2torch translation is known to differ from the ONNX spec in a way no
# rewrite above fixes. Found by tests/engines/test_op_coverage.py.
KNOWN_WRONG: dict[str, str] = {}


def _gather_nd_problem(node: Any) -> str | None:
    if _attr(node, "batch_dims", 0):
        return "GatherND with batch_dims != 0 (onnx2torch implements batch_dims 0 only)"
    return None


def _pad_problem(node: Any) -> str | None:
    mode = _attr(node, "mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        return f"Pad mode {mode!r}"
    return None


# op type -> check(node) -> reason or None: modes onnx2torch accepts at conversion but cannot run as specified
MODE_CHECKS = {"GatherND": _gather_nd_problem, "Pad": _pad_problem}


def torchvision_usable() -> bool:
    """True when the real torchvision is imported (not streamd's stand-in or another stub)."""
    tv = sys.modules.get("torchvision")
    if tv is None:
        try:
            tv = importlib.import_module("torchvision")
        except Exception:  # broken beside this torch
            return False
    return bool(getattr(tv, "__file__", None)) and not getattr(tv, "__streamd_standin__", False)


def check_convertible(model: Any) -> None:
    """Raise ``EngineError`` naming every op of ``model`` the torch engine cannot run as the ONNX spec says
    (no onnx2torch converter, or a mode known to be translated wrongly). Call on the rewritten model."""
    from onnx2torch.node_converters.registry import get_converter

    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    standin = not torchvision_usable()
    problems: dict[str, list[str]] = {}
    for node in model.graph.node:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        reason = KNOWN_WRONG.get(node.op_type) if domain in ("", "ai.onnx") else None
        if reason is None and standin and node.op_type in ("NonMaxSuppression", "RoiAlign"):
            reason = f"{node.op_type} needs torchvision, which does not load beside this torch"
        if reason is None and domain == "" and node.op_type in MODE_CHECKS:
            reason = MODE_CHECKS[node.op_type](node)
        if reason is None:
            try:
                get_converter(operation_type=node.op_type, version=opsets.get(domain, 1), domain=domain)
            except NotImplementedError:
                reason = f"no onnx2torch converter for {node.op_type} (opset {opsets.get(domain, '?')})"
        if reason is not None:
            problems.setdefault(reason, []).append(node.name or node.op_type)
    if problems:
        lines = "; ".join(
            f"{reason}: {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
            for reason, names in problems.items()
        )
        raise EngineError(
            f"the torch engine cannot run this model as ONNX specifies it ({lines}); "
            "use engine.type: onnxruntime (or tensorrt)"
        )


# ------------------------------------------------------------------------------------------------------------
# onnx2torch import


def import_onnx2torch() -> Any:
    """``import onnx2torch``; where the installed torchvision cannot load beside this torch (PyPI's
    torchvision next to a CPU-only torch wheel), torchvision is replaced by a stand-in whose ops raise, so
    models without NonMaxSuppression/RoiAlign still convert. Registers streamd's converters."""
    try:
        module = importlib.import_module("onnx2torch")
    except ImportError:
        raise
    except Exception as exc:  # torchvision's import raises RuntimeError ("operator torchvision::nms ...")
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        for name in [m for m in sys.modules if m == "onnx2torch" or m.startswith("onnx2torch.")]:
            del sys.modules[name]
        log.warning(
            "torch engine: torchvision does not load here (%s); NonMaxSuppression/RoiAlign unavailable", exc
        )
        _install_torchvision_standin(str(exc))
        module = importlib.import_module("onnx2torch")
    register_converters()
    return module


def _install_torchvision_standin(why: str) -> None:
    tv = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")

    def unavailable(*_args: object, **_kwargs: object) -> None:
        raise EngineError(f"torch engine: this model needs torchvision, which does not load here: {why}")

    ops.nms = ops.box_convert = ops.roi_align = ops.batched_nms = unavailable  # type: ignore[attr-defined]
    tv.ops = ops  # type: ignore[attr-defined]
    tv.__streamd_standin__ = True  # type: ignore[attr-defined]
    sys.modules["torchvision"] = tv
    sys.modules["torchvision.ops"] = ops
