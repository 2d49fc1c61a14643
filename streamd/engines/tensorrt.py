"""TensorRT engine (10.x and 11.x): ONNX -> cached plan -> execution context run on the caller's stream.

Load path: prepare the ONNX (``trt_build.prepare_model``), compute the cache key, deserialize the cached plan
from ``<cache_dir>/engines`` or build it (minutes; progress via ``IProgressMonitor``, systemd kept informed),
then one execution context. A cached plan that fails to deserialize (a driver or TensorRT update the key did
not catch, a truncated file) is deleted and rebuilt once.

Run path (``enqueue``): ``set_input_shape`` when the batch changes, ``set_tensor_address`` for the caller's
slot buffers, ``execute_async_v3`` on the caller's stream (a ``streamd.gpu.cuda.Stream``; its ``handle`` is
what TensorRT and the ``CudaApi`` seam take). With ``cuda_graphs`` the first call for a (batch,
input, output) triple runs normally, then captures the same call into a CUDA graph; later calls launch the
graph. A context's device memory is shared by the calls made with it, so they are ordered by one event.
``lanes`` > 1 gives each of that many streams (round robin by handle) its own execution context (its own
device memory, bindings, graphs and event): calls on different lanes run on the GPU at once.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from streamd.engines import trt_build
from streamd.engines.base import EngineError
from streamd.engines.cache import CacheKey, atomic_write, discard, engines_dir, write_sidecar
from streamd.engines.options import EngineOptions
from streamd.engines.progress import BuildProgress
from streamd.engines.trt_protocols import ICudaEngine, IExecutionContext, TensorRTModule
from streamd.gpu.cuda import CUDAError, Stream
from streamd.gpu.driver_api import CudaApi
from streamd.gpu.graph_cache import GraphCache, GraphKey

log = logging.getLogger(__name__)


def load_tensorrt() -> TensorRTModule:
    try:
        module = importlib.import_module("tensorrt")
    except ImportError as exc:
        raise EngineError(
            "engine.type tensorrt: the tensorrt Python package is not installed (pip install "
            f"tensorrt-cu12 or tensorrt-cu13, matching your CUDA driver): {exc}"
        ) from exc
    return cast(TensorRTModule, module)


def numpy_dtype(trt: TensorRTModule, dtype: Any) -> np.dtype:
    table = [
        (trt.DataType.FLOAT, np.float32),
        (trt.DataType.HALF, np.float16),
        (trt.DataType.INT8, np.int8),
        (trt.DataType.INT32, np.int32),
        (trt.DataType.INT64, np.int64),
        (trt.DataType.BOOL, np.bool_),
        (trt.DataType.UINT8, np.uint8),
    ]
    for member, np_type in table:
        if dtype == member:
            return np.dtype(np_type)
    raise EngineError(f"tensorrt: I/O tensor type {dtype} has no numpy equivalent (use FP32 or FP16 I/O)")


@dataclass(frozen=True)
class PlanInfo:
    path: Path
    key: CacheKey
    prepared: trt_build.PreparedModel
    built: bool  # False: loaded from the cache


def ensure_plan(
    trt: TensorRTModule,
    cuda: CudaApi,
    model_path: Path,
    options: trt_build.BuildOptions,
    *,
    device: int = 0,
    cache_dir: Path | None = None,
    logger: Any = None,
    progress: BuildProgress | None = None,
    rebuild: bool = False,
) -> tuple[PlanInfo, bytes]:
    """The plan for ``model_path`` from the cache, or built now and cached (what ``build-engine`` runs)."""
    major, _ = trt_build.trt_version(trt)
    gpu = cuda.device_info(device)
    prep = trt_build.prepare_model(model_path, options, major, cache_dir)
    key = trt_build.cache_key(trt, gpu, prep, options)
    label = f"trt{trt.__version__}-{options.precision}-b{prep.max_batch}"
    path = engines_dir(cache_dir) / f"{key.file_stem(model_path, label)}.plan"
    if path.is_file() and not rebuild:
        log.info("TensorRT: cached engine %s", path)
        return PlanInfo(path, key, prep, built=False), path.read_bytes()
    log.info(
        "TensorRT %s: building %s for %s (%s, max batch %d); this takes minutes the first time",
        trt.__version__,
        model_path.name,
        gpu[0],
        prep.precision_recipe,
        prep.max_batch,
    )
    logger = logger if logger is not None else trt_build.make_logger(trt)
    timing = trt_build.timing_cache_path(trt, gpu, cache_dir) if options.timing_cache else None
    plan = trt_build.build_plan(trt, prep, options, logger, timing, progress)
    atomic_write(path, plan)
    write_sidecar(path, key, {"model": str(model_path), "prepared_onnx": str(prep.path)})
    return PlanInfo(path, key, prep, built=True), plan


@dataclass(slots=True)
class _Lane:
    """One execution context and what the calls made with it share (see the module docstring)."""

    context: IExecutionContext
    graphs: GraphCache[int]  # failures per (batch, stream)
    done: Any  # event recorded after each call
    bound: tuple[int, int, int] | None = None  # (batch, input ptr, output ptr) set on the context
    last_stream: int | None = None


class TensorRTEngine:
    """TensorRT on the GPU. Reads ``EngineOptions``' common fields and its TensorRT group: ``opt_batch``,
    ``workspace_mb``, ``optimization_level``, ``rebuild`` (ignore the cache), ``progress`` (a
    ``BuildProgress``), ``cancel`` (cancels a build), ``cuda_api`` (a ``CudaApi``; tests pass a fake)."""

    on_device = True

    def __init__(self, model_path: Path, options: EngineOptions) -> None:
        self._closed = True  # until everything below exists
        o = options
        max_batch, precision, device, cache_dir, cuda_graphs, lanes = (
            o.max_batch,
            o.precision,
            int(o.device),
            o.cache_dir,
            o.cuda_graphs,
            o.lanes,
        )
        progress, cancel, cuda_api = o.progress, o.cancel, o.cuda_api
        self.trt = trt = load_tensorrt()
        self._own_cuda: Any = None
        if cuda_api is None:  # the one seam: tests pass a fake CudaApi
            from streamd.gpu.driver_api import DriverApi

            cuda_api = self._own_cuda = DriverApi(device)
        self.cuda: CudaApi = cuda_api
        self.device = device
        self.cuda_graphs = cuda_graphs
        self.logger = trt_build.make_logger(trt)
        build = trt_build.BuildOptions(
            max_batch=max_batch,
            precision=precision,
            opt_batch=o.opt_batch,
            workspace_bytes=(o.workspace_mb << 20) if o.workspace_mb else trt_build.DEFAULT_WORKSPACE,
            optimization_level=o.optimization_level,
            input_size=o.input_size,
        )
        if progress is None:
            progress = BuildProgress(cancel=cancel)
        plan_args = dict(device=device, cache_dir=cache_dir, logger=self.logger, progress=progress)
        self.plan, data = ensure_plan(trt, self.cuda, model_path, build, rebuild=o.rebuild, **plan_args)
        self._runtime = trt.Runtime(self.logger)
        engine = self._deserialize(data)
        if engine is None and not self.plan.built:
            log.warning("TensorRT: cached engine %s does not deserialize; rebuilding it", self.plan.path)
            discard(self.plan.path)
            self.plan, data = ensure_plan(trt, self.cuda, model_path, build, rebuild=True, **plan_args)
            engine = self._deserialize(data)
        if engine is None:
            detail = "; ".join(self.logger.errors) or "no detail from TensorRT"
            raise EngineError(f"TensorRT cannot deserialize the engine it built ({self.plan.path}): {detail}")
        self.engine: ICudaEngine = engine
        self.output_parts = self.plan.prepared.io.parts  # several outputs: packed into one (onnx_outputs)
        self.lanes = max(1, int(lanes))
        self._lanes: list[_Lane] = []
        try:
            for _lane in range(self.lanes):
                self._lanes.append(self._new_lane())
            self.context: IExecutionContext = self._lanes[0].context
            self._inspect_io()
        except BaseException:  # e.g. no GPU memory for another lane's context: free the ones made
            self._free_lanes()
            raise
        self.name = f"tensorrt-{trt.__version__}-{precision}"
        self._lane_of: dict[int, _Lane] = {}  # stream handle -> its lane, given round robin
        self._lock = threading.Lock()
        self._closed = False
        log.info(
            "TensorRT: %s ready (%s), context memory %.0f MiB",
            self.plan.path.name,
            self.plan.prepared.precision_recipe,
            trt_build.device_memory(trt, engine) / 2**20,
        )

    def _new_lane(self) -> _Lane:
        context = self.engine.create_execution_context()
        if context is None:
            raise EngineError(
                f"TensorRT: cannot create an execution context for {self.plan.path} (GPU memory? each of "
                "engine.lanes needs one)"
            )
        return _Lane(context, GraphCache(self.cuda.graph_destroy), self.cuda.event_create())

    def _free_lanes(self) -> None:
        for lane in self._lanes:
            lane.graphs.clear()
            self.cuda.event_destroy(lane.done)
        self._lanes.clear()  # the contexts (and their device memory) go with the last reference

    def _deserialize(self, data: bytes) -> ICudaEngine | None:
        try:
            return self._runtime.deserialize_cuda_engine(data)
        except Exception as exc:  # some versions raise instead of returning None
            log.warning("TensorRT: deserialize failed: %s", exc)
            return None

    def _inspect_io(self) -> None:
        trt, engine = self.trt, self.engine
        inputs: list[str] = []
        outputs: list[str] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(name)
        if len(inputs) != 1 or len(outputs) != 1:
            raise EngineError(
                f"TensorRT engine {self.plan.path}: expected 1 input and 1 output, got {inputs}, {outputs}"
            )
        self.input_name, self.output_name = inputs[0], outputs[0]
        self.input_dtype = numpy_dtype(trt, engine.get_tensor_dtype(self.input_name))
        self.output_dtype = numpy_dtype(trt, engine.get_tensor_dtype(self.output_name))
        shape = tuple(engine.get_tensor_shape(self.input_name))
        c, h, w = (int(d) for d in shape[1:])
        self.input_shape = (c, h, w)
        if shape[0] == -1:
            self.max_batch = int(engine.get_tensor_profile_shape(self.input_name, 0)[2][0])
        else:
            self.max_batch = int(shape[0])
        self.min_batch = 1 if shape[0] == -1 else self.max_batch
        self.batch_fixed = None if shape[0] == -1 else self.max_batch  # create_engine pads batches to it
        for lane in self._lanes:
            lane.context.set_input_shape(self.input_name, (self.min_batch, c, h, w))
        out = tuple(int(d) for d in self.context.get_tensor_shape(self.output_name))
        if any(d < 0 for d in out):
            raise EngineError(f"TensorRT engine {self.plan.path}: output shape {out} is data-dependent")
        self.output_shape = (1, *out[1:])

    # -- run -------------------------------------------------------------------------------------------------

    def _bind(self, lane: _Lane, batch: int, input_ptr: int, output_ptr: int) -> None:
        if lane.bound == (batch, input_ptr, output_ptr):
            return
        c, h, w = self.input_shape
        ctx = lane.context
        new_shape = lane.bound is None or lane.bound[0] != batch
        if new_shape and not ctx.set_input_shape(self.input_name, (batch, c, h, w)):
            raise EngineError(f"TensorRT: input shape {(batch, c, h, w)} is outside the engine's profile")
        if not ctx.set_tensor_address(self.input_name, input_ptr) or not ctx.set_tensor_address(
            self.output_name, output_ptr
        ):
            raise EngineError(
                "TensorRT: set_tensor_address refused the buffers (misaligned or null pointer?)"
            )
        lane.bound = (batch, input_ptr, output_ptr)

    def _execute(self, lane: _Lane, stream: int) -> None:
        if not lane.context.execute_async_v3(stream):
            detail = "; ".join(self.logger.errors) or "see the TensorRT log"
            raise EngineError(f"TensorRT: execute_async_v3 failed: {detail}")

    def enqueue(self, input_ptr: int, output_ptr: int, batch: int, stream: Stream) -> None:
        self._enqueue(input_ptr, output_ptr, batch, stream.handle, self.cuda_graphs)

    def _enqueue(
        self,
        input_ptr: int,
        output_ptr: int,
        batch: int,
        stream: int,
        graphs: bool,
        lane: _Lane | None = None,
    ) -> None:
        if self._closed:
            raise EngineError("TensorRT engine used after close()")
        if not self.min_batch <= batch <= self.max_batch:
            raise EngineError(
                f"TensorRT: batch {batch} outside the engine's range {self.min_batch}..{self.max_batch}"
            )
        cuda = self.cuda
        with self._lock:
            if lane is None:
                lane = self._lane_of.get(stream)
                if lane is None:
                    lane = self._lane_of[stream] = self._lanes[len(self._lane_of) % self.lanes]
            if lane.last_stream is not None and lane.last_stream != stream:
                cuda.stream_wait_event(
                    stream, lane.done
                )  # the lane's previous call (other stream) used its context
            key = (batch, input_ptr, output_ptr)
            graph = lane.graphs.get(key)
            if graph is not None:
                self._bind(lane, *key)  # host-side context state as at capture (a no-op when unchanged)
                cuda.graph_launch(graph, stream)
            else:
                self._bind(lane, batch, input_ptr, output_ptr)
                self._execute(
                    lane, stream
                )  # also the warm-up TensorRT needs after a shape change, before capture
                if graphs and not lane.graphs.failed((batch, stream)):
                    self._capture(lane, key, stream)
            cuda.event_record(lane.done, stream)
            lane.last_stream = stream

    def _capture(self, lane: _Lane, key: GraphKey, stream: int) -> None:
        cuda = self.cuda
        try:
            cuda.begin_capture(stream)
        except CUDAError as exc:
            log.warning(
                "TensorRT: no CUDA graph for batch %d on this stream (%s); running without", key[0], exc
            )
            lane.graphs.fail((key[0], stream))
            return
        try:
            self._execute(lane, stream)
            graph = cuda.end_capture(stream)
        except (CUDAError, EngineError) as exc:
            cuda.abort_capture(stream)
            log.warning("TensorRT: CUDA graph capture failed for batch %d (%s); running without", key[0], exc)
            lane.graphs.fail((key[0], stream))
            return
        lane.graphs.add(key, graph)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Host round trip (tests and tools): copy in, enqueue on a private stream, wait, copy out."""
        n = len(batch)
        x = np.ascontiguousarray(batch, dtype=self.input_dtype)
        out = np.empty((n, *self.output_shape[1:]), self.output_dtype)
        cuda = self.cuda
        stream = cuda.stream_create()
        d_in = cuda.mem_alloc(x.nbytes)
        d_out = cuda.mem_alloc(out.nbytes)
        try:
            cuda.copy_to_device(d_in, x)
            self._enqueue(
                d_in, d_out, n, stream, graphs=False, lane=self._lanes[0]
            )  # one-off buffers: no graph
            cuda.stream_synchronize(stream)
            cuda.copy_to_host(out, d_out)
        finally:
            with self._lock:
                self._lanes[0].bound = None  # the context must not keep addresses that are about to be freed
            cuda.mem_free(d_in)
            cuda.mem_free(d_out)
            cuda.stream_destroy(stream)
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._free_lanes()
        self._lane_of.clear()
        del self.context
        del self.engine
        if self._own_cuda is not None:
            self._own_cuda.close()
