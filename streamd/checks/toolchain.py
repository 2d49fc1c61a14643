"""``streamd check``: whether ``engine.compile`` (the default) will compile, and whether it can on this host,
before a start finds out minutes in (``streamd.engines.compile_toolchain``). A warning, never a refusal: the
engine then runs uncompiled. Nothing is imported to decide (``find_spec`` only): the check stays quick."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

from streamd.config import Config
from streamd.engines.compile_toolchain import toolchain_problem


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def torch_would_compile(config: Config, importable: Callable[[str], bool] | None = None) -> bool:
    """Whether a GPU worker of this config runs the torch engine compiled: ``engine.compile`` on, and the
    type ``torch``, or ``auto`` where TensorRT is not installed (auto takes it first) and torch is (else ONNX
    Runtime runs). Whether a GPU is present is the caller's question."""
    e = config.engine
    if not e.compile:
        return False
    if e.type == "torch":
        return True
    has = importable or _importable
    return e.type == "auto" and not has("tensorrt") and has("torch")


def compile_warning(
    config: Config, gpu: bool | None = None, importable: Callable[[str], bool] | None = None
) -> str | None:
    """The warning for a config whose torch engine would compile on a GPU here but cannot; None otherwise.
    ``gpu``: whether an NVIDIA device is present (default: its device node, no CUDA call)."""
    if not torch_would_compile(config, importable):
        return None
    if gpu is None:
        gpu = os.path.exists("/dev/nvidiactl")
    if not gpu:
        return None  # on the CPU the torch engine does not compile
    problem = toolchain_problem()
    if problem is None:
        return None
    return f"engine.compile: {problem}; until then the torch engine runs uncompiled (about half the img/s)"
