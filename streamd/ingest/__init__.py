"""From a URL to decoded frames in a stream's queue: ``sources`` (demux files and RTSP, packets only),
``decode`` (CPU and NVDEC decoders) and ``stream`` (one thread per stream: reconnects, timeline, pacing)."""
