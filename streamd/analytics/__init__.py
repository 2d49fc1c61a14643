"""Per-stream analytics after detection: detection rate (``detect_fps``), zones, tracking, zone events (enter,
dwell, leave) and line crossings.

Pure numpy (plus ``lap`` for the tracker's assignment); never imports CUDA or torch. One
``StreamAnalytics`` per stream lives in the process that holds the stream (see ``streamd.analytics.stream``).
"""
