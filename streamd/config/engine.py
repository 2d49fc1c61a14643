"""``engine:`` — which inference backend runs the model, and how."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from streamd.config._fields import Invalid, Problems, opt, path_text, read_section, resolve_path

DEFAULT_CACHE_DIR = Path("~/.cache/streamd").expanduser()


@dataclass(frozen=True)
class EngineConfig:
    """The inference backend. ``auto``: TensorRT if usable, else torch with CUDA, else ONNX Runtime (its CUDA
    execution provider when onnxruntime-gpu sees a GPU, else the CPU)."""

    type: Literal["auto", "tensorrt", "torch", "onnxruntime"] = opt("auto", "the inference backend")
    precision: Literal["fp32", "fp16", "bf16", "int8"] = opt(
        "fp16",
        "compute precision on the GPU (CPU backends run fp32); bf16 needs engine.type torch; int8 needs "
        "tensorrt and a Q/DQ model",
    )
    max_batch: int = opt(8, "largest batch the engine is built for (TensorRT profile max)", ge=1, le=256)
    batch_step: int = opt(
        0,
        "GPU engines: also run (and capture CUDA graphs at) every multiple of this batch size, not only "
        "powers of two; for engine.shared, the workers' pipeline.batch_size: a merged batch of 40-56 rows "
        "then runs as it is instead of as 64 or cut to 32",
        ge=0,
        le=256,
        note="0 = powers of two only",
    )
    device: int = opt(0, "CUDA device index", ge=0)
    cache_dir: Path = opt(  # noqa: RUF009 (opt() is a dataclasses.field)
        DEFAULT_CACHE_DIR,
        "where built engines (TensorRT plans) are cached; ~ expanded, relative to the config file",
    )
    cuda_graphs: bool = opt(True, "run inference through captured CUDA graphs (GPU engines)")
    lanes: int = opt(
        1,
        "batches a GPU engine runs at once, each on its own CUDA stream with its own scratch memory "
        "(torch: a CUDA graph pool; TensorRT: an execution context); 1 = one after another",
        ge=1,
        le=4,
    )
    compile: bool = opt(
        True,
        "torch engine on a GPU: run the model through torch.compile (Inductor fuses the small ops between "
        "the convolutions): about 2x the img/s of YOLOv8s and RT-DETR-l on an H200, for 0.5-1.5 minutes of "
        "compiling at a first start (Inductor's disk cache serves later ones); false starts in seconds; a "
        "model it cannot trace runs uncompiled, with a warning",
    )
    shared: bool = opt(
        False,
        "one engine process per GPU that every worker on that GPU feeds (workers keep decode and "
        "preprocess): full batches and one copy of the engine's memory however many workers; "
        "docs/scaling.md",
    )
    threads: int = opt(0, "CPU engine threads", ge=0, note="0 = the library's default")
    verify: bool = opt(
        True,
        "compare a GPU (or torch) engine with ONNX Runtime CPU at start-up and refuse it if it differs; "
        "false skips the check at your own risk (docs/engines.md)",
    )


def check_cache_dir(value: object, path: str, base_dir: Path) -> Path:
    full = resolve_path(path_text(value, path, "a folder path"), base_dir)
    if full.exists() and not full.is_dir():
        raise Invalid(f"{str(full)!r} exists and is not a folder; pick a folder path", path)
    return full


def parse_engine(raw: object, problems: Problems, base_dir: Path) -> EngineConfig:
    """Check the ``engine:`` section (absent or empty = all defaults)."""
    given = read_section(
        EngineConfig,
        {} if raw is None else raw,
        "engine",
        problems,
        special={"cache_dir": lambda v, p: check_cache_dir(v, p, base_dir)},
    )
    engine = EngineConfig(**given) if given is not None else EngineConfig()
    verify_int8_engine(engine, problems)
    verify_bf16_engine(engine, problems)
    return engine


def verify_bf16_engine(engine: EngineConfig, problems: Problems) -> None:
    # Only the torch engine runs bfloat16 (TensorRT plans and ONNX Runtime's converter here are FP16 / FP32).
    if engine.precision == "bf16" and engine.type != "torch" and problems.ok("engine.type"):
        problems.add(
            "engine.precision",
            f"bf16 with engine.type {engine.type!r}: only the torch engine runs bfloat16; set engine.type: "
            "torch, or use precision fp16",
        )


def verify_int8_engine(engine: EngineConfig, problems: Problems) -> None:
    if engine.precision == "int8" and engine.type != "tensorrt" and problems.ok("engine.type"):
        problems.add(
            "engine.precision",
            f"int8 with engine.type {engine.type!r}: INT8 needs a Q/DQ (quantized) model and TensorRT; "
            "set engine.type: tensorrt, or use precision fp16",
        )
