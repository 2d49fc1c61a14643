"""ONNX Runtime engine: the CPU provider (the CPU twin of the GPU engines), or the CUDA EP when
``onnxruntime-gpu`` is installed.

CPU: ``infer`` on host arrays; precision is always FP32 (``fp16`` is accepted and runs FP32, so one config
works on both kinds of machine). CUDA EP: ``enqueue`` binds the caller's device buffers with IOBinding and
runs on the caller's stream (``user_compute_stream``; one session per stream, since ORT fixes the stream when
the session is made) without a host synchronisation at the end of the run; ``fp16`` converts the ONNX to FP16
with FP32 input/output (``onnx_tools.convert_to_fp16``). A fixed-batch-1 model is made batch-dynamic when
that is proven equivalent; otherwise, as any fixed batch N, the engine takes exactly N rows (``batch_fixed``)
and ``create_engine`` pads batches to it (``registry.FixedBatch``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from streamd.engines import onnx_tools
from streamd.engines.base import EngineError
from streamd.engines.onnx_outputs import prepare_io
from streamd.engines.options import EngineOptions
from streamd.exitcodes import EX_CONFIG

if TYPE_CHECKING:
    from streamd.gpu.cuda import Stream

log = logging.getLogger(__name__)


def _elem_dtype(elem_type: int) -> np.dtype:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


class OnnxRuntimeEngine:
    """Reads ``EngineOptions``' ``max_batch``, ``precision``, ``threads``, ``device`` and ``provider``."""

    def __init__(self, model_path: Path, options: EngineOptions) -> None:
        import onnxruntime as ort

        max_batch, precision, threads, provider = (
            options.max_batch,
            options.precision,
            options.threads,
            options.provider,
        )
        device = int(options.device) if options.device != "cpu" else 0

        self._ort = ort
        model = onnx_tools.load(model_path)
        model, io, _ = prepare_io(model, model_path, options.input_size)
        self.output_parts = io.parts  # several outputs: packed into one (onnx_outputs)
        if precision == "int8":
            raise EngineError("engine.precision int8 needs engine.type tensorrt and a Q/DQ model", EX_CONFIG)
        if io.batch == 1 and max_batch > 1:
            dynamic = onnx_tools.make_batch_dynamic(model)
            if dynamic is not None and onnx_tools.verify_batch_dynamic(model, dynamic):
                model, io = dynamic, onnx_tools.model_io(dynamic, model_path)  # parts: kept above
        available = ort.get_available_providers()
        want_cuda = provider == "cuda" or (provider == "auto" and "CUDAExecutionProvider" in available)
        if provider == "cuda" and "CUDAExecutionProvider" not in available:
            raise EngineError("onnxruntime: provider cuda asked for, but this onnxruntime has no CUDA EP")
        if want_cuda and precision == "fp16":
            model = onnx_tools.convert_to_fp16(model)
        self._model_bytes = model.SerializeToString()
        self._model_path = model_path
        self._opts = ort.SessionOptions()
        self._opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            self._opts.intra_op_num_threads = threads
        # Idle ORT worker threads spin by default, stealing the cores that decode and preprocess run on.
        self._opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.device = device
        self._input, self._output = io.input_name, io.output_name
        self.batch_fixed = io.batch  # None: dynamic; else every run takes exactly this many rows
        self.max_batch = max_batch if io.batch is None else io.batch
        self.input_shape = io.chw
        self.input_dtype = _elem_dtype(io.input_elem_type)
        self._sessions: dict[int, Any] = {}  # CUDA EP: one session per caller stream
        self._lock = threading.Lock()
        self._session = self._new_session(cuda=want_cuda)
        self.on_device = want_cuda and "CUDAExecutionProvider" in self._session.get_providers()
        if want_cuda and not self.on_device:
            log.warning("onnxruntime: the CUDA EP did not initialise (no GPU?); running on the CPU")
        self.name = "onnxruntime-cuda" if self.on_device else "onnxruntime-cpu"
        if not self.on_device and precision == "fp16":
            log.debug("onnxruntime-cpu runs FP32 (engine.precision fp16 applies to GPU engines)")
        out_type = self._session.get_outputs()[0].type
        self.output_dtype = np.dtype(np.float16 if out_type == "tensor(float16)" else np.float32)
        self._run_options = ort.RunOptions()
        self._run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        probe = self._host_run(np.zeros((io.batch or 1, *self.input_shape), self.input_dtype))
        self.output_shape = (1, *(int(d) for d in probe.shape[1:]))

    def _new_session(self, cuda: bool, stream: int | None = None) -> Any:
        providers: list[Any] = ["CPUExecutionProvider"]
        if cuda:
            cuda_opts = {"device_id": str(self.device)}
            if stream is not None:
                cuda_opts["user_compute_stream"] = str(stream)
            providers = [("CUDAExecutionProvider", cuda_opts), "CPUExecutionProvider"]
        try:
            return self._ort.InferenceSession(self._model_bytes, self._opts, providers=providers)
        except Exception as exc:  # ORT raises several unrelated types for a bad model
            raise EngineError(
                f"model.path: ONNX Runtime cannot load {self._model_path}: {exc}", EX_CONFIG
            ) from exc

    def _host_run(self, batch: np.ndarray) -> np.ndarray:
        (out,) = self._session.run([self._output], {self._input: np.asarray(batch, self.input_dtype)})
        return np.asarray(out)

    def _check_batch(self, batch: int) -> None:
        if self.batch_fixed is not None and batch != self.batch_fixed:
            raise EngineError(f"onnxruntime: the model's batch is fixed at {self.batch_fixed}, got {batch}")
        if batch > self.max_batch:
            raise EngineError(f"onnxruntime: batch {batch} > max_batch {self.max_batch}")

    def infer(self, batch: np.ndarray) -> np.ndarray:
        self._check_batch(len(batch))
        return self._host_run(batch)

    def enqueue(self, input_ptr: int, output_ptr: int, batch: int, stream: Stream) -> None:
        if not self.on_device:
            raise EngineError("onnxruntime-cpu is a host engine: use infer(), not enqueue()")
        if batch < 1:
            raise EngineError(f"onnxruntime: batch {batch} outside 1..{self.max_batch}")
        self._check_batch(batch)
        handle = stream.handle  # ORT's CUDA EP takes the stream as an integer (user_compute_stream)
        with self._lock:
            session = self._sessions.get(handle)
            if session is None:
                session = self._sessions[handle] = self._new_session(cuda=True, stream=handle)
        binding = session.io_binding()
        binding.bind_input(
            self._input, "cuda", self.device, self.input_dtype, [batch, *self.input_shape], input_ptr
        )
        binding.bind_output(
            self._output, "cuda", self.device, self.output_dtype, [batch, *self.output_shape[1:]], output_ptr
        )
        session.run_with_iobinding(binding, self._run_options)

    def close(self) -> None:
        self._session = None
        self._sessions.clear()
