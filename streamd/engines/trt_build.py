"""Building TensorRT plans: ONNX preparation, precision recipes, cache keys, the builder itself.

Precision, by TensorRT major version (see docs/engines.md):

- fp32: the ONNX as is.
- fp16: TRT 10 sets ``BuilderFlag.FP16`` on a weakly typed network (TensorRT picks FP16 kernels where they are
  faster); TRT 11 has no precision flags and only strongly typed networks, so the ONNX is converted to FP16
  first (``onnx_tools.convert_to_fp16``; graph input and output stay FP32, so callers see no difference).
- int8: only from an explicitly quantised ONNX (QuantizeLinear/DequantizeLinear nodes). TRT 10 sets
  ``BuilderFlag.INT8`` (+ FP16 for the unquantised layers); TRT 11 builds the Q/DQ network strongly typed.
  Calibration (``IInt8Calibrator``) is not supported: it is deprecated in 10 and gone in 11.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from streamd.engines import onnx_tools
from streamd.engines.base import EngineError
from streamd.engines.cache import CacheKey, atomic_write, engines_dir, platform_tag
from streamd.engines.onnx_outputs import prepare_io
from streamd.engines.progress import BuildProgress
from streamd.engines.trt_protocols import (
    ICudaEngine,
    IHostMemory,
    INetworkDefinition,
    OnnxParser,
    TensorRTModule,
)

log = logging.getLogger(__name__)
trt_log = logging.getLogger("streamd.engines.tensorrt.trt")

DEFAULT_WORKSPACE = 4 << 30


def trt_version(trt: TensorRTModule) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", trt.__version__)
    if not match:
        raise EngineError(f"tensorrt: cannot read the version {trt.__version__!r}")
    major, minor = int(match.group(1)), int(match.group(2))
    if major < 10:
        raise EngineError(f"tensorrt {trt.__version__} is too old: streamd needs TensorRT 10 or newer")
    return major, minor


@dataclass(frozen=True)
class BuildOptions:
    """What the builder is asked for. ``opt_batch`` None = ``max_batch`` (the batch a loaded pipeline
    runs)."""

    max_batch: int
    precision: str = "fp16"
    opt_batch: int | None = None
    min_batch: int = 1
    workspace_bytes: int = DEFAULT_WORKSPACE
    optimization_level: int = 3
    timing_cache: bool = True
    input_size: tuple[int, int] | None = None  # (width, height) for a model with dynamic input H/W


@dataclass(frozen=True)
class PreparedModel:
    """The ONNX TensorRT parses (the original file, or a converted copy in the cache) and what was done."""

    path: Path
    io: onnx_tools.ModelIO
    source_sha256: str
    steps: tuple[str, ...]  # recipes applied, in order
    precision_recipe: str
    strongly_typed: bool
    flags: tuple[str, ...]  # BuilderFlag names to set (TRT 10)
    max_batch: int


def precision_plan(major: int, precision: str, qdq: bool) -> tuple[str, bool, tuple[str, ...], bool]:
    """(recipe, strongly typed, builder flags, convert ONNX to fp16) for a precision on a TRT major
    version."""
    if precision == "int8" and not qdq:
        raise EngineError(
            "engine.precision int8 needs an explicitly quantised ONNX model (QuantizeLinear/DequantizeLinear "
            "nodes, e.g. from NVIDIA TensorRT Model Optimizer); streamd does not calibrate (INT8 calibrators "
            "are deprecated in TensorRT 10 and removed in 11). Use precision fp16, or a Q/DQ model."
        )
    if major >= 11:
        if precision == "fp16":
            return "fp16:onnx-converted,strongly-typed", True, (), True
        if precision == "int8":
            return "int8:qdq,strongly-typed", True, (), False
        return "fp32:strongly-typed", True, (), False
    if precision == "fp16":
        return "fp16:builder-flag", False, ("FP16",), False
    if precision == "int8":
        return "int8:qdq,builder-flags", False, ("INT8", "FP16"), False
    return "fp32", False, (), False


def prepare_model(
    model_path: Path, options: BuildOptions, major: int, cache_dir: Path | None
) -> PreparedModel:
    """Check the ONNX, make a fixed batch of 1 dynamic when a larger batch is asked for, convert for
    precision."""
    model = onnx_tools.load(model_path)
    model, io, fixed = prepare_io(model, model_path, options.input_size)
    parts = io.parts
    sha = onnx_tools.file_sha256(model_path)
    recipe, strongly, flags, to_fp16 = precision_plan(major, options.precision, onnx_tools.has_qdq(model))
    steps: list[str] = list(fixed)  # a dynamic H/W pinned: the network, and so the profile, at input_size
    max_batch = options.max_batch
    if io.batch is not None and io.batch != 1:
        max_batch = io.batch  # a fixed batch > 1 is what the model takes, no more, no less
    elif io.batch == 1 and max_batch > 1:
        dynamic = onnx_tools.make_batch_dynamic(model)
        if dynamic is not None and onnx_tools.verify_batch_dynamic(model, dynamic):
            model, io = dynamic, replace(onnx_tools.model_io(dynamic, model_path), parts=parts)
            steps.append(onnx_tools.DYNAMIC_BATCH_RECIPE)
        else:
            log.warning("%s: fixed batch 1 that cannot be made dynamic; max batch 1", model_path.name)
            max_batch = 1
    if to_fp16:
        model = onnx_tools.convert_to_fp16(model)
        steps.append(onnx_tools.FP16_RECIPE)
    path = model_path
    if steps:
        key = CacheKey({"onnx_sha256": sha, "steps": steps})
        path = engines_dir(cache_dir) / f"{key.file_stem(model_path, 'prepared')}.onnx"
        if not path.is_file():
            atomic_write(path, model.SerializeToString())
    return PreparedModel(path, io, sha, tuple(steps), recipe, strongly, flags, max_batch)


def profile_shapes(prep: PreparedModel, options: BuildOptions) -> tuple[tuple[int, ...], ...] | None:
    """(min, opt, max) input shapes for a dynamic batch; None for a fixed-batch model (no profile). C, H, W
    are the same in all three: a dynamic H/W was pinned at ``model.input_size`` (``prepare_model``)."""
    if prep.io.batch is not None:
        return None
    chw = prep.io.chw
    top = prep.max_batch
    opt = min(max(options.opt_batch or top, options.min_batch), top)
    return (options.min_batch, *chw), (opt, *chw), (top, *chw)


def cache_key(
    trt: TensorRTModule, gpu: tuple[str, tuple[int, int]], prep: PreparedModel, options: BuildOptions
) -> CacheKey:
    """Everything the plan depends on (see docs/engines.md, "Engine cache")."""
    shapes = profile_shapes(prep, options)
    return CacheKey(
        {
            "tensorrt": trt.__version__,
            "gpu": gpu[0],
            "compute_capability": f"{gpu[1][0]}.{gpu[1][1]}",
            "platform": platform_tag(),
            "onnx_sha256": prep.source_sha256,
            "prepare": list(prep.steps),
            "precision": prep.precision_recipe,
            "profile": {prep.io.input_name: [list(s) for s in shapes]} if shapes else None,
            "builder": {
                "workspace_bytes": options.workspace_bytes,
                "optimization_level": options.optimization_level,
                "strongly_typed": prep.strongly_typed,
                "flags": list(prep.flags),
            },
        }
    )


def timing_cache_path(trt: TensorRTModule, gpu: tuple[str, tuple[int, int]], cache_dir: Path | None) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu[0]).strip("-").lower()
    return engines_dir(cache_dir) / f"timing-trt{trt.__version__}-{slug}-sm{gpu[1][0]}{gpu[1][1]}.cache"


def make_logger(trt: TensorRTModule) -> Any:
    """A ``tensorrt.ILogger`` routing messages to Python logging; keeps the last errors for messages."""
    base: Any = trt.ILogger
    sev = trt.ILogger.Severity
    levels = [
        (sev.INTERNAL_ERROR, logging.CRITICAL),
        (sev.ERROR, logging.ERROR),
        (sev.WARNING, logging.WARNING),
        (sev.INFO, logging.DEBUG),  # TensorRT's INFO is chatty
        (sev.VERBOSE, logging.DEBUG),
    ]

    class _Logger(base):  # type: ignore[misc]
        def __init__(self) -> None:
            base.__init__(self)
            self.errors: deque[str] = deque(maxlen=20)

        def log(self, severity: Any, msg: str) -> None:
            level = next((lv for s, lv in levels if s == severity), logging.INFO)
            if level >= logging.ERROR:
                self.errors.append(msg)
            trt_log.log(level, "%s", msg)

    return _Logger()


def make_progress_monitor(trt: TensorRTModule, progress: BuildProgress) -> Any:
    """A ``tensorrt.IProgressMonitor`` forwarding to ``progress``; exceptions are logged, never raised into
    TensorRT (they would abort the process from a C++ callback)."""
    base: Any = trt.IProgressMonitor

    class _Monitor(base):  # type: ignore[misc]
        def __init__(self) -> None:
            base.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            try:
                progress.phase_start(phase_name, parent_phase, num_steps)
            except Exception:
                log.exception("build progress display failed")

        def step_complete(self, phase_name: str, step: int) -> bool:
            try:
                return bool(progress.step(phase_name, step))
            except Exception:
                log.exception("build progress display failed")
                return True

        def phase_finish(self, phase_name: str) -> None:
            try:
                progress.phase_finish(phase_name)
            except Exception:
                log.exception("build progress display failed")

    return _Monitor()


def parser_errors(parser: OnnxParser, onnx_path: Path) -> str:
    """One line per ONNX parser error, naming the node (index, operator, name) and the parser's location."""
    lines = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        where = f"node {err.node()}"
        if err.node_name() or err.node_operator():
            where += f" ({err.node_operator()} {err.node_name()!r})"
        lines.append(f"  {where}: {err.desc()} [{err.code()}; {err.file()}:{err.line()} {err.func()}]")
    return f"TensorRT cannot parse {onnx_path}:\n" + "\n".join(lines or ["  (no error details)"])


def _check_network_io(network: INetworkDefinition, prep: PreparedModel) -> None:
    if network.num_inputs != 1 or network.num_outputs != 1:
        raise EngineError(
            f"{prep.path}: TensorRT sees {network.num_inputs} inputs and {network.num_outputs} outputs; "
            "expected one of each"
        )


def build_plan(
    trt: TensorRTModule,
    prep: PreparedModel,
    options: BuildOptions,
    logger: Any,
    timing_cache: Path | None,
    progress: BuildProgress | None = None,
) -> bytes:
    """Parse ``prep.path`` and build a serialized plan (minutes for a large model)."""
    major, _ = trt_version(trt)
    builder = trt.Builder(logger)
    flags = 0
    if prep.strongly_typed:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(prep.path)):
        raise EngineError(parser_errors(parser, prep.path))
    _check_network_io(network, prep)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    config.builder_optimization_level = options.optimization_level
    if major < 11:
        for flag in prep.flags:
            config.set_flag(trt.BuilderFlag.FP16 if flag == "FP16" else trt.BuilderFlag.INT8)
    shapes = profile_shapes(prep, options)
    if shapes is not None:
        profile = builder.create_optimization_profile()
        profile.set_shape(prep.io.input_name, *shapes)
        config.add_optimization_profile(profile)
    if timing_cache is not None:
        data = timing_cache.read_bytes() if timing_cache.is_file() else b""
        try:
            cache = config.create_timing_cache(data)
        except Exception as exc:  # a corrupt file: start over with an empty cache
            log.warning("timing cache %s unreadable (%s); starting a new one", timing_cache, exc)
            cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
    if progress is not None:
        config.progress_monitor = make_progress_monitor(trt, progress)
    t0 = time.monotonic()
    plan: IHostMemory | None = builder.build_serialized_network(network, config)
    if plan is None:
        detail = "; ".join(getattr(logger, "errors", ())) or "see the TensorRT log above"
        raise EngineError(f"TensorRT could not build an engine from {prep.path}: {detail}")
    log.info(
        "TensorRT: built %s (%s) in %.0f s", prep.path.name, prep.precision_recipe, time.monotonic() - t0
    )
    if timing_cache is not None:
        used = config.get_timing_cache()
        if used is not None:
            atomic_write(timing_cache, memoryview(used.serialize()))  # type: ignore[arg-type]
    return bytes(memoryview(plan))  # type: ignore[arg-type]


def device_memory(trt: TensorRTModule, engine: ICudaEngine) -> int:
    """Device memory an execution context of ``engine`` needs (the property was renamed in TensorRT 11)."""
    major, _ = trt_version(trt)
    return int(engine.device_memory_size_v2 if major >= 11 else engine.device_memory_size)
