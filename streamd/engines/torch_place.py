"""Placement of a converted model for the torch engine: what runs on the GPU, what stays on the host.

Weights go to the GPU (``place``), but a CUDA graph captures device work only: a device value read on the host
(``.tolist()``/``.item()``: a sync) or a host value copied to the device during capture makes it fail. So:

- the small constants converted ops read on the host (``HOST_ARGS``: Reshape shapes, Resize scales, Pad pads,
  Slice bounds, ...) and 0-dim Gather indices (``SCALAR_INDEX_ARGS``) stay on the host;
- ``Shape`` returns a host tensor (``_HostShape``), and shape arithmetic — every op whose inputs are host
  values and small constants (``host_valued``: the Gather/Concat/Mul chains that build Reshape targets from a
  dynamic batch, RT-DETR's Range over the batch) — runs on the host with its modules' buffers;
- where a device op reads such a host value it gets a kept device copy (``_DeviceCopy``): copied in the eager
  run that precedes capture, read by the graph, never copied during capture;
- ops whose output can grow to activation size from a shape (``DEVICE_MAKERS``: Expand, Tile,
  ConstantOfShape) always run on the device; ConstantOfShape makes its output there (``_ConstantOfShape``).

``tools/torch_graph_audit.py`` checks all this on the CPU, and on a GPU (``--cuda``).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

log = logging.getLogger("streamd.engines.torch")

# onnx2torch module class -> argument positions it reads on the host (.tolist(), .item(), iteration).
HOST_ARGS: dict[str, tuple[int, ...]] = {
    "OnnxReshape": (1,),
    "OnnxResize": (1, 2, 3),
    "ExactResize": (1, 2, 3),
    "OnnxResizeV10": (1,),
    "OnnxPadDynamic": (1, 2),
    "OnnxSplit13": (1,),
    "OnnxSlice": (1, 2, 3, 4),
    "OnnxUnsqueezeDynamicAxes": (1,),
    "OnnxSqueezeDynamicAxes": (1,),
    "OnnxExpand": (1,),
    "OnnxTile": (1,),
    "OnnxReduceSumDynamicAxes": (1,),
    "OnnxConstantOfShape": (0,),
    "ConstantOfShape": (0,),
    "OnnxScatterND": (1,),
    "OnnxRange": (0, 1, 2),
    "OnnxTopK": (1,),
    "OnnxCumSum": (1,),
}
# onnx2torch module class -> argument positions at which a 0-dim index becomes a Python int (x[..., i]): a
# device scalar there is read back (a sync, which capture forbids), a host one is not.
SCALAR_INDEX_ARGS: dict[str, tuple[int, ...]] = {"OnnxGather": (1,)}
# ops whose output a shape can make as large as an activation: never computed on the host
DEVICE_MAKERS = frozenset({"OnnxExpand", "OnnxTile", "OnnxConstantOfShape", "ConstantOfShape"})
SHAPE_CONSTANT_MAX = 64  # elements: a constant this small may join shape arithmetic on the host
KEPT_COPIES_MAX = 64  # distinct host values a _DeviceCopy keeps (one per batch size in the models we know)


def _positions(node: Any, user: Any, module: Any) -> list[int]:
    """Argument positions at which fx node ``user`` (a call_module) receives ``node``."""
    positions = [i for i, a in enumerate(user.args) if a is node]
    if any(v is node for v in user.kwargs.values()):
        names = list(inspect.signature(module.forward).parameters)
        positions += [names.index(k) for k, v in user.kwargs.items() if v is node and k in names]
    return positions


def _kind(module: Any, node: Any) -> str:
    return type(module.get_submodule(node.target)).__name__ if node.op == "call_module" else ""


def _attr_value(module: Any, node: Any) -> Any:
    owner_name, _, attr = node.target.rpartition(".")
    return getattr(module.get_submodule(owner_name) if owner_name else module, attr, None)


class _HostShape:
    """Factory for a torch module returning ``x.shape[start:end]`` as a host int64 tensor (onnx2torch's
    OnnxShape puts it on the GPU, where the ops reading it would have to copy it back)."""

    @staticmethod
    def make(start: int, end: int | None) -> Any:
        import torch

        class HostShape(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self._start, self._end = start, end  # as OnnxShape names them (torch_compile reads them)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.tensor(x.shape[start:end], dtype=torch.int64)

        return HostShape()


class _ConstantOfShape:
    """Factory for ONNX ConstantOfShape making its output on the model's device from a host shape, its fill
    value a Python number (onnx2torch's reads its value tensor with ``.item()`` — a sync on the device — and
    makes the output wherever that tensor lives)."""

    @staticmethod
    def make(value: Any) -> Any:
        import torch

        fill = value.item()
        fill = int(fill) if isinstance(fill, bool) else fill
        dtype = value.dtype

        class ConstantOfShape(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                # moves with the module: where the output is made (never cast: not a floating tensor)
                self.register_buffer("anchor", torch.zeros(0, dtype=torch.int8, device=value.device))

            def forward(self, shape: torch.Tensor) -> torch.Tensor:
                anchor = self.get_buffer("anchor")
                return torch.full(torch.Size(shape.tolist()), fill, dtype=dtype, device=anchor.device)

        return ConstantOfShape()


class _DeviceCopy:
    """Factory for a torch module giving a device op the host value it reads (an index built from the batch
    size, say): each distinct value is copied once and the copy kept, so a CUDA graph captured after the
    eager run of the same call reads the kept copy — no copy during capture, none at replay. Shape arithmetic
    gives one value per batch size; past ``KEPT_COPIES_MAX`` values (data-dependent shapes, which no graph
    captures anyway) a value is copied per call and not kept — a kept copy may be read by a graph, so none is
    ever dropped."""

    @staticmethod
    def make(device: Any) -> Any:
        import torch

        class DeviceCopy(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.target = device
                self.copies: dict[tuple[Any, ...], torch.Tensor] = {}

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if not isinstance(x, torch.Tensor) or x.device == self.target:
                    return x
                flat = x.detach().contiguous().reshape(-1).view(torch.uint8)
                key = (x.dtype, tuple(x.shape), bytes(flat.numpy()))
                copy = self.copies.get(key)
                if copy is None:
                    copy = x.to(self.target)
                    if len(self.copies) < KEPT_COPIES_MAX:
                        self.copies[key] = copy
                return copy

        return DeviceCopy()


def host_valued(module: Any) -> set[Any]:
    """The fx nodes whose values are computed on the host: each Shape (``_HostShape``), and every op whose
    inputs are host values and small constants, has no parameters and cannot grow to activation size
    (``DEVICE_MAKERS``). Computing them on the host is what keeps them out of a CUDA graph: on the device,
    the Reshape reading one would need a device-to-host copy, which capture forbids."""
    graph = module.graph

    def small_constant(node: Any) -> bool:
        if node.op != "get_attr":
            return False
        value = _attr_value(module, node)
        return getattr(value, "numel", lambda: SHAPE_CONSTANT_MAX + 1)() <= SHAPE_CONSTANT_MAX

    def eligible(node: Any) -> bool:
        if node.op not in ("call_module", "call_function", "call_method"):
            return False
        if node.op != "call_module":
            return True
        sub = module.get_submodule(node.target)
        return type(sub).__name__ not in DEVICE_MAKERS and not any(True for _ in sub.parameters())

    host = {n for n in graph.nodes if _kind(module, n) in ("OnnxShape", "HostShape")}
    grew = bool(host)
    while grew:
        grew = False
        for node in graph.nodes:
            if node in host or not eligible(node):
                continue
            inputs = node.all_input_nodes
            if any(i in host for i in inputs) and all(i in host or small_constant(i) for i in inputs):
                host.add(node)
                grew = True
    return host


def _host_positions(module: Any, node: Any, user: Any) -> set[int] | None:
    """The positions at which ``user`` reads ``node`` on the host (HOST_ARGS), None when ``user`` is not a
    module call (then every read is a device read)."""
    if user.op != "call_module":
        return None
    return set(HOST_ARGS.get(_kind(module, user), ()))


def _host_reads(module: Any, node: Any, user: Any) -> bool:
    """True when ``user`` reads ``node`` only at argument positions its op reads on the host (HOST_ARGS)."""
    wanted = _host_positions(module, node, user)
    if wanted is None:
        return False
    positions = _positions(node, user, module.get_submodule(user.target))
    return bool(positions) and all(p in wanted for p in positions)


def _reads_scalar_index(module: Any, node: Any, user: Any) -> bool:
    """True when ``user`` reads ``node`` (a 0-dim constant) only as a scalar index (SCALAR_INDEX_ARGS)."""
    if user.op != "call_module":
        return False
    positions = _positions(node, user, module.get_submodule(user.target))
    return bool(positions) and all(p in SCALAR_INDEX_ARGS.get(_kind(module, user), ()) for p in positions)


def _replace_device_reads(module: Any, node: Any, user: Any, copied: Any) -> None:
    """Give ``user`` ``copied`` in place of ``node`` at every position it reads on the device, keeping
    ``node`` where it reads on the host (a position in HOST_ARGS)."""
    wanted = _host_positions(module, node, user)
    if wanted is None:  # not a module call (the graph's output, a function): every read, nested ones too
        user.replace_input_with(node, copied)
        return
    user.args = tuple(copied if a is node and i not in wanted else a for i, a in enumerate(user.args))
    if any(v is node for v in user.kwargs.values()):
        names = list(inspect.signature(module.get_submodule(user.target).forward).parameters)
        user.kwargs = {
            k: copied if v is node and (k not in names or names.index(k) not in wanted) else v
            for k, v in user.kwargs.items()
        }


def _copy_host_values_to_device(module: Any, on_host: set[Any], device: Any) -> list[str]:
    """Route each host value a device op reads through a ``_DeviceCopy`` (see there)."""
    graph = module.graph
    done: list[str] = []
    for node in [n for n in graph.nodes if n in on_host]:
        device_users = [u for u in node.users if u not in on_host and not _host_reads(module, node, u)]
        if not device_users:
            continue
        name = f"streamd_device_copy_{node.name}"
        module.add_submodule(name, _DeviceCopy.make(device))
        with graph.inserting_after(node):
            copied = graph.call_module(name, (node,))
        for user in device_users:
            _replace_device_reads(module, node, user, copied)
        done.append(f"{node.name} (copied to the device once per value)")
    return done


def _move_to_host(module: Any, node: Any, host_users: list[Any], device_users: list[Any]) -> str:
    """Put constant ``node`` on the host for ``host_users``; a copy when ``device_users`` still need it."""
    owner_name, _, attr = node.target.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    value = getattr(owner, attr)
    if not device_users:
        owner._buffers[attr] = value.detach().cpu()
        return str(node.target)
    host_attr = f"{attr}_host"
    owner.register_buffer(host_attr, value.detach().cpu())
    with module.graph.inserting_after(node):
        host_node = module.graph.get_attr(f"{owner_name}.{host_attr}" if owner_name else host_attr)
    for user in host_users:
        user.replace_input_with(node, host_node)
    return f"{node.target} (host copy)"


def keep_constants_on_host(module: Any, device: Any = None) -> list[str]:
    """Apply the placement above to ``module`` (already moved to ``device``); returns what moved or changed.

    A constant used both on the host and on the device gets a host copy for the host uses. ``device`` None
    (tests, the CPU audit): no device copies are inserted."""
    import torch

    graph = module.graph
    on_host = host_valued(module)
    moved: list[str] = _copy_host_values_to_device(module, on_host, device) if device is not None else []
    for node in on_host:  # their modules' buffers too: OnnxRange makes its output on its dummy buffer's
        if node.op == "call_module":  # device
            sub = module.get_submodule(node.target)
            for key, buf in list(sub._buffers.items()):
                if isinstance(buf, torch.Tensor) and buf.device.type != "cpu":
                    sub._buffers[key] = buf.cpu()
                    moved.append(f"{node.target}.{key}")
    for node in list(graph.nodes):
        if node.op != "get_attr" or not isinstance(_attr_value(module, node), torch.Tensor):
            continue
        scalar = _attr_value(module, node).dim() == 0
        host_users: list[Any] = []
        device_users: list[Any] = []
        for user in node.users:
            host = (
                user in on_host  # shape arithmetic: computed on the host with the shapes it combines
                or _host_reads(module, node, user)
                or (scalar and _reads_scalar_index(module, node, user))
            )
            (host_users if host else device_users).append(user)
        if host_users:
            moved.append(_move_to_host(module, node, host_users, device_users))
    for name, sub in list(module.named_modules()):
        kind = type(sub).__name__
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        if kind == "OnnxConstantOfShape" and name and isinstance(getattr(sub, "value", None), torch.Tensor):
            setattr(parent, child, _ConstantOfShape.make(sub.value))
            moved.append(f"{name} (ConstantOfShape: fill value on the host, output on the device)")
        elif kind == "OnnxShape" and name:
            setattr(parent, child, _HostShape.make(getattr(sub, "_start", 0), getattr(sub, "_end", None)))
            moved.append(f"{name} (Shape)")
    graph.lint()
    module.recompile()
    return moved


def place(module: Any, device: Any, low: Any | None, channels_last: bool, host_constants: bool = True) -> Any:
    """Move ``module`` to ``device`` (its floating weights cast to ``low``, torch.float16 or torch.bfloat16,
    when given; channels-last weights if asked), constants per the module docstring."""
    import torch

    module = module.to(device)
    if low is not None:
        module = module.to(dtype=low)
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
    if host_constants and device.type == "cuda":
        moved = keep_constants_on_host(module, device)
        log.debug("torch engine: kept on the host: %s", ", ".join(moved) or "nothing")
    return module
