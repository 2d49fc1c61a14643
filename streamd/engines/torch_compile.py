"""``engine.compile``: the converted model through ``torch.compile`` (Inductor, Triton kernels on the GPU).

A converted ONNX model runs as many small memory-bound kernels next to its convolutions: a bias add after
every convolution, its activation, concatenations, the pad before a pool. At large batches on a fast GPU
those take most of NanoDet's time (tools/engine_probe.py measures it); Inductor fuses them. The price is a
compile at start-up, about a minute (bench/RESULTS.md; Inductor caches its kernels on disk, so later starts
are quicker). The batch dimension alone is compiled as dynamic (``DYNAMIC_DIMS``), so every batch size
from 2 up shares one compile while the kernels index every other dimension with constants (RT-DETR-l on the
H200: 1.11x faster than with every dimension symbolic, bench/RESULTS.md); Dynamo specialises a size-1
dimension, so batch 1 would need a compile of its own (40 of NanoDet's 95 s on the H200): a batch of one
runs as two instead (``BatchOfOneAsTwo``), one compile in all.

Dynamo cannot trace onnx2torch's ``OnnxReshape`` (it builds a ``torch.Size`` from a tensor), so reshapes to a
constant shape are first rewritten into plain ``torch.reshape`` calls (``freeze_reshapes``). Models that
build shapes from the batch size at run time (RT-DETR's Reshape, Tile and Expand targets: shape arithmetic
the placement keeps on the host as int64 tensors) are compiled from a copy whose shape arithmetic is Python
ints (``torch_shapes.pythonize_shapes``): Dynamo traces those as SymInts. (Hiding the ops from Dynamo instead,
``torch.compiler.disable``, made it re-trace the rest of the graph at each of ~175 breaks: 527 s for the tiny
RT-DETR's batch 1 on a CPU core.) Ops that read constant parameter inputs with ``.item()``/``.tolist()``
(Slice bounds, TopK's k, Split sizes, Pad pads, Squeeze axes, Resize scales) become plain torch calls with
Python arguments (``freeze_constant_args``), so Dynamo traces YOLOv8s and RT-DETR in one graph, no break.
``compile_checked`` compiles at start-up, on probe batches, and falls back
to the uncompiled module with the reason when the compile fails: ``engine.compile: true`` never stops a
worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from streamd.engines.torch_shapes import _constant, _replace, _reshape, _tidy, _tile, pythonize_shapes

log = logging.getLogger(__name__)


def freeze_reshapes(module: Any) -> int:
    """Rewrite every ``OnnxReshape`` whose shape is a constant without 0 entries (ONNX's "copy this input
    dimension") into ``torch.reshape(x, dims)``; returns how many. A -1 stays: torch reads it the same way."""
    import torch

    graph = module.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_module" or type(module.get_submodule(node.target)).__name__ != "OnnxReshape":
            continue
        shape = node.args[1] if len(node.args) > 1 else node.kwargs.get("shape")
        if getattr(shape, "op", None) != "get_attr":
            continue
        dims = [int(v) for v in _constant(module, shape).tolist()]
        if 0 in dims:
            continue
        _replace(graph, node, torch.reshape, [node.args[0], tuple(dims)])
        count += 1
    _tidy(module)
    return count


# -- constant operands as Python values (what removes Dynamo's graph breaks) ---------------------------------
# onnx2torch's Slice, TopK, Split, Pad and Squeeze take their parameters (starts, k, split sizes, pads, axes)
# as tensor inputs and read them with .item()/.tolist() at every call, and its Reshape, Tile and Expand build
# a torch.Size from one: Dynamo breaks the graph there, or fails (the tiny zoo models: YOLOv8s 15 breaks,
# RT-DETR 18, YOLO26's Expand a failure). Where those inputs are small constants, the op becomes a plain
# torch call with Python arguments, computing the same (the table is at the end of the module).


def _sliced(x: Any, flip: list[int], pos: list[Any], neg: list[Any]) -> Any:
    import torch

    if flip:
        x = torch.flip(x, dims=flip)
    if pos:
        x = x[tuple(slice(*s) for s in pos)]
    if neg:
        index = [Ellipsis, *(slice(*s) for s in neg)]
        x = x[tuple(index)]
    return x


def _topk(x: Any, k: int, dim: int, largest: bool, ordered: bool) -> tuple[Any, Any]:
    import torch

    top = torch.topk(x, k=k, dim=dim, largest=largest, sorted=ordered)
    return top.values, top.indices


def _split(x: Any, sizes: list[int], dim: int) -> Any:
    import torch

    return torch.split(x, sizes, dim=dim)


def _pad(x: Any, pads: list[int], mode: str, value: float | None) -> Any:
    from torch.nn import functional

    return functional.pad(x, mode=mode, pad=pads, value=value)


def _squeeze(x: Any, axes: list[int]) -> Any:
    import torch

    if not axes:
        return torch.squeeze(x)
    for axis in sorted(axes, reverse=True):
        x = torch.squeeze(x, dim=axis)
    return x


def _broadcast(x: Any, shape: list[int]) -> Any:
    import torch

    return x * torch.ones(shape, dtype=x.dtype, device=x.device)  # onnx2torch's Expand, to the letter


def _ints(values: Any) -> list[Any]:
    return [None if v is None else int(v) for v in values]


def _slice_call(sub: Any, c: list[Any]) -> tuple[Callable[..., Any], list[Any]] | None:
    from onnx2torch.node_converters.slice import _get_slices

    if len(c) < 2 or c[0] is None or c[1] is None:
        return None
    c = c + [None] * (4 - len(c))
    flip, pos, neg = _get_slices(*c)
    triple = lambda s: _ints((s.start, s.stop, s.step))  # noqa: E731
    return _sliced, [_ints(flip), [triple(s) for s in pos], [triple(s) for s in neg if s is not Ellipsis]]


def _topk_call(sub: Any, c: list[Any]) -> tuple[Callable[..., Any], list[Any]] | None:
    if len(c) != 1 or c[0] is None or c[0].numel() != 1:
        return None
    return _topk, [int(c[0].reshape(-1)[0]), int(sub.dim), bool(sub.largest), bool(sub.sorted)]


def _split_call(sub: Any, c: list[Any]) -> tuple[Callable[..., Any], list[Any]] | None:
    if len(c) != 1 or c[0] is None:
        return None
    return _split, [_ints(c[0].tolist()), int(sub.axis)]


def _pad_call(sub: Any, c: list[Any]) -> tuple[Callable[..., Any], list[Any]] | None:
    from onnx2torch.node_converters.pad import _onnx_padding_to_torch, _torch_padding_to_mode_format

    if not 1 <= len(c) <= 2 or c[0] is None:
        return None
    value: float | None = 0.0  # the module's default when the input is absent
    if len(c) == 2 and c[1] is None:
        value = None
    elif len(c) == 2:
        if c[1].numel() != 1:
            return None
        value = float(c[1].reshape(-1)[0])
    pads = _torch_padding_to_mode_format(_onnx_padding_to_torch(c[0].tolist()), sub.mode)
    return _pad, [_ints(pads), sub.mode, value]


def _squeeze_call(sub: Any, c: list[Any]) -> tuple[Callable[..., Any], list[Any]] | None:
    if len(c) > 1:
        return None
    return _squeeze, [_ints(c[0].tolist()) if c and c[0] is not None else []]


# Which input dimensions the compiled graph keeps symbolic. "batch": the batch alone; an engine's input size
# is fixed, so Inductor's kernels index heights, widths and channels with constants. "all" (before the
# nineteenth session): every dimension symbolic, each kernel's index arithmetic divides by run-time sizes.
DYNAMIC_DIMS = "batch"


class BatchDynamic:
    """The compiled callable with each call's batch dimension marked dynamic (from 2 up: Dynamo specialises a
    size-1 dimension), so one graph serves every batch size while the other dimensions stay static."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        import torch

        for a in args:
            if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] >= 2:
                torch._dynamo.maybe_mark_dynamic(a, 0)  # "maybe": a fixed-batch model may specialise it
        return self.compiled(*args)


def compile_module(module: Any, backend: str = "inductor") -> Any:
    """``module`` (an fx.GraphModule, placed) ready for ``torch.compile``; the compiled callable. The compile
    itself happens at its first call."""
    import torch

    frozen = freeze_reshapes(module)
    log.info(
        "torch engine: compiling with torch.compile (%s, %s dynamic); %d reshape(s) made static",
        backend,
        DYNAMIC_DIMS,
        frozen,
    )
    if DYNAMIC_DIMS not in ("batch", "all"):
        raise ValueError(f"torch_compile.DYNAMIC_DIMS is {DYNAMIC_DIMS!r}: 'batch' or 'all'")
    if DYNAMIC_DIMS == "all":
        return torch.compile(module, dynamic=True, fullgraph=False, backend=backend)
    return BatchDynamic(torch.compile(module, dynamic=None, fullgraph=False, backend=backend))


class BatchOfOneAsTwo:
    """The compiled model, with a batch of one run as two (its row twice, the first result kept): the dynamic
    graph compiled for batches from 2 up serves it, where Dynamo would compile batch 1 apart (its size-1
    specialisation) — at start-up, or in the frame path when a batch of one first comes. The extra row costs
    one image of compute, only on batches of one."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    def __call__(self, x: Any) -> Any:
        import torch

        if x.shape[0] != 1:
            return self.compiled(x)
        # cat keeps a channels-last input channels-last; the pair is an inference tensor only when ``x`` is
        # one (Dynamo guards on that: the other kind would compile the graph again)
        with torch.inference_mode(x.is_inference()):
            pair = torch.cat([x, x])
        out = self.compiled(pair)
        if isinstance(out, (tuple, list)):
            return type(out)(o[:1] for o in out)
        return out[:1]


def compile_checked(
    module: Any,
    run: Callable[[Any, int], None],
    batches: Iterable[int],
    backend: str = "inductor",
    *,
    one_as_two: bool = False,
) -> tuple[Any, str | None]:
    """``module`` compiled and ``run(compiled, batch)`` once per batch size given (one size from 2 up
    compiles the dynamic graph; with ``one_as_two``, batch 1 runs through it as two, else it is compiled
    apart): (the compiled callable, None), or (``module`` itself, uncompiled, and why) when compiling or
    running it fails. ``module`` keeps ``freeze_reshapes``' rewrite either way, and ``freeze_constant_args``'
    where no pythonized copy was made (the same computation). ``one_as_two`` needs a batch dimension that
    takes 2 (not a model whose batch is fixed)."""
    try:
        freeze_reshapes(module)  # first: constant reshapes need no shape arithmetic rewritten
        # RT-DETR-like models: their run-time shape arithmetic as Python ints (None for all others)
        target = pythonize_shapes(module) or module
        freeze_constant_args(target)  # after: shape arithmetic (host values) is pythonize_shapes' to rewrite
        compiled = compile_module(target, backend)
        if one_as_two:
            compiled = BatchOfOneAsTwo(compiled)
        for batch in batches:
            run(compiled, batch)
    except Exception as exc:  # Dynamo/Inductor raise many types; none may stop the worker
        if "CUDA error" in str(exc):  # the context may be broken (an illegal access): not a compile matter
            raise
        # No torch._dynamo.reset(): it would drop every compiled module of the process (another engine's
        # too); the failed wrapper's caches go with it.
        text = str(exc).strip().splitlines()
        return module, f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
    return compiled, None


# -- the constant ops' table (after the shape readers it uses) ----------------------------------------------


def _shape_call(target: Callable[..., Any]) -> Callable[[Any, list[Any]], Any]:
    """Reshape (its constant targets with a 0, "copy this dimension": freeze_reshapes leaves those), Tile
    and Expand to a constant shape: onnx2torch builds a torch.Size from the tensor, which Dynamo cannot."""

    def call(sub: Any, c: list[Any]) -> tuple[Callable[..., Any], list[Any]] | None:
        if len(c) != 1 or c[0] is None or c[0].dim() != 1:
            return None
        return target, [_ints(c[0].tolist())]

    return call


_CONSTANT_OPS: dict[str, Callable[[Any, list[Any]], tuple[Callable[..., Any], list[Any]] | None]] = {
    "OnnxReshape": _shape_call(_reshape),
    "OnnxTile": _shape_call(_tile),
    "OnnxExpand": _shape_call(_broadcast),
    "OnnxSlice": _slice_call,
    "OnnxTopK": _topk_call,
    "OnnxSplit13": _split_call,
    "OnnxPadDynamic": _pad_call,
    "OnnxSqueezeDynamicAxes": _squeeze_call,
}


def freeze_constant_args(module: Any) -> int:
    """Rewrite the ops of ``_CONSTANT_OPS`` whose parameter inputs are small constants into plain torch calls
    with Python arguments, and hand the exact Resize its constant roi/scales/sizes as lists; returns how many.
    Host-valued nodes (shape arithmetic: ``pythonize_shapes``' business) are left alone."""
    import torch

    from streamd.engines.torch_place import host_valued

    graph = module.graph
    host = host_valued(module)
    count = 0

    def small(a: Any) -> Any:  # a constant input as a host tensor; None when it is not one
        value = _constant(module, a) if getattr(a, "op", None) == "get_attr" else None
        if isinstance(value, torch.Tensor) and value.numel() <= 64:
            return value.detach().cpu()
        return None

    for node in list(graph.nodes):
        if node.op != "call_module" or node in host or not node.args:
            continue
        sub = module.get_submodule(node.target)
        kind = type(sub).__name__
        rest = [*node.args[1:], *node.kwargs.values()]
        consts = [None if a is None else small(a) for a in rest]
        if any(c is None and a is not None for a, c in zip(rest, consts, strict=True)):
            continue
        if kind == "ExactResize":  # our module: it takes lists (the graph keeps the call)
            lists = [None if c is None else c.reshape(-1).tolist() for c in consts]
            n = len(node.args) - 1
            node.kwargs = dict(zip(node.kwargs, lists[n:], strict=True))
            node.args = (node.args[0], *lists[:n])
            count += 1
        elif kind in _CONSTANT_OPS and not node.kwargs:  # onnx2torch passes inputs after a gap as kwargs
            try:
                call = _CONSTANT_OPS[kind](sub, consts)
            except Exception:  # another onnx2torch, an input the op itself refuses: leave the node as it is
                call = None
            if call is not None:
                _replace(graph, node, call[0], [node.args[0], *call[1]])
                count += 1
    _tidy(module)
    return count
