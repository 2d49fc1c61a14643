"""Several streamd nodes sharing one stream list: placement, failover and fencing on etcd (``cluster:``).

``join_cluster`` is what the supervisor calls at start: off (the default), it changes nothing; on, this node
registers in etcd and starts with its share of the streams (``node.ClusterNode``). Modules: ``placement``
(pure: who owns what), ``etcd`` (the client, timeouts on every call), ``membership`` (lease, keep-alive,
the fencing deadline), ``ownership`` (owner keys), ``resume`` (positions saved in etcd), ``streams`` (the
list, from the file or an etcd key), ``report`` (what /metrics shows).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from streamd.config import EX_CONFIG, Config, ConfigError
from streamd.exitcodes import EX_UNAVAILABLE, StartupError

if TYPE_CHECKING:
    from streamd.cluster.node import ClusterNode

__all__ = ["auto_capacity", "join_cluster"]

GPU_STREAMS = 16  # live 1080p30 streams per GPU worker slot (bench/RESULTS.md)
CPU_STREAMS = 8


def auto_capacity(config: Config) -> int:
    """``cluster.capacity: auto``: streams per GPU in use times the GPUs, or a CPU engine's few."""
    on_gpu = config.engine.type != "onnxruntime" and os.path.exists("/dev/nvidiactl")
    devices = config.pipeline.devices or (config.engine.device,)
    return GPU_STREAMS * len(devices) if on_gpu else CPU_STREAMS


def join_cluster(config: Config) -> tuple[ClusterNode | None, Config, StartupError | None]:
    """(the node or None, the config with this node's streams, a start-up error to raise later)."""
    cfg = config.cluster
    if not cfg.enabled:
        return None, config, None
    from streamd.cluster.etcd import EtcdError
    from streamd.cluster.node import ClusterNode

    capacity = cfg.capacity if isinstance(cfg.capacity, int) else auto_capacity(config)
    try:
        node = ClusterNode(config, capacity)
        streams = node.join(settle_s=min(1.0, cfg.lease_ttl_s / 4))
    except EtcdError as exc:
        where = ", ".join(cfg.etcd)
        error = StartupError(f"cluster: cannot join through etcd at {where}: {exc}", EX_UNAVAILABLE)
        return None, config, error
    except ConfigError as exc:
        return None, config, StartupError("\n".join(exc.problems), EX_CONFIG)
    return node, dataclasses.replace(config, streams=streams), None
