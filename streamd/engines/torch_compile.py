"""``engine.compile``: the converted model through ``torch.compile`` (Inductor, Triton kernels on the GPU).

A converted ONNX model runs as many small memory-bound kernels next to its convolutions: a bias add after
every convolution, its activation, concatenations, the pad before a pool. At large batches on a fast GPU
those take most of NanoDet's time (tools/engine_probe.py measures it); Inductor fuses them. The price is a
compile at start-up, about a minute (bench/RESULTS.md; Inductor caches its kernels on disk, so later starts
are quicker). The batch dimension is compiled as dynamic, so every batch size from 2 up shares one
compile (batch 1 is specialised).

Dynamo cannot trace onnx2torch's ``OnnxReshape`` (it builds a ``torch.Size`` from a tensor), so reshapes to a
constant shape are first rewritten into plain ``torch.reshape`` calls (``freeze_reshapes``). Models that
build shapes from the batch size at run time (RT-DETR's Reshape and Tile targets: shape arithmetic the
placement keeps on the host) still fail inside Dynamo; hiding those ops from it (``torch.compiler.disable``)
made Dynamo re-trace the rest of the graph at every one of ~175 breaks (tiny RT-DETR: 527 s for batch 1 on a
CPU core), so they are not compiled. ``compile_checked`` compiles at start-up, on probe batches, and falls
back to the uncompiled module with the reason when the compile fails: ``engine.compile: true`` never stops a
worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)


def _constant(module: Any, node: Any) -> Any:
    owner_name, _, attr = node.target.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return getattr(owner, attr)


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
        with graph.inserting_before(node):
            plain = graph.call_function(torch.reshape, (node.args[0], tuple(dims)))
        node.replace_all_uses_with(plain)
        graph.erase_node(node)
        count += 1
    graph.eliminate_dead_code()
    graph.lint()
    module.delete_all_unused_submodules()
    module.recompile()
    return count


def compile_module(module: Any, backend: str = "inductor") -> Any:
    """``module`` (an fx.GraphModule, placed) ready for ``torch.compile``; the compiled callable. The compile
    itself happens at its first call."""
    import torch

    frozen = freeze_reshapes(module)
    log.info("torch engine: compiling with torch.compile (%s); %d reshape(s) made static", backend, frozen)
    return torch.compile(module, dynamic=True, fullgraph=False, backend=backend)


def compile_checked(
    module: Any, run: Callable[[Any, int], None], batches: Iterable[int], backend: str = "inductor"
) -> tuple[Any, str | None]:
    """``module`` compiled and ``run(compiled, batch)`` once per batch size given (batch 1 is specialised,
    one size from 2 up compiles the dynamic graph): (the compiled callable, None), or (``module`` itself,
    uncompiled, and why) when compiling or running it fails. ``module`` keeps ``freeze_reshapes``' rewrite
    either way (the same computation)."""
    try:
        compiled = compile_module(module, backend)
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
