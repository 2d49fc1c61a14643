"""ONNX ``Resize`` for the torch engine, exactly as the ONNX spec computes it (``streamd.engines.torch_ops``
says why onnx2torch's own translation is not used): ``axis_table`` builds one axis's taps and weights on the
host with numpy; ``exact_resize_class`` returns the module (a separable gather + weighted sum per resized
axis, or ``F.interpolate`` where that computes the same formula: its native kernels are much faster)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streamd.engines.base import EngineError


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


def exact_resize_class() -> type:
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
            self,
            shape: tuple[int, ...],
            roi: list[float] | None,
            scales: list[float] | None,
            sizes: list[int] | None,
            device: Any,
            dtype: Any,
        ) -> list[tuple[int, Any, Any, Any]]:
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
                    n_in,
                    n_out,
                    scale,
                    mode=self.mode,
                    coord=self.coord,
                    nearest_mode=self.nearest_mode,
                    cubic_a=self.cubic_a,
                    exclude_outside=self.exclude_outside,
                    roi=span,
                )
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

        def _interpolate(
            self, x: torch.Tensor, scales: list[float] | None, sizes: list[int] | None
        ) -> torch.Tensor | None:
            """``F.interpolate`` where it computes the ONNX formula itself: 4-D, only H and W resized, linear
            with half_pixel or align_corners, nearest with asymmetric + floor by powers of two (1/scale is
            then exact in float). Its native kernels read channels-last directly; the gathers below cost
            NanoDet a sizeable share of its GPU time (tools/engine_probe.py). None: not such a resize."""
            if x.dim() != 4 or self.exclude_outside:
                return None
            if self.mode == "linear" and self.coord in ("half_pixel", "align_corners"):
                kind, corners = "bilinear", self.coord == "align_corners"
            elif self.mode == "nearest" and self.coord == "asymmetric" and self.nearest_mode == "floor":
                kind, corners = "nearest", None
            else:
                return None
            functional = torch.nn.functional
            if sizes:
                if kind != "bilinear" or len(sizes) != 4 or [int(v) for v in sizes[:2]] != list(x.shape[:2]):
                    return None
                out = (int(sizes[2]), int(sizes[3]))
                return functional.interpolate(x, size=out, mode=kind, align_corners=corners)
            if not scales or len(scales) != 4 or scales[0] != 1 or scales[1] != 1:
                return None
            factors = (float(scales[2]), float(scales[3]))
            if kind == "nearest" and not all(
                f >= 1 and f.is_integer() and math.log2(f).is_integer() for f in factors
            ):
                return None
            for n, f in zip(x.shape[2:], factors, strict=True):
                if math.floor(n * f) < 1:
                    return None
                if math.floor(n * f) == n and f != 1 and kind == "bilinear" and not corners:
                    return None  # interpolate copies a same-size axis; ONNX still samples at (i+0.5)/f-0.5
            return functional.interpolate(
                x, scale_factor=factors, mode=kind, align_corners=corners, recompute_scale_factor=False
            )

        def forward(
            self,
            input_tensor: torch.Tensor,
            roi: torch.Tensor | None = None,
            scales: torch.Tensor | None = None,
            sizes: torch.Tensor | None = None,
        ) -> torch.Tensor:
            def host(t: torch.Tensor | list[Any] | None) -> list[Any] | None:
                if isinstance(t, list):  # torch_compile.freeze_constant_args passes constants as lists
                    return t or None
                return t.tolist() if t is not None and t.numel() else None

            x = input_tensor
            fast = self._interpolate(x, host(scales), host(sizes))
            if fast is not None:
                return fast
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


_OPAQUE_GRID_SAMPLE: Any = None


def opaque_grid_sample() -> Any:
    """``torch.ops.streamd.grid_sample``: ``F.grid_sample`` as one custom op, which Inductor runs as ATen's
    kernel instead of decomposing it. Inductor's decomposition gathers element by element, one thread per
    output value, where ATen's kernel takes one sampling point per thread and loops over the channels: in
    compiled RT-DETR-l (batch 32, fp16, H200) the decomposed sampling of the deformable attention took 4.7
    of 20.3 ms per call, ATen's kernel 0.8 ms in the uncompiled model (tools/kernel_profile.py,
    bench/RESULTS.md). Defined once per process, on first use. Inference only: no backward is registered
    (the engine runs in inference mode), and a graph exported with it names this op."""
    global _OPAQUE_GRID_SAMPLE
    if _OPAQUE_GRID_SAMPLE is None:
        import torch

        # spelled out: annotations here are strings (__future__), which infer_schema cannot read
        schema = "(Tensor x, Tensor grid, str mode, str padding_mode, bool align_corners) -> Tensor"

        @torch.library.custom_op("streamd::grid_sample", mutates_args=(), schema=schema)
        def grid_sample(
            x: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str, align_corners: bool
        ) -> torch.Tensor:
            return torch.nn.functional.grid_sample(
                x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners
            )

        @grid_sample.register_fake
        def _(x: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str, align_corners: bool) -> Any:
            return x.new_empty((x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]))

        _OPAQUE_GRID_SAMPLE = grid_sample
    return _OPAQUE_GRID_SAMPLE


def grid_sample_class() -> type:
    """ONNX GridSample (opset 16 modes bilinear/nearest/bicubic, opset 20's linear/cubic names mapped) as
    ``torch.nn.functional.grid_sample``, whose conventions are the ONNX spec's (x, y grid order, -1..1,
    ``align_corners``; cubic a = -0.75; nearest rounds half to even). 4-D inputs only. Under
    ``torch.compile`` it is the same call as one opaque op (``opaque_grid_sample``)."""
    import torch

    opaque = opaque_grid_sample()  # defined here, not while Dynamo traces forward

    class GridSample(torch.nn.Module):
        def __init__(self, mode: str, padding_mode: str, align_corners: bool) -> None:
            super().__init__()
            self.mode, self.padding_mode, self.align_corners = mode, padding_mode, align_corners

        def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            grid = grid.to(x.dtype)
            if torch.compiler.is_compiling():
                return opaque(x, grid, self.mode, self.padding_mode, self.align_corners)
            return torch.nn.functional.grid_sample(
                x, grid, mode=self.mode, padding_mode=self.padding_mode, align_corners=self.align_corners
            )

    return GridSample
