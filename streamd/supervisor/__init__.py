"""The supervisor process: config, the worker processes, sinks, signals, reload, systemd notify, metrics.

``lifecycle`` (``Supervisor``: start-up, the serve loop, reload, shutdown, exit status), ``pool`` (the worker
processes: partition, spawn, restart, spare, their messages), ``reload`` (what a reload changes) and
``moves`` (carrying it out in the running workers), ``status`` (the snapshot built from the workers' typed
stats, status line, summary), ``health`` (a stream's health), ``metrics`` and ``server`` (``/metrics``,
``/healthz``, the status page), ``control`` (the reload outcome ``streamd reload`` waits for). It never
touches CUDA or pixels.
"""

from streamd.supervisor.lifecycle import Supervisor
from streamd.supervisor.pool import plan_workers

__all__ = ["Supervisor", "plan_workers"]
