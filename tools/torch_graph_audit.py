"""Which nodes of a converted model would break CUDA graph capture — found on the CPU.

A CUDA graph captures device work only: during capture, a host→device copy (``torch.tensor(data,
device=cuda)``, a host tensor of more than one element meeting a device op) or a device→host read
(``.item()``, ``.tolist()``, ``nonzero``) fails ("cannot copy between CPU and CUDA tensors during capture",
"operation not permitted when stream is capturing"). On a CPU box every tensor is on the CPU, so this script
tracks where each tensor *would* live once the engine places the model (``streamd.engines.torch.place``:
weights on the device, the constants ``keep_constants_on_host`` keeps on the host) and runs the fx graph
node by node under a dispatch mode that names each node doing one of those things.

  python tools/torch_graph_audit.py tests/data/zoo/rtdetr-l-tiny-160-dyn.onnx --input-size 160 160
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def audit(
    model_path: Path | None,
    input_size: tuple[int, int] | None,
    batch: int = 2,
    copies: bool = True,
    converted: tuple[Any, tuple[int, int, int]] | None = None,
) -> list[tuple[str, str, str]]:
    """(node, module type, what) for each capture-breaking operation of one forward pass. ``copies=False``:
    without the engine's kept device copies of host values (to see what they are for); ``converted``: an
    already converted (fx module, (C, H, W)) instead of ``model_path``."""
    import torch
    from torch.fx import Interpreter
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from streamd.engines.torch import (
        HOST_ARGS,
        SCALAR_INDEX_ARGS,
        convert_model,
        host_valued,
        keep_constants_on_host,
    )

    if converted is not None:
        module, chw = converted
    else:
        assert model_path is not None
        module, io, _ = convert_model(model_path, batch, input_size)
        chw = io.chw
    module.eval()
    on_host = host_valued(module)  # shape arithmetic: the engine runs these nodes on the host
    # as place() does on a GPU (on the CPU the constants stay where they are, the copies copy nothing)
    host_names = set(keep_constants_on_host(module, torch.device("cpu") if copies else None))
    host: dict[int, Any] = {}  # id -> the tensor, kept alive so that no id is reused
    for name, value in list(module.named_buffers()) + list(module.named_parameters()):
        if name in host_names or name.endswith("_host"):
            host[id(value)] = value
    for _name, sub in module.named_modules():
        value = getattr(sub, "value", None)
        if type(sub).__name__ == "OnnxConstantOfShape" and isinstance(value, torch.Tensor):
            host[id(value)] = value
    # every other tensor starts on the device; results of ops with only host inputs are host tensors
    found: list[tuple[str, str, str]] = []
    current: list[Any] = ["?", "?", False]  # node, its module type, computed on the host
    reads = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.equal.default"}

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            flat = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            out = func(*args, **kwargs)
            name = str(func)
            on_device = [a for a in flat if id(a) not in host]
            on_host = [a for a in flat if id(a) in host]
            if name in reads and on_device:
                found.append((current[0], current[1], f"device→host read ({name})"))
            elif name.startswith(("aten.lift_fresh", "aten.scalar_tensor")):
                on_device = []  # a new tensor from Python data: a host tensor until it meets the device
            elif not flat:  # arange, zeros, full: made where the converted op asks (its inputs' device)
                if current[2]:
                    host.update((id(o), o) for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor))
                return out
            elif on_device and any(a.dim() > 0 for a in on_host) and "copy" not in name:
                shapes = [tuple(a.shape) for a in on_host if a.dim() > 0]
                found.append((current[0], current[1], f"host tensor {shapes} into {name}"))
            outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
            if not on_device:
                host.update((id(o), o) for o in outs)
            return out

    class Walk(Interpreter):
        def run_node(self, n: Any) -> Any:
            current[0] = n.name
            current[1] = type(self.module.get_submodule(n.target)).__name__ if n.op == "call_module" else n.op
            current[2] = n in on_host
            if n.op == "call_module":  # an op reading arguments on the host (.tolist()): are they there?
                args, _ = self.fetch_args_kwargs_from_env(n)
                for pos in HOST_ARGS.get(current[1], ()):
                    if pos < len(args) and isinstance(args[pos], torch.Tensor) and id(args[pos]) not in host:
                        found.append((n.name, current[1], f"device→host read of argument {pos}"))
                for pos in SCALAR_INDEX_ARGS.get(current[1], ()):
                    a = args[pos] if pos < len(args) else None
                    if isinstance(a, torch.Tensor) and a.dim() == 0 and id(a) not in host:
                        found.append((n.name, current[1], f"device scalar index (argument {pos}) read back"))
            out = super().run_node(n)
            if current[1] == "DeviceCopy":  # a kept device copy: made outside the graph, a device tensor
                out = out.clone()  # on the CPU the copy is its input itself: give it its own identity
                host.pop(id(out), None)
            return out

    c, h, w = chw
    x = torch.rand(batch, c, h, w)
    with torch.inference_mode(), Watch():
        Walk(module).run(x)
    return found


def audit_cuda(model_path: Path, input_size: tuple[int, int] | None, batch: int = 2) -> list[str]:
    """On a GPU: the model placed as the engine places it (``place``), run node by node eagerly and then
    under CUDA graph capture; the first node that fails in each, with its arguments' devices."""
    import torch
    from torch.fx import Interpreter

    from streamd.engines.torch import convert_model, place

    module, io, _ = convert_model(model_path, batch, input_size)
    module = place(module, torch.device("cuda", 0), None, True)  # as the engine: channels-last weights
    c, h, w = io.chw
    x = torch.rand(batch, c, h, w, device="cuda")
    report: list[str] = []

    class Walk(Interpreter):
        def run_node(self, n: Any) -> Any:
            try:
                return super().run_node(n)
            except Exception as exc:
                args, _ = self.fetch_args_kwargs_from_env(n)
                devices = [str(a.device) + str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor)]
                kind = type(self.module.get_submodule(n.target)).__name__ if n.op == "call_module" else n.op
                report.append(f"{n.name} ({kind}) args {devices}: {type(exc).__name__}: {str(exc)[:200]}")
                raise

    with torch.inference_mode():
        try:
            Walk(module).run(x)
        except Exception:
            return ["eager: " + r for r in report]
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                Walk(module).run(x)
        except Exception as exc:
            report.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            return ["capture: " + r for r in report]
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--input-size", type=int, nargs=2, metavar=("W", "H"))
    ap.add_argument("--cuda", action="store_true", help="run it on the GPU (eager, then captured)")
    args = ap.parse_args()
    size = tuple(args.input_size) if args.input_size else None
    if args.cuda:
        problems = audit_cuda(args.model, size)  # type: ignore[arg-type]
        print("\n".join(problems) or "eager and captured: no failure")
        return 1 if problems else 0
    found = audit(args.model, size)  # type: ignore[arg-type]
    for node, kind, what in found:
        print(f"{node:40s} {kind:28s} {what}")
    print(f"{len(found)} capture-breaking operations; by module type:", dict(Counter(k for _, k, _ in found)))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
