"""torch engine: the ONNX model converted with onnx2torch, run on the caller's CUDA stream (the GPU engine
where TensorRT is not available).

Conversion (``convert_model``): fixed batch 1 made dynamic when provably equivalent, onnxslim (if installed)
folds Pads, ScatterND, Casts and shape arithmetic into constants, onnx2torch builds an ``fx.GraphModule``.
Placement (``place``, ``streamd.engines.torch_place``): weights on the GPU (FP16 / BF16 with ``precision:
fp16`` / ``bf16``, optionally channels-last); the small constants and the shape arithmetic that converted ops
read on the host stay there, and device ops get kept copies of the host values they read — so a CUDA graph
can capture the forward pass. Input and output stay FP32 whatever the precision.

Run (``enqueue``): the caller's device pointers are wrapped as tensors (``__cuda_array_interface__``, no
copy), the forward pass runs under ``torch.cuda.ExternalStream`` of the caller's stream (a
``streamd.gpu.cuda.Stream``: its ``handle``) and writes the output
in place. With ``cuda_graphs`` the first call for a (batch, input, output) triple runs eagerly (also cuDNN's
autotuning warm-up) and captures the same call; later calls replay the graph.

Lanes (``lanes``, default 1): each CUDA stream the engine is called on is given a lane, round robin; a lane
has its own graphs, its own graph memory pool and its own ordering event, so calls on different lanes run on
the GPU at once (the weights are shared: they are only read), while calls in one lane never overlap, which
is what makes its graphs' shared pool safe. Two batches in the engine at once is what lifts a pipeline
bound by inference: a batch-32 NanoDet call leaves much of an H200 idle (bench/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from streamd.engines import onnx_tools, torch_ops
from streamd.engines.base import EngineError
from streamd.engines.onnx_outputs import prepare_io
from streamd.engines.options import EngineOptions
from streamd.engines.torch_place import HOST_ARGS as HOST_ARGS  # re-exported: tools, tests
from streamd.engines.torch_place import SCALAR_INDEX_ARGS as SCALAR_INDEX_ARGS
from streamd.engines.torch_place import host_valued as host_valued
from streamd.engines.torch_place import keep_constants_on_host as keep_constants_on_host
from streamd.engines.torch_place import place
from streamd.exitcodes import EX_CONFIG
from streamd.gpu.cuda import Stream
from streamd.gpu.graph_cache import MAX_GRAPHS, GraphCache

log = logging.getLogger(__name__)


def convert_model(
    model_path: Path, max_batch: int, input_size: tuple[int, int] | None = None
) -> tuple[Any, onnx_tools.ModelIO, tuple[str, ...]]:
    """ONNX file -> (fx.GraphModule on the CPU in FP32, its I/O, the preparation steps applied). A model
    whose input H/W are dynamic is converted at ``input_size`` ((width, height): ``model.input_size``), the
    one shape it then runs at (CUDA graphs are captured per shape)."""
    model = onnx_tools.load(model_path)
    model, io, fixed = prepare_io(model, model_path, input_size)
    steps: list[str] = list(fixed)
    parts = io.parts
    if io.batch == 1 and max_batch > 1:
        dynamic = onnx_tools.make_batch_dynamic(model)
        if dynamic is not None and onnx_tools.verify_batch_dynamic(model, dynamic):
            model, io = dynamic, replace(onnx_tools.model_io(dynamic, model_path), parts=parts)
            steps.append(onnx_tools.DYNAMIC_BATCH_RECIPE)
    module, more = convert_onnx(model, model_path.name)
    return module, io, (*steps, *more)


def convert_onnx(model: Any, name: str = "model") -> tuple[Any, tuple[str, ...]]:
    """Any ``onnx.ModelProto`` -> (fx.GraphModule on the CPU in FP32, steps): onnxslim, streamd's rewrites
    of the ops onnx2torch translates wrongly (``torch_ops``), the build-time op check, onnx2torch."""
    steps: list[str] = []
    model, recipe = onnx_tools.slim(model)
    if recipe:
        steps.append(recipe)
    else:
        log.info("torch engine: onnxslim not installed; converting %s unsimplified", name)
    try:
        onnx2torch = torch_ops.import_onnx2torch()
    except ImportError as exc:
        raise EngineError(
            f"engine.type torch needs onnx2torch (pip install 'streamd[torch]'): {exc}"
        ) from exc
    model, rewritten = torch_ops.rewrite_for_torch(model)
    if rewritten:
        steps.append(torch_ops.TORCH_REWRITE_RECIPE)
        log.info("torch engine: %s: exact ONNX semantics for %s", name, ", ".join(rewritten))
    torch_ops.check_convertible(model)
    try:
        module = onnx2torch.convert(model)
    except Exception as exc:  # NotImplementedError for unsupported ops, and others
        raise EngineError(f"onnx2torch cannot convert {name}: {exc}") from exc
    return module.eval(), tuple(steps)


class _CudaArray:
    """A device buffer we do not own, shaped for torch.as_tensor (no copy, no stream synchronisation)."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "data": (ptr, False),
            "version": 2,
        }


@dataclass(slots=True)
class _Lane:
    """What calls on one lane share: their graphs and graph pool, and the event that orders them."""

    done: Any  # torch.cuda.Event recorded after each call
    pool: Any  # torch.cuda.graph_pool_handle()
    graphs: GraphCache[Any] = field(default_factory=GraphCache)  # torch frees a dropped graph
    last_stream: int | None = None


class TorchEngine:
    """Reads ``EngineOptions``' common fields and its torch group: ``lanes`` (calls in flight on the GPU at
    once, see the module docstring), ``compile`` (``streamd.engines.torch_compile``), ``channels_last``,
    ``cudnn_benchmark`` (process-wide), ``tf32`` (FP32 convolutions may use TF32, as TensorRT does);
    ``device`` may be ``"cpu"`` (a host engine, for tests)."""

    def __init__(self, model_path: Path, options: EngineOptions) -> None:
        import torch

        o = options
        max_batch, precision, threads, device, cuda_graphs = (
            o.max_batch,
            o.precision,
            o.threads,
            o.device,
            o.cuda_graphs,
        )
        lanes, compile, channels_last, cudnn_benchmark, tf32 = (
            o.lanes,
            o.compile,
            o.channels_last,
            o.cudnn_benchmark,
            o.tf32,
        )

        self._torch = torch
        self._closed = True
        if precision == "int8":
            raise EngineError("engine.precision int8 needs engine.type tensorrt and a Q/DQ model")
        on_cpu = device == "cpu"
        if not on_cpu:
            if not torch.cuda.is_available():
                raise EngineError("engine.type torch: torch sees no CUDA device (use onnxruntime on the CPU)")
            count = torch.cuda.device_count()
            if not 0 <= int(device) < count:
                raise EngineError(
                    f"CUDA device {device} does not exist: this process sees {count} (0..{count - 1}); check "
                    "engine.device, pipeline.devices and CUDA_VISIBLE_DEVICES",
                    EX_CONFIG,
                )
        self.device = torch.device("cpu") if on_cpu else torch.device("cuda", int(device))
        self.on_device = not on_cpu
        self.half = precision in ("fp16", "bf16") and not on_cpu  # a 16-bit compute type
        self.channels_last = channels_last and not on_cpu
        self.cuda_graphs = cuda_graphs and not on_cpu
        if on_cpu and threads:
            torch.set_num_threads(threads)
        # what the numbers depend on beyond the precision (part of the start-up check's cache key)
        self.numerics = "cpu" if on_cpu else f"tf32={tf32},cudnn_benchmark={cudnn_benchmark}"
        if not on_cpu:
            torch.backends.cudnn.benchmark = cudnn_benchmark
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
        cpu_module, io, self.steps = convert_model(model_path, max_batch, o.input_size)
        self.output_parts = io.parts  # several outputs: packed into one (onnx_outputs)
        self.input_shape = io.chw
        self.input_dtype = np.dtype(np.float32)
        self.output_dtype = np.dtype(np.float32)
        self.batch_fixed = io.batch  # None: dynamic; else every call takes exactly this many rows
        self.max_batch = max_batch if io.batch is None else io.batch
        low = (torch.bfloat16 if precision == "bf16" else torch.float16) if self.half else None
        self._compute_dtype = low or torch.float32
        self.name = f"torch-{'cpu' if on_cpu else 'cuda'}-{precision if self.half else 'fp32'}"
        rows = io.batch or 1
        probe = torch.from_numpy(
            np.random.default_rng(0).standard_normal((rows, *self.input_shape), np.float32)
        )
        self.module = place(cpu_module, self.device, low, self.channels_last)
        try:
            try:
                out = self._forward(probe.to(self.device))
            except RuntimeError as exc:  # a constant kept on the host meets a device op: all on the device
                log.warning(
                    "torch engine: host shape constants do not fit this model (%s); no CUDA graphs", exc
                )
                self.cuda_graphs = False
                fresh = convert_model(model_path, max_batch, o.input_size)[0]
                self.module = place(fresh, self.device, low, self.channels_last, host_constants=False)
                out = self._forward(probe.to(self.device))
        except TypeError as exc:
            if any(s.startswith("onnxslim") for s in self.steps):
                raise
            # Unsimplified, onnx2torch's ops meet shape tensors they cannot take (RT-DETR's Tile: TypeError
            # from torch.Size); onnxslim folds those computations away.
            raise EngineError(
                f"torch engine: {model_path.name} does not run unsimplified ({exc}); onnxslim did not run "
                "(missing, or it failed: see the warning above): pip install 'streamd[torch]'"
            ) from exc
        self.output_shape = (1, *(int(d) for d in out.shape[1:]))
        self.compile_failure: str | None = None  # why engine.compile fell back (None: not asked, or fine)
        if compile and self.on_device:
            self._compile(probe, max_batch)
        self._lock = threading.Lock()
        self.lanes = max(1, int(lanes)) if self.on_device else 1
        self._lanes: list[_Lane] = []
        for _lane in range(self.lanes if self.on_device else 0):
            self._lanes.append(_Lane(torch.cuda.Event(), torch.cuda.graph_pool_handle()))
        self._lane_of: dict[int, _Lane] = {}  # stream handle -> its lane, given round robin
        self._streams: dict[int, Any] = {}
        self._views: dict[tuple[int, tuple[int, ...]], Any] = {}
        self._staging: tuple[Any, Any, Any] | None = None
        self._closed = False

    def _compile(self, probe: Any, max_batch: int) -> None:
        """``engine.compile``: compiled at start-up on probe batches (1 and 2, or the fixed batch) rather than
        in a pipeline slot's first call; a model Dynamo cannot trace runs uncompiled, with a warning."""
        from streamd.engines.compile_toolchain import toolchain_problem
        from streamd.engines.progress import keep_alive
        from streamd.engines.torch_compile import compile_checked

        if problem := toolchain_problem():  # else it would fail only after Dynamo's trace, minutes in
            self.compile_failure = problem
            log.warning("torch engine: engine.compile skipped: %s; it runs uncompiled", problem)
            return
        torch = self._torch

        def run(module: Any, batch: int) -> None:
            # the seeded probe, as many rows as asked, as a slot holds its input; converted by _prepare as
            # _forward does, so the compiled graph's guards (the input's dtype, layout, and whether it is an
            # inference tensor) are those of every later call: else the first pipeline call (fp16/bf16, or
            # channels-last) would compile it again
            rows = probe[:1].expand(batch, *probe.shape[1:]).to(self.device).contiguous()
            with torch.inference_mode():
                module(self._prepare(rows))
            torch.cuda.synchronize(self.device)

        sizes = [probe.shape[0]] if self.batch_fixed is not None else sorted({1, min(2, max_batch)})
        started = time.monotonic()
        # minutes for a large model (RT-DETR-l), with no progress to report: systemd's start-up timeout is
        # extended meanwhile (a TensorRT build does the same through its progress callbacks)
        with keep_alive("compiling the model (engine.compile)"), torch.cuda.device(self.device):
            self.module, self.compile_failure = compile_checked(
                self.module, run, sizes, one_as_two=self.batch_fixed is None and max_batch >= 2
            )
        if self.compile_failure is None:
            self.steps = (*self.steps, "torch.compile")
            log.info("torch engine: compiled in %.1f s (batch sizes %s)", time.monotonic() - started, sizes)
        else:
            log.warning(
                "torch engine: engine.compile failed for this model after %.1f s (%s); it runs uncompiled, "
                "as with engine.compile: false",
                time.monotonic() - started,
                self.compile_failure,
            )

    # -- compute ---------------------------------------------------------------------------------------------

    def _prepare(self, x: Any) -> Any:
        """The input as the model takes it (compute dtype, layout); called in inference mode, so a converted
        input is an inference tensor — the same kind for the compile probe as for every call (_compile)."""
        torch = self._torch
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return x.to(dtype=self._compute_dtype, memory_format=fmt)

    def _forward(self, x: Any) -> Any:
        with self._torch.inference_mode():
            return self.module(self._prepare(x))

    def _run(self, x: Any, y: Any) -> None:
        out = self._forward(x)
        with self._torch.inference_mode():
            y.copy_(out)

    def _view(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        key = (ptr, shape)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 4 * MAX_GRAPHS:
                self._views.clear()
            view = self._torch.as_tensor(_CudaArray(ptr, shape, dtype), device=self.device)
            self._views[key] = view
        return view

    def _stream(self, handle: int) -> Any:
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = self._torch.cuda.ExternalStream(handle, device=self.device)
        return stream

    def enqueue(self, input_ptr: int, output_ptr: int, batch: int, stream: Stream) -> None:
        self._enqueue(input_ptr, output_ptr, batch, stream)

    def _enqueue(
        self, input_ptr: int, output_ptr: int, batch: int, stream: Stream, lane: _Lane | None = None
    ) -> None:
        """``lane`` None: the stream's lane (given round robin); ``infer`` passes lane 0 (its staging stream
        must not take a lane from the pipeline's streams)."""
        if self._closed:
            raise EngineError("torch engine used after close()")
        if not self.on_device:
            raise EngineError("torch engine on the CPU is a host engine: use infer()")
        self._check_batch(batch)
        torch = self._torch
        key = (batch, input_ptr, output_ptr)
        handle = stream.handle
        with self._lock:
            ext = self._stream(handle)
            lane = lane or self._lane_of.get(handle)
            if lane is None:
                lane = self._lane_of[handle] = self._lanes[len(self._lane_of) % self.lanes]
            # set_stream rather than `with torch.cuda.device(), torch.cuda.stream()`: those asked torch for
            # the device count and current device on every call, a few percent of a batch-1 ring's GIL time.
            # (It also makes the engine's device the calling thread's current one: a worker has one GPU.)
            prev = torch.cuda.current_stream(self.device)
            torch.cuda.set_stream(ext)
            try:
                if lane.last_stream is not None and lane.last_stream != handle:
                    ext.wait_event(lane.done)  # the lane's previous call, on another stream, used its pool
                graph = lane.graphs.get(key)
                if graph is not None:
                    graph.replay()
                else:
                    x = self._view(input_ptr, (batch, *self.input_shape), self.input_dtype)
                    y = self._view(output_ptr, (batch, *self.output_shape[1:]), self.output_dtype)
                    self._run(x, y)  # the result of this call, and the warm-up before capture
                    if self.cuda_graphs and not lane.graphs.failed(batch):
                        self._capture(lane, key, x, y)
                lane.done.record(ext)
            finally:
                torch.cuda.set_stream(prev)
            lane.last_stream = handle

    def graph_counts(self) -> tuple[int, int]:
        """(CUDA graphs captured, batch sizes whose capture failed and so run eagerly), over all lanes."""
        lanes = self._lanes
        return sum(len(lane.graphs) for lane in lanes), sum(lane.graphs.failures for lane in lanes)

    def _check_batch(self, batch: int) -> None:
        if self.batch_fixed is not None and batch != self.batch_fixed:
            raise EngineError(f"torch engine: the model's batch is fixed at {self.batch_fixed}, got {batch}")
        if not 1 <= batch <= self.max_batch:
            raise EngineError(f"torch engine: batch {batch} outside 1..{self.max_batch}")

    def _capture(self, lane: _Lane, key: tuple[int, int, int], x: Any, y: Any) -> None:
        torch = self._torch
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=lane.pool, capture_error_mode="thread_local"):
                self._run(x, y)
        except Exception as exc:  # torch raises RuntimeError for ops that cannot be captured
            # A capture that fails inside leaves the caching allocator allocating into the graph's pool
            # (torch ends that only when capture_end succeeds): the next capture then fails with "already
            # recording", and memory freed into that pool can be handed out again under later engines'
            # tensors. End it here, and capture nothing more in this engine: what failed at one batch size
            # fails at the others.
            end = getattr(torch._C, "_cuda_endAllocateToPool", None)  # torch >= 2.8
            end = end or getattr(torch._C, "_cuda_endAllocateCurrentStreamToPool", None)  # before
            if end is None:
                log.debug(
                    "torch engine: no way to end the allocator's recording in torch %s", torch.__version__
                )
            else:
                with contextlib.suppress(RuntimeError):  # already ended (capture_end got that far)
                    end(self.device.index or 0, lane.pool)
            torch.cuda.synchronize(self.device)
            log.warning(
                "torch engine: CUDA graph capture failed for batch %d (%s); this engine runs without CUDA "
                "graphs (tools/torch_graph_audit.py names the op)",
                key[0],
                str(exc).splitlines()[0],
            )
            lane.graphs.fail(key[0])
            self.cuda_graphs = False
            return
        lane.graphs.add(key, graph)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Host arrays in and out. On the GPU: staged through max-batch device buffers and ``enqueue`` on a
        private stream (the pipeline's code path, graphs included), then waited for."""
        torch = self._torch
        n = len(batch)
        self._check_batch(n)
        x = torch.from_numpy(np.ascontiguousarray(batch, dtype=self.input_dtype))
        if not self.on_device:
            return self._forward(x).float().numpy()
        with self._lock:
            if self._staging is None:
                d_in = torch.empty(
                    (self.max_batch, *self.input_shape), dtype=torch.float32, device=self.device
                )
                d_out = torch.empty(
                    (self.max_batch, *self.output_shape[1:]), dtype=torch.float32, device=self.device
                )
                self._staging = (d_in, d_out, torch.cuda.Stream(self.device))
        d_in, d_out, stream = self._staging
        with torch.cuda.stream(stream):
            d_in[:n].copy_(x, non_blocking=False)
            self._enqueue(
                d_in.data_ptr(), d_out.data_ptr(), n, Stream.borrow(stream.cuda_stream), self._lanes[0]
            )
            out = d_out[:n].cpu()
        stream.synchronize()
        return out.numpy()

    def release_unused(self) -> int:
        """Once start-up is over (the start-up check, every slot's warm-up and capture): drop ``infer``'s
        max-batch staging buffers (max_batch x (input + output) bytes: ~0.5 GB for YOLOv8s at 640 and batch
        64) and give the caching allocator's free blocks back to the driver (every capture already empties
        it, so that is mostly the staging). The model and the CUDA graph pools stay; a later ``infer`` or new
        capture allocates again. Returns the bytes given back."""
        if not self.on_device or self._closed:
            return 0
        torch = self._torch
        with self._lock, torch.cuda.device(self.device):
            if self._staging is not None:
                self._staging[2].synchronize()
                self._staging = None
            before = torch.cuda.memory_reserved(self.device)
            torch.cuda.empty_cache()
            return max(0, before - torch.cuda.memory_reserved(self.device))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lane in self._lanes:
            lane.graphs.clear()
        self._lanes.clear()
        self._lane_of.clear()
        self._views.clear()
        self._streams.clear()
        self._staging = None
        self.module = None
