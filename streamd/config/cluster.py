"""``cluster:`` — several nodes share one stream list through etcd (off by default: one node, every stream).

Each stream is owned by exactly one live node, chosen by rendezvous hashing weighted by capacity
(``streamd.cluster``). The environment fills what the file leaves out, so one config serves every pod of a
StatefulSet: ``STREAMD_ETCD_ENDPOINTS`` (comma-separated) when ``etcd`` is empty, ``STREAMD_NODE_NAME`` when
``node`` is empty (else the host name).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from streamd.config._fields import Invalid, Problems, describe, opt, read_section

ENDPOINTS_ENV = "STREAMD_ETCD_ENDPOINTS"
NODE_ENV = "STREAMD_NODE_NAME"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_PREFIX = re.compile(r"/[A-Za-z0-9._/-]*[A-Za-z0-9._-]")


@dataclass(frozen=True)
class ClusterConfig:
    """Placement and failover of streams across nodes, on etcd."""

    enabled: bool = opt(False, "place the streams across every node of the cluster (needs etcd)")
    etcd: tuple[str, ...] = opt(
        (),
        "etcd client endpoints (http://host:2379); empty = $STREAMD_ETCD_ENDPOINTS (comma-separated)",
        doc_type="a list of http(s)://host:port URLs",
    )
    node: str = opt(
        "",
        "this node's name, unique in the cluster; empty = $STREAMD_NODE_NAME, else the host name",
        doc_type="letters, digits, '.', '_', '-' (at most 63)",
    )
    capacity: int | str = opt(
        "auto",
        "streams this node carries at full load; placement gives each node a share proportional to it",
        note="auto = 16 per GPU worker slot on a GPU box, 8 on the CPU engine",
        doc_type="'auto' or an integer 1..10000",
    )
    lease_ttl_s: int = opt(
        10,
        "seconds a node that stops answering keeps its streams; its streams move after this",
        ge=2,
        le=300,
    )
    prefix: str = opt(
        "/streamd",
        "etcd key prefix of this cluster (nodes, owners, resume state, stream list live under it)",
        pattern=_PREFIX.pattern,
        pattern_doc="an absolute key path such as /streamd/site-a",
    )
    streams_key: str = opt(
        "",
        "etcd key holding the stream list (YAML with a streams: list), read by every node and watched; "
        "empty = the config file's streams",
    )
    timeout_s: float = opt(2.0, "the longest any one etcd request may take", gt=0, le=30)
    resume_every_s: float = opt(
        1.0, "how often each stream's position (frame index, pts) is saved in etcd", ge=0.2, le=60
    )

    @property
    def margin_s(self) -> float:
        """Fencing margin: a node stops writing this long before its lease could have expired in etcd."""
        return max(0.5, self.lease_ttl_s / 5)


def parse_cluster(raw: object, problems: Problems, env: Mapping[str, str] | None = None) -> ClusterConfig:
    """Check the ``cluster:`` section (absent = off); fills endpoints and node name from ``env``."""
    env = os.environ if env is None else env
    given = read_section(
        ClusterConfig,
        {} if raw is None else raw,
        "cluster",
        problems,
        special={"etcd": _check_endpoints, "capacity": _check_capacity, "node": _check_node},
    )
    if given is None:
        return ClusterConfig()
    config = ClusterConfig(**given)
    if not config.enabled:
        return config
    etcd, node = config.etcd, config.node
    if not etcd and env.get(ENDPOINTS_ENV, "").strip():
        try:
            etcd = _check_endpoints(env[ENDPOINTS_ENV].split(","), f"${ENDPOINTS_ENV}")
        except Invalid as exc:
            problems.add("cluster.etcd", exc.message + f" (from ${ENDPOINTS_ENV})")
    elif not etcd and problems.ok("cluster.etcd"):
        problems.add(
            "cluster.etcd",
            f"the cluster needs etcd: list its endpoints (etcd: [http://etcd:2379]) or set ${ENDPOINTS_ENV}",
        )
    if not node:
        raw_node = env.get(NODE_ENV, "").strip() or socket.gethostname().split(".")[0]
        try:
            node = _check_node(raw_node, "cluster.node")
        except Invalid as exc:
            problems.add("cluster.node", exc.message + f" (from ${NODE_ENV} or the host name); set node:")
    if config.streams_key and not config.streams_key.startswith("/"):
        problems.add(
            "cluster.streams_key",
            f"expected an absolute etcd key such as /streamd/streams, got {config.streams_key!r}",
        )
    return ClusterConfig(**{**given, "etcd": etcd, "node": node})


def _check_endpoints(value: object, path: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise Invalid(f"expected a list of etcd URLs (http://host:2379), got {describe(value)}", path)
    out = []
    for i, item in enumerate(value):
        text = item.strip() if isinstance(item, str) else item
        parts = urlsplit(text) if isinstance(text, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise Invalid(
                f"expected http://host:port or https://host:port, got {describe(item)}", f"{path}[{i}]"
            )
        try:
            parts.port  # noqa: B018 (raises on a bad port)
        except ValueError:
            raise Invalid(f"bad port in {text!r}; write http://host:2379", f"{path}[{i}]") from None
        out.append(text.rstrip("/"))
    return tuple(out)


def _check_capacity(value: object, path: str) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10000:
        raise Invalid(
            f"expected 'auto' or an integer between 1 and 10000 (streams), got {describe(value)}", path
        )
    return value


def _check_node(value: object, path: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value.strip()):
        raise Invalid(
            f"expected a node name of letters, digits, '.', '_', '-' (at most 63), got {describe(value)}",
            path,
        )
    return value.strip()
