"""ONNX Runtime engine, CPU provider (the CPU twin of the GPU engines)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from streamd.engines.base import EngineError


class OnnxRuntimeEngine:
    name = "onnxruntime-cpu"
    on_device = False

    def __init__(self, model_path: Path, *, max_batch: int, precision: str = "fp32", threads: int = 0, **_) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        try:
            self._session = ort.InferenceSession(os.fspath(model_path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises several unrelated types for a bad file
            raise EngineError(f"model.path: ONNX Runtime cannot load {model_path}: {exc}") from exc
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1:
            raise EngineError(
                f"model.path: expected a model with one input and one output, got {len(inputs)} inputs "
                f"and {len(outputs)} outputs ({model_path})"
            )
        self._input, self._output = inputs[0].name, outputs[0].name
        shape = inputs[0].shape
        if len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]):
            raise EngineError(f"model input: expected [B, 3, H, W] with fixed C, H, W; got {shape}")
        self.batch_fixed = shape[0] if isinstance(shape[0], int) else None
        self.max_batch = max_batch if self.batch_fixed is None else min(max_batch, self.batch_fixed)
        self.input_shape = (int(shape[1]), int(shape[2]), int(shape[3]))
        probe = self.infer(np.zeros((1, *self.input_shape), np.float32))
        self.output_shape = tuple(probe.shape)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        if self.batch_fixed == 1 and len(batch) > 1:  # models exported with batch 1 run frame by frame
            return np.concatenate([self.infer(batch[i : i + 1]) for i in range(len(batch))])
        (out,) = self._session.run([self._output], {self._input: batch})
        return np.asarray(out, np.float32)

    def close(self) -> None:
        self._session = None
