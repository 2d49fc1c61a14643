"""``streamd check``: whether ``engine.compile`` (the default) can compile on this host, before a start finds
out minutes in (``streamd.engines.compile_toolchain``). A warning, never a refusal: the engine then runs
uncompiled."""

from __future__ import annotations

import importlib.util
import os

from streamd.config import Config
from streamd.engines.compile_toolchain import toolchain_problem


def compile_warning(config: Config, gpu: bool | None = None) -> str | None:
    """The warning for a config whose torch engine would compile on a GPU here but cannot; None otherwise.
    ``gpu``: whether an NVIDIA device is present (default: its device node, no CUDA call)."""
    e = config.engine
    if not e.compile or e.type not in ("auto", "torch"):
        return None
    if e.type == "auto" and importlib.util.find_spec("tensorrt") is not None:
        return None  # auto takes TensorRT where it is usable; compile is the torch engine's
    if gpu is None:
        gpu = os.path.exists("/dev/nvidiactl")
    if not gpu:
        return None  # on the CPU the torch engine does not compile
    problem = toolchain_problem()
    if problem is None:
        return None
    return f"engine.compile: {problem}; until then the torch engine runs uncompiled (about half the img/s)"
