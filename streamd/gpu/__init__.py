"""The low CUDA layer: context, streams, events, buffers (``cuda``), the driver calls an engine makes
(``driver_api``), the NVRTC kernel loader with its cubin cache (``kernels``), CUDA graphs (``graph_cache``)
and the decoder's surface copies (``decoder_io``). It imports nothing of streamd above ``types``,
``exitcodes`` and ``resources``; the stages' kernels (``streamd.stages.*.cuda``) build on it.

Only this package imports ``cuda.bindings``, and only when a GPU object is created, so ``import streamd`` and
``import streamd.gpu`` work on machines without it.
"""
