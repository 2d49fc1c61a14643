"""What every zoo builder shares: the record of one built file, seeding, version capture, ONNX introspection.

Imports of torch / onnx happen inside functions: `model_zoo.py list` and `--help` work without the zoo venv.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ONNX_TYPES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64"}


@dataclass
class Built:
    """One ONNX file a builder wrote, with what a consumer needs to know about it."""

    family: str
    variant: str  # "dynamic", "static", "standard", "batched", ...
    path: Path
    exporter: str  # the export call, in words
    packages: tuple[str, ...]  # distributions whose versions matter for this file
    input_layout: str  # colour order, range and normalisation the graph expects
    output_notes: str  # what the values in each output mean (verified, see probe.py)
    build_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    """Random init is the only source of weights: seed every generator a model constructor may draw from."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def versions(names: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed (used from source, see docs/model_zoo.md)"
    return out


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def describe_io(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Names, shapes (int, or a dynamic axis's symbolic name) and dtypes of the graph's inputs/outputs."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def one(value: Any) -> dict[str, Any]:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
        return {
            "name": value.name,
            "shape": dims,
            "dtype": ONNX_TYPES.get(tensor.elem_type, str(tensor.elem_type)),
        }

    return {"inputs": [one(v) for v in model.graph.input], "outputs": [one(v) for v in model.graph.output]}


def opset(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """Exporters that write next to the current directory (Ultralytics) run inside a throw-away folder."""
    old = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(old)


def shift_score_bias(head: Any, attrs: tuple[str, ...], delta: float) -> int:
    """Add `delta` to the bias of the last layer of each class-score branch named in `attrs` (ModuleList of
    Sequential/Conv/Linear, or one layer). Detector heads start from a focal-loss prior (sigmoid ~0.01 or far
    lower), so a random-weight model scores everything near that prior and no usable threshold leaves a box;
    the shift spreads its scores over 0.05-0.5 without touching any other weight. Returns layers changed."""
    import torch

    changed = 0
    with torch.no_grad():
        for attr in attrs:
            branch = getattr(head, attr, None)
            if branch is None:
                continue
            layers = list(branch) if isinstance(branch, torch.nn.ModuleList) else [branch]
            for layer in layers:
                last = layer[-1] if isinstance(layer, torch.nn.Sequential) else layer
                last.bias += delta
                changed += 1
    if not changed:
        raise RuntimeError(f"no score branch {attrs} on {type(head).__name__}")
    return changed


def calibrate_batchnorm(module: Any, images: Any, passes: int = 1) -> None:
    """Set every BatchNorm's running mean/var from `images` ([N,3,H,W] tensor fed to `module`), leaving all
    weights alone. A freshly initialised network keeps mean 0 / var 1 statistics, which in eval mode pass its
    (tiny, with torchvision's std-0.03 init) activations through unnormalised: they vanish layer by layer and
    every output collapses to a constant. A trained model has real frames' statistics."""
    import torch

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over the calibration batches
    was_training = module.training
    module.eval()
    for bn in norms:
        bn.train()
    with torch.no_grad():
        for _ in range(passes):
            for start in range(0, len(images), 4):
                module(images[start : start + 4])
    module.train(was_training)
    for bn in norms:
        bn.eval()
