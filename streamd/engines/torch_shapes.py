"""Shape arithmetic as Python ints, for ``engine.compile`` (what lets Dynamo trace RT-DETR).

The placement computes a model's run-time shapes on the host as small int64 tensors (``torch_place``); Dynamo
sees those as data and fails where onnx2torch makes a ``torch.Size`` of one. ``pythonize_shapes`` rewrites
them, on a copy of the module, into Python ints and lists: SymInts in Dynamo (the batch stays dynamic), plain
ints in eager runs. Only the ops RT-DETR's shape arithmetic uses are known; anything else leaves the model as
it was. (``_constant`` and ``_tidy`` are shared with ``torch_compile``'s rewrites.)
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any


def _constant(module: Any, node: Any) -> Any:
    owner_name, _, attr = node.target.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return getattr(owner, attr)


def _tidy(module: Any) -> None:
    """After a rewrite: drop what no node reads any more, check the graph, regenerate the module's code."""
    module.graph.eliminate_dead_code()
    module.graph.lint()
    module.delete_all_unused_submodules()
    module.recompile()


def _shape(x: Any, start: int, end: int | None) -> list[Any]:
    return list(x.shape[start:end])


def _gather(data: Any, index: Any) -> Any:
    import torch

    if isinstance(data, torch.Tensor):
        return data[index]
    if isinstance(index, list):
        return [data[i] for i in index]
    return data[index]


def _unsqueeze(value: Any, axes: list[int]) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        for axis in axes:
            value = value.unsqueeze(axis)
        return value
    if axes != [0] or isinstance(value, list):
        raise ValueError(f"unsqueeze of a shape value at {axes}")
    return [value]


def _concat(*values: Any) -> Any:
    import torch

    tensor = next((v for v in values if isinstance(v, torch.Tensor)), None)
    if tensor is not None:  # the Python values joined on the tensor's device (_range makes it on the GPU)
        return torch.cat(
            [v if isinstance(v, torch.Tensor) else torch.tensor(v, device=tensor.device) for v in values]
        )
    out: list[Any] = []
    for v in values:
        out.extend(v)
    return out


def _slice(value: list[Any], starts: list[int], ends: list[int], axes: Any = None, steps: Any = None) -> Any:
    import torch

    one_d = not isinstance(value, torch.Tensor) or value.dim() == 1
    if axes not in (None, [0], [-1]) or len(starts) != 1 or not one_d:
        raise ValueError("slice of a shape value along another axis")
    return value[slice(starts[0], ends[0], (steps or [1])[0])]


def _elementwise(op: Any, a: Any, b: Any) -> Any:
    if isinstance(a, list) or isinstance(b, list):
        a_list = a if isinstance(a, list) else [a]
        b_list = b if isinstance(b, list) else [b]
        n = max(len(a_list), len(b_list))
        a_list = a_list * n if len(a_list) == 1 else a_list
        b_list = b_list * n if len(b_list) == 1 else b_list
        return [op(x, y) for x, y in zip(a_list, b_list, strict=True)]
    return op(a, b)


# Div is left out: ONNX's integer Div truncates toward zero (onnx2torch's _onnx_div), Python's // floors.
_INT_OPS = {"mul": operator.mul, "add": operator.add, "sub": operator.sub}


def _math(name: str, a: Any, b: Any) -> Any:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return getattr(torch, name)(a, b)
    return _elementwise(_INT_OPS[name], a, b)


def _range(start: Any, limit: Any, delta: Any, device: Any) -> Any:
    import torch

    return torch.arange(start, limit, delta, device=device)


def _reshape(x: Any, shape: list[Any]) -> Any:
    import torch

    return torch.reshape(x, [x.shape[i] if d == 0 else d for i, d in enumerate(shape)])


def _tile(x: Any, repeats: list[Any]) -> Any:
    return x.repeat(list(repeats))


def _expand(x: Any, shape: list[Any]) -> Any:
    import torch

    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(shape)))


_READERS = {"OnnxReshape": _reshape, "OnnxTile": _tile, "OnnxExpand": _expand}


def _replace(graph: Any, node: Any, target: Callable[..., Any], args: list[Any]) -> Any:
    """``node`` replaced in ``graph`` by ``target(*args)``; the new node."""
    with graph.inserting_before(node):
        new = graph.call_function(target, tuple(args))
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return new


def _python_args(module: Any, args: Any, done: set[Any]) -> list[Any] | None:
    """``args`` with constants as Python values and host values as their rewritten nodes; None when one is
    neither (a device tensor in shape arithmetic, or a large constant)."""
    import torch

    out: list[Any] = []
    for a in args:
        if a is None or isinstance(a, int | float) or a in done:
            out.append(a)
        elif getattr(a, "op", None) == "get_attr" and isinstance(_constant(module, a), torch.Tensor):
            value = _constant(module, a)
            if value.numel() > 64:
                return None
            out.append(value.tolist())
        else:
            return None
    return out


def pythonize_shapes(module: Any) -> Any | None:
    """A copy of ``module`` (an fx.GraphModule after ``place``; submodules and weights shared) whose host
    shape arithmetic is Python ints and whose Reshape/Tile/Expand take Python lists; None when it has none,
    or an op this does not know (the model then compiles, or falls back, as it is)."""
    import copy

    import torch
    from torch import fx

    from streamd.engines.torch_place import _kind, host_valued

    gm = fx.GraphModule(module, copy.deepcopy(module.graph))
    host = host_valued(gm)
    if not host:
        return None
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    done: set[Any] = set()  # rewritten nodes
    tensors: set[Any] = set()  # those of them that give a tensor
    graph = gm.graph
    for node in list(graph.nodes):
        kind = _kind(gm, node)
        if node.kwargs and (node in host or kind in _READERS):
            return None  # onnx2torch passes inputs after a skipped one as kwargs: not rewritten here
        if kind == "DeviceCopy" and node.args[0] in done:
            # the placement's copy of a host value for a device op (on a GPU only: RT-DETR's Range over the
            # batch feeding a Tile); rewritten, that value is made on the device already (_range)
            if node.args[0] not in tensors:
                return None
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            continue
        if node in host:
            sub = gm.get_submodule(node.target) if node.op == "call_module" else None
            args = _python_args(gm, node.args, done)
            target: Callable[..., Any]
            if kind in ("OnnxShape", "HostShape"):
                target, args = _shape, [node.args[0], getattr(sub, "_start", 0), getattr(sub, "_end", None)]
            elif args is None:
                return None
            elif kind == "OnnxGather" and getattr(sub, "_axis", 0) == 0:
                target = _gather
            elif kind == "OnnxUnsqueezeStaticAxes":
                target, args = _unsqueeze, [*args, list(getattr(sub, "_axes", ()))]
            elif kind == "OnnxConcat" and getattr(sub, "axis", 0) == 0:
                target = _concat
            elif kind == "OnnxSlice":
                target = _slice
            elif kind == "OnnxBinaryMathOperation":
                name = getattr(getattr(sub, "math_op_function", None), "__name__", "")
                if name not in _INT_OPS:
                    return None
                target, args = _math, [name, *args]
            elif kind == "OnnxRange":
                target, args = _range, [*args, device]
            else:
                return None
            new = _replace(graph, node, target, args)
            done.add(new)
            if target is _range or any(a in tensors for a in args if isinstance(a, fx.Node)):
                tensors.add(new)
        elif kind in _READERS and len(node.args) == 2:
            # the data is a device tensor, or (Tile) a rewritten tensor; the shape argument a Python list
            rest = _python_args(gm, node.args[1:], done)
            if rest is None or (node.args[0] in done and node.args[0] not in tensors):
                return None
            _replace(graph, node, _READERS[kind], [node.args[0], *rest])
        elif any(a in done for a in node.all_input_nodes):
            return None  # a host value read by an op not rewritten here
    _tidy(gm)
    return gm
