"""The status page (``page.py``) and on-request snapshots of the latest frame with its boxes
(``snapshot.py``). Served by ``streamd.supervisor.server.MetricsServer`` on the metrics port."""
