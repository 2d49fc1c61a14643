"""GPU core: CUDA driver layer, NVRTC kernel loader with cubin cache, preprocess and NMS kernels.

Only this package imports ``cuda.bindings``, and only when a GPU object is created, so ``import streamd`` and
``import streamd.gpu`` work on machines without it. Typical use::

    ctx = Context(0)
    loader = KernelLoader(ctx)                      # cubins cached under ~/.cache/streamd/kernels
    s1 = Stream(ctx, priority=-1)
    pre = GpuPreprocessor(pre_spec, ctx, max_batch=16, dtype="float16", loader=loader)
    transforms = pre([Nv12Surface.contiguous(ptr, w, h) for ...], input_tensor_ptr, s1)
    post = GpuPostprocessor(post_spec, ctx, max_batch=16, num_anchors=8400, loader=loader)
    res, host = post.new_results(), post.new_host_results()
    post(output_ptr, batch, s3, res); res.download(host, s3, batch); done = s3.record()
    done.synchronize(); detections = host.detections(batch)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CUDAError": "cuda", "Context": "cuda", "Stream": "cuda", "Event": "cuda", "DeviceBuffer": "cuda",
    "PinnedBuffer": "cuda", "check": "cuda", "gpu_available": "cuda", "device_pointer": "cuda",
    "copy_htod": "cuda", "copy_dtoh": "cuda", "copy_dtod": "cuda",
    "KernelLoader": "kernels", "KernelCompileError": "kernels", "compile_source": "kernels",
    "GpuPreprocessor": "preprocess", "Nv12Surface": "preprocess", "PackedSurface": "preprocess",
    "GpuPostprocessor": "postprocess", "NmsResults": "postprocess", "HostNmsResults": "postprocess",
}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'streamd.gpu' has no attribute {name!r}")
    return getattr(importlib.import_module(f"streamd.gpu.{module}"), name)
