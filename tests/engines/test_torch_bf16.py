"""``engine.precision: bf16``: the torch engine's bfloat16 placement (run on the CPU here: torch has bf16
convolutions there too), and the config refusing bf16 for any other engine.type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from streamd.checks.compare import TOLERANCES
from streamd.config import ConfigError, parse_config
from tests.conftest import CLIP
from tests.engines.tiny_models import random_images


def _raw(engine: dict, model: Path) -> dict:
    return {"streams": [{"id": "a", "url": str(CLIP)}], "model": {"path": str(model)}, "engine": engine}


@pytest.mark.parametrize("engine_type", ["auto", "onnxruntime", "tensorrt"])
def test_bf16_is_a_config_error_naming_the_engine_type(models, engine_type: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_raw({"type": engine_type, "precision": "bf16"}, models["dynamic"]), Path("."))
    (problem,) = caught.value.problems
    assert "engine.precision" in problem and repr(engine_type) in problem and "engine.type: torch" in problem


def test_bf16_with_the_torch_engine_is_accepted(models) -> None:
    config = parse_config(_raw({"type": "torch", "precision": "bf16"}, models["dynamic"]), Path("."))
    assert config.engine.precision == "bf16"
    assert TOLERANCES["bf16"].mean_rel >= TOLERANCES["fp16"].mean_rel  # looser than fp16, never tighter


def test_bf16_placement_matches_onnxruntime_within_bf16_error(torch_ready, models) -> None:
    import torch

    from streamd.engines.torch import convert_model, place

    module, _, _ = convert_model(models["dynamic"], max_batch=2)
    placed = place(module, torch.device("cpu"), torch.bfloat16, channels_last=False)
    weights = [p for p in placed.parameters() if p.is_floating_point()]
    assert weights and all(p.dtype == torch.bfloat16 for p in weights)
    x = random_images(2, 32)
    with torch.inference_mode():
        got = placed(torch.from_numpy(x).to(torch.bfloat16)).float().numpy()
    session = ort.InferenceSession(str(models["dynamic"]), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {session.get_inputs()[0].name: x})
    rel = np.abs(got - want).mean() / np.abs(want).max()
    # bf16 rounds each value to ~3 significant digits: visibly off fp32, but within the start-up tolerance
    assert 0 < rel < TOLERANCES["bf16"].mean_rel, rel
