"""The stream thread under its former names, for the callers not yet renamed: ``StreamWorker`` is
:class:`streamd.ingest.reader.StreamReader`, ``StreamStats`` is :class:`streamd.ingest.stats.StreamStats`."""

from streamd.ingest.reader import StreamReader as StreamWorker
from streamd.ingest.stats import StreamStats

__all__ = ["StreamStats", "StreamWorker"]
