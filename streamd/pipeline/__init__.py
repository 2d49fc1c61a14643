"""The runtime between ingest and the stages: ``batcher`` (per-stream queues, cross-stream batches) and
``scheduler`` (the slot ring, one thread per stage)."""
