"""From a URL to decoded frames in a stream's queue: ``sources`` (demux files and RTSP, packets only),
``decode`` (CPU and NVDEC decoders) and the per-stream thread: ``reader`` (open, reconnect, stall watch,
frames out) over a ``decoder_slot`` (the stream's decoder across passes and sessions) and a ``timeline``
(indices, pts and arrival times), counting in ``stats``."""

import logging

from streamd import logutil

# One logger for the stream thread (reader and decoder slot), under the name operators filter by. Its
# repeated warnings are rate-limited per stream: 3 per 10 s, then one line with the count.
log = logging.getLogger("streamd.ingest.stream")
logutil.install(log)
