"""The supervisor process: config, the worker processes, sinks, signals, reload, systemd notify, metrics.

``lifecycle`` (``Supervisor``: start-up, the serve loop, reload, shutdown, exit status), ``pool`` (the worker
processes: partition, spawn, restart, spare), ``reload`` (what a reload changes), ``status`` (the merged
snapshot, health, status line, summary), ``metrics`` (``/metrics``, ``/healthz``, the status page),
``control`` (the reload outcome ``streamd reload`` waits for). It never touches CUDA or pixels.
"""

from streamd.supervisor.lifecycle import Supervisor
from streamd.supervisor.pool import plan_workers

__all__ = ["Supervisor", "plan_workers"]
