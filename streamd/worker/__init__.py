"""A worker process: ``process`` (its main, the pipe to the supervisor, in ``streamd.protocol``'s messages)
runs ``pipeline.Pipeline``, the data path for its share of the streams (ingest -> batcher -> slot ring ->
engine -> analytics -> JSON lines)."""
