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
the host once per input shape, so CUDA graphs capture it).

``check_convertible`` names every op (and op mode) the torch engine cannot run, at build time, instead of a
silently different result. The recipe string ``TORCH_REWRITE_RECIPE`` goes into cache keys and verdicts.
"""

from __future__ import annotations

import importlib
import logging
import math
import sys
import types
from typing import Any

import numpy as np

from streamd.engines.base import EngineError

log = logging.getLogger(__name__)

DOMAIN = "streamd"
TORCH_REWRITE_RECIPE = "torch-rewrite-v2"  # bump when a rewrite changes results

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


# ------------------------------------------------------------------------------------------------------------
# Resize: index tables (numpy, host) and the module


def axis_table(
    n_in: int,
    n_out: int,
    scale: float,
    *,
    mode: str,
    coord: str,
    nearest_mode: str = "round_prefer_floor",
    cubic_a: float = -0.75,
    exclude_outside: bool = False,
    roi: tuple[float, float] = (0.0, 1.0),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One axis of an ONNX Resize: (indices (n_out, K) int64, weights (n_out, K) float64, outside (n_out,)
    bool); output[i] = sum_k weights[i, k] * input[indices[i, k]], or extrapolation_value where ``outside``
    (tf_crop_and_resize only). Follows the ONNX spec (onnx.reference's Resize: edge padding for taps past the
    border)."""
    i = np.arange(n_out, dtype=np.float64)
    if coord == "half_pixel":
        x = (i + 0.5) / scale - 0.5
    elif coord == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        center = n_in / 2
        offset = center * (1 - adjustment)
        x = offset + (i + 0.5) / scale - 0.5
    elif coord == "pytorch_half_pixel":
        x = (i + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    elif coord == "align_corners":
        x = i * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    elif coord == "asymmetric":
        x = i / scale
    elif coord == "tf_half_pixel_for_nn":
        x = (i + 0.5) / scale
    elif coord == "tf_crop_and_resize":
        start, end = roi
        if n_out > 1:
            x = start * (n_in - 1) + i * (end - start) * (n_in - 1) / (n_out - 1)
        else:
            x = np.full(n_out, 0.5 * (start + end) * (n_in - 1))
    else:
        raise EngineError(f"Resize: coordinate_transformation_mode {coord!r} is not supported")
    outside = (x < 0) | (x > n_in - 1) if coord == "tf_crop_and_resize" else np.zeros(n_out, bool)
    if mode == "nearest":
        if nearest_mode == "round_prefer_floor":
            idx = np.ceil(x - 0.5)
        elif nearest_mode == "round_prefer_ceil":
            idx = np.floor(x + 0.5)
        elif nearest_mode == "floor":
            idx = np.floor(x)
        elif nearest_mode == "ceil":
            idx = np.ceil(x)
        else:
            raise EngineError(f"Resize: nearest_mode {nearest_mode!r} is not supported")
        indices = np.clip(idx, 0, n_in - 1).astype(np.int64)[:, None]
        weights = np.ones((n_out, 1))
    else:
        base = np.floor(x)
        ratio = x - base
        if mode == "linear":
            taps = base[:, None] + np.arange(2)[None]
            weights = np.stack([1 - ratio, ratio], axis=1)
        elif mode == "cubic":
            a = cubic_a
            taps = base[:, None] + np.arange(-1, 3)[None]
            r = ratio
            weights = np.stack(
                [
                    ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                    ((a + 2) * r - (a + 3)) * r * r + 1,
                    ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                    ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a,
                ],
                axis=1,
            )
        else:
            raise EngineError(f"Resize: mode {mode!r} is not supported")
        if exclude_outside:
            valid = (taps >= 0) & (taps <= n_in - 1)
            weights = np.where(valid, weights, 0.0)
            total = weights.sum(axis=1, keepdims=True)
            weights = weights / np.where(total == 0, 1.0, total)
        indices = np.clip(taps, 0, n_in - 1).astype(np.int64)
    if outside.any():
        weights = np.where(outside[:, None], 0.0, weights)
    return indices, weights, outside


def _exact_resize_class() -> type:
    import torch

    class ExactResize(torch.nn.Module):
        """ONNX Resize (opset 11–19 semantics) as per-axis gathers; see the module docstring."""

        def __init__(
            self,
            mode: str,
            coord: str,
            nearest_mode: str,
            cubic_a: float,
            exclude_outside: bool,
            extrapolation_value: float,
        ) -> None:
            super().__init__()
            self.mode, self.coord, self.nearest_mode = mode, coord, nearest_mode
            self.cubic_a, self.exclude_outside = cubic_a, exclude_outside
            self.extrapolation_value = extrapolation_value
            self._tables: dict[tuple[Any, ...], list[tuple[int, Any, Any, Any]]] = {}

        def _plan(
            self, shape: tuple[int, ...], roi: list[float] | None, scales: list[float] | None,
            sizes: list[int] | None, device: Any, dtype: Any,
        ) -> list[tuple[int, Any, Any, Any]]:  # fmt: skip
            key = (shape, tuple(roi or ()), tuple(scales or ()), tuple(sizes or ()), device, dtype)
            plan = self._tables.get(key)
            if plan is not None:
                return plan
            rank = len(shape)
            plan = []
            for axis in range(rank):
                n_in = shape[axis]
                if sizes:
                    n_out = int(sizes[axis])
                    scale = n_out / n_in
                elif scales:
                    scale = float(scales[axis])
                    n_out = math.floor(n_in * scale)
                else:
                    raise EngineError("Resize: neither scales nor sizes given")
                crop = self.coord == "tf_crop_and_resize"
                span = (float(roi[axis]), float(roi[axis + rank])) if crop and roi else (0.0, 1.0)
                if n_out == n_in and scale == 1.0 and not crop:
                    continue  # identity on this axis in every mode
                idx, w, outside = axis_table(
                    n_in, n_out, scale, mode=self.mode, coord=self.coord, nearest_mode=self.nearest_mode,
                    cubic_a=self.cubic_a, exclude_outside=self.exclude_outside, roi=span,
                )  # fmt: skip
                fill = None
                if outside.any():
                    fill = torch.tensor(outside * self.extrapolation_value, dtype=dtype, device=device)
                plan.append(
                    (
                        axis,
                        torch.tensor(idx.reshape(-1), dtype=torch.int64, device=device),
                        torch.tensor(w, dtype=dtype, device=device),
                        fill,
                    )
                )
            if len(self._tables) > 64:
                self._tables.clear()
            self._tables[key] = plan
            return plan

        def forward(
            self,
            input_tensor: torch.Tensor,
            roi: torch.Tensor | None = None,
            scales: torch.Tensor | None = None,
            sizes: torch.Tensor | None = None,
        ) -> torch.Tensor:
            def host(t: torch.Tensor | None) -> list[Any] | None:
                return t.tolist() if t is not None and t.numel() else None

            x = input_tensor
            plan = self._plan(tuple(x.shape), host(roi), host(scales), host(sizes), x.device, x.dtype)
            for axis, idx, w, fill in plan:
                n_out, k = w.shape
                g = x.index_select(axis, idx)
                if k == 1 and fill is None:
                    x = g
                else:
                    g = g.unflatten(axis, (n_out, k))
                    tail = [1] * (g.dim() - axis - 2)
                    x = (g * w.view(n_out, k, *tail)).sum(axis + 1)
                if fill is not None:
                    x = x + fill.view(n_out, *([1] * (x.dim() - axis - 1)))
            return x

    return ExactResize


_REGISTERED = False


def register_converters() -> None:
    """Register the ``streamd`` converters with onnx2torch (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from onnx2torch.node_converters.registry import add_converter
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    resize_cls = _exact_resize_class()

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
    if counts and not any(o.domain == DOMAIN for o in m.opset_import):
        m.opset_import.add(domain=DOMAIN, version=1)
    return m, [
        f"{kind} x{n}" if kind.startswith("auto_pad") else f"Resize x{n} ({kind})"
        for kind, n in sorted(counts.items())
    ]


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
