"""One engine per GPU, fed by several decode workers (``engine.shared: true``; docs/scaling.md).

The engine process (``process.engine_main``, started by the supervisor) owns the engine and the NMS stage
(``server.EngineServer``); each decode worker's ``client.RemoteStages`` keeps decode and preprocess and sends
its preprocessed batches there. Its rows land in memory the worker exports once per slot (``slots``: CUDA IPC
on the GPU, shared memory on the CPU), the engine process merges the batches of every worker into one engine
batch, and the detections go back over the worker's socket, in model-input pixels.
"""
