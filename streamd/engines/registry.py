"""Backends by name, ``create_engine`` (choose, load, check, fall back) and the fixed-batch adapter
(``FixedBatch``: a model whose ONNX fixes the batch at N runs N rows per call, smaller batches padded).

``create_engine`` picks the backend by name and imports its module only then, so the CPU path never
imports CUDA, torch or TensorRT. ``auto`` = TensorRT if it imports and a GPU exists, else torch if CUDA
works, else ONNX Runtime on the CPU (what the box has: ``Machine``). When the chosen backend fails to
import, build, load or pass its start-up check (``EngineOptions.check``: ``streamd.checks.verify``), ``auto``
says why in one warning and takes the next one (``backend_order``). A GPU backend whose reduced-precision
engine (``fp16``/``bf16``, the default) fails the start-up check is first tried again at FP32, then at
strict FP32 (no TF32, no cuDNN autotuning) — the same GPU, slower arithmetic — before ``auto`` leaves it
(``precision_ladder``): a model whose outputs fp16 cannot carry still runs on the GPU, and the log says
which precision passed.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from streamd.engines.base import (
    PRECISIONS,
    Engine,
    EngineError,
    VerificationError,
    input_nbytes,
    output_nbytes,
    run_padded,
)
from streamd.engines.options import EngineOptions, Machine
from streamd.exitcodes import EX_CONFIG

if TYPE_CHECKING:
    from streamd.gpu.cuda import Stream

log = logging.getLogger(__name__)

# A backend's factory: (model path, options) -> engine.
Factory = Callable[[Path, EngineOptions], Engine]
# name -> "module:factory" (imported only when chosen, so the CPU path never imports CUDA) or a factory.
BACKENDS: dict[str, str | Factory] = {
    "onnxruntime": "streamd.engines.onnxruntime:OnnxRuntimeEngine",
    "torch": "streamd.engines.torch:TorchEngine",
    "tensorrt": "streamd.engines.tensorrt:TensorRTEngine",
}


def choose_backend(requested: str, machine: Machine | None = None) -> str:
    """Resolve ``auto`` to the best backend ``machine`` (default: this box) has (see module docstring); any
    other name is returned unchanged."""
    if requested != "auto":
        return requested
    machine = machine or Machine()
    if machine.has_tensorrt():
        return "tensorrt"
    if machine.has_torch_cuda():
        return "torch"
    return "onnxruntime"


def next_backend(name: str, machine: Machine | None = None) -> str | None:
    """The backend ``auto`` falls back to when ``name`` fails: TensorRT -> torch (if CUDA works) -> ONNX
    Runtime -> none."""
    if name == "tensorrt":
        return "torch" if (machine or Machine()).has_torch_cuda() else "onnxruntime"
    if name == "torch":
        return "onnxruntime"
    return None


def backend_order(requested: str, machine: Machine | None = None) -> list[str]:
    """The backends ``create_engine`` tries, in order: ``auto`` = ``choose_backend`` then each fallback; a
    named backend alone (it fails rather than silently running something else)."""
    order = [choose_backend(requested, machine)]
    while requested == "auto" and (following := next_backend(order[-1], machine)) is not None:
        order.append(following)
    return order


def precision_ladder(requested: str, name: str, options: EngineOptions) -> list[EngineOptions]:
    """The options ``create_engine`` tries for backend ``name``, in order. A named ``engine.type`` gets
    exactly what it asked for. Under ``auto``, a GPU backend asked for a reduced precision (fp16/bf16) also
    gets FP32 and then, for torch, strict FP32 (no TF32, no cuDNN autotuning): each is tried only when the
    one before fails its start-up check. ONNX Runtime and int8 (a Q/DQ model's own precision) are not
    laddered."""
    ladder = [options]
    if requested != "auto" or name == "onnxruntime" or options.precision not in ("fp16", "bf16"):
        return ladder
    ladder.append(replace(options, precision="fp32"))
    if name == "torch" and (options.tf32 or options.cudnn_benchmark):
        # strict: no TF32 (10-bit mantissas), and cuDNN's heuristic algorithms rather than the fastest
        # autotuned ones (FFT/Winograd kernels round more): the closest torch gets to ONNX Runtime's FP32
        ladder.append(replace(options, precision="fp32", tf32=False, cudnn_benchmark=False))
    return ladder


def _label(name: str, options: EngineOptions, attempts: list[tuple[str, EngineOptions]]) -> str:
    """``name``, with the precision when ``auto`` tries this backend at more than one."""
    if sum(tried == name for tried, _ in attempts) == 1:
        return name
    if options.precision == "fp32" and name == "torch" and not options.tf32 and not options.cudnn_benchmark:
        return f"{name} at strict fp32 (no TF32, no cuDNN autotuning)"
    return f"{name} at {options.precision}"


def create_engine(
    requested: str,
    model_path: Path,
    options: EngineOptions | None = None,
    *,
    machine: Machine | None = None,
    backends: Mapping[str, str | Factory] | None = None,
    **fields: Any,
) -> Engine:
    """Load ``model_path`` with the requested backend (``auto``: the best one ``machine`` has, see module
    docstring) and ``options`` (or their ``fields`` as keywords). ``options.check``, when set, runs on each
    engine built; raising refuses it. ``backends`` replaces the ``BACKENDS`` table (tests).
    Raises ``EngineError`` (a ``StartupError``: its ``code`` is the exit code) when no backend can run it.
    """
    if options is None:
        options = EngineOptions(**fields)
    elif fields:
        raise TypeError(f"create_engine: options given twice: {', '.join(fields)}")
    precision, max_batch = options.precision, options.max_batch
    if precision not in PRECISIONS:
        raise EngineError(
            f"engine.precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}", EX_CONFIG
        )
    if max_batch < 1:
        raise EngineError(f"engine.max_batch: expected ≥ 1, got {max_batch}", EX_CONFIG)
    model_path = Path(model_path)
    table = BACKENDS if backends is None else backends
    attempts = [
        (name, tried)
        for name in backend_order(requested, machine)
        for tried in precision_ladder(requested, name, options)
    ]
    index = 0
    while True:
        name, tried = attempts[index]
        try:
            engine = _load(name, model_path, tried, table)
            break
        except Exception as exc:
            error = _as_engine_error(name, exc)
            refused = isinstance(exc, VerificationError)
            following = index + 1
            if not refused:  # only a failed check is a precision problem: the backend's other rungs go too
                while following < len(attempts) and attempts[following][0] == name:
                    following += 1
            if following == len(attempts) or error.code == EX_CONFIG:  # no backend cures a config error
                if error is exc:
                    raise
                raise error from exc
            nxt, then = attempts[following]
            log.warning(
                "engine: %s %s (%s); engine.type auto %s %s",
                _label(name, tried, attempts),
                "refused at start-up" if refused else "could not be brought up",
                error,
                "tries" if nxt == name else "falls back to",
                _label(nxt, then, attempts),
            )
            index = following
    fixed = getattr(engine, "batch_fixed", None)
    if fixed is None and engine.max_batch < max_batch:  # a dynamic engine built for fewer rows
        rows = engine.max_batch
        log.info(
            "engine: %s takes at most %d rows per call: larger batches run in calls of %d (the last padded)",
            name,
            rows,
            rows,
        )
        engine = FixedBatch(engine, rows, max_batch)
    elif fixed is not None and (fixed > 1 or max_batch > 1):
        engine = _fixed_batch(engine, fixed, max_batch, model_path)
    log.info(
        "engine: %s (%s, max batch %d, %s in, %s out)",
        engine.name,
        model_path.name,
        engine.max_batch,
        engine.input_dtype,
        engine.output_dtype,
    )
    return engine


def _factory(name: str, backends: Mapping[str, str | Factory]) -> Factory:
    if name not in backends:
        raise EngineError(
            f"engine.type: unknown backend {name!r}; expected auto or one of {', '.join(backends)}", EX_CONFIG
        )
    entry = backends[name]
    if not isinstance(entry, str):
        return entry
    module_name, factory = entry.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EngineError(f"engine.type: backend {name!r} cannot be imported here: {exc}") from exc
    return getattr(module, factory)  # type: ignore[no-any-return]


def _load(
    name: str, model_path: Path, options: EngineOptions, backends: Mapping[str, str | Factory]
) -> Engine:
    """Import the backend, build/load the engine and run its start-up check (closed again if that fails)."""
    engine = _factory(name, backends)(model_path, options)
    if options.check is not None:  # the caller's (streamd.checks.verify); it closes a refused engine
        options.check(engine, model_path, options)
    return engine


def _as_engine_error(name: str, exc: Exception) -> EngineError:
    """A backend's failure as an EngineError; a library's own exception is named, with the backend."""
    if isinstance(exc, EngineError):
        return exc
    log.debug("engine %s failed", name, exc_info=exc)
    return EngineError(f"engine {name}: {type(exc).__name__}: {exc}")


class FixedBatch:
    """An engine whose model fixes its batch at ``n`` (``engine.batch_fixed``) serving any batch of up to
    ``max_batch`` rows, rounded up to a multiple of ``n``: the model runs on ``n`` rows at a time, a partial
    chunk padded (host: zeros; device: whatever the caller's buffer holds past ``batch``, which holds
    ``max_batch`` rows) and the padding rows' outputs ignored. ``n`` = 1 is image by image (a batch-1 model
    that cannot be proven equivalent with a dynamic batch). Everything else is the engine's."""

    def __init__(self, engine: Engine, n: int, max_batch: int) -> None:
        self.engine = engine
        self.pinned_batch = n
        self.max_batch = -(-max_batch // n) * n
        self._in_bytes = input_nbytes(engine, n)
        self._out_bytes = output_nbytes(engine, n)

    def __getattr__(self, name: str) -> Any:  # name, on_device, shapes, dtypes, backend extras
        return getattr(self.engine, name)

    def _check(self, batch: int) -> None:
        if not 1 <= batch <= self.max_batch:
            raise EngineError(f"{self.engine.name}: batch {batch} outside 1..{self.max_batch}")

    def infer(self, batch: np.ndarray) -> np.ndarray:
        self._check(len(batch))
        return run_padded(self.engine.infer, batch, self.pinned_batch)

    def enqueue(self, input_ptr: int, output_ptr: int, batch: int, stream: Stream) -> None:
        self._check(batch)
        for k in range(-(-batch // self.pinned_batch)):
            self.engine.enqueue(
                input_ptr + k * self._in_bytes, output_ptr + k * self._out_bytes, self.pinned_batch, stream
            )

    def close(self) -> None:
        self.engine.close()


def _fixed_batch(engine: Engine, n: int, max_batch: int, model_path: Path) -> Engine:
    """The engine for a model whose batch is fixed at ``n``: ``n`` rows per model call (one log line)."""
    wrapped = FixedBatch(engine, n, max_batch)
    if n == 1:
        log.info(
            "engine: %s fixes its batch at 1 and cannot be made batch-dynamic: batches of up to %d run "
            "image by image",
            model_path.name,
            wrapped.max_batch,
        )
    else:
        rounded = (
            f" (engine.max_batch {max_batch} rounded up to a multiple of {n})"
            if wrapped.max_batch != max_batch
            else ""
        )
        log.info(
            "engine: %s fixes its batch at %d: the engine runs %d rows per call, a smaller batch padded (the "
            "extra rows' results ignored); batches of up to %d%s",
            model_path.name,
            n,
            n,
            wrapped.max_batch,
            rounded,
        )
    return wrapped
