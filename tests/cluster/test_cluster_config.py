"""The ``cluster:`` section: off by default, endpoints and node name from the environment, messages that name
the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamd.config import ConfigError, parse_config
from streamd.config._fields import Problems
from streamd.config.cluster import ClusterConfig, parse_cluster

STREAMS = [{"id": "a", "url": "rtsp://cam/1"}]


def _parse(section: object, env: dict[str, str]) -> tuple[ClusterConfig, list[str]]:
    problems = Problems("c.yaml", Path("."), {})
    config = parse_cluster(section, problems, env)
    return config, problems.messages()


def test_off_by_default() -> None:
    config = parse_config({"streams": STREAMS}, Path("."))
    assert config.cluster == ClusterConfig() and not config.cluster.enabled
    assert config.cluster.lease_ttl_s == 10


def test_endpoints_and_node_from_the_environment() -> None:
    env = {"STREAMD_ETCD_ENDPOINTS": "http://etcd-0:2379, http://etcd-1:2379", "STREAMD_NODE_NAME": "gpu-3"}
    config, problems = _parse({"enabled": True, "capacity": 32, "lease_ttl_s": 4}, env)
    assert problems == []
    assert config.etcd == ("http://etcd-0:2379", "http://etcd-1:2379") and config.node == "gpu-3"
    assert (config.capacity, config.lease_ttl_s) == (32, 4)
    given, _ = _parse({"enabled": True, "etcd": ["http://e:2379"], "node": "n1"}, env)
    assert given.etcd == ("http://e:2379",) and given.node == "n1"  # the file wins


def test_node_defaults_to_the_host_name() -> None:
    import socket

    config, problems = _parse({"enabled": True, "etcd": "http://e:2379"}, {})
    assert problems == [] and config.node == socket.gethostname().split(".")[0]


@pytest.mark.parametrize(
    ("section", "env", "expected"),
    [
        ({"enabled": True}, {}, "c.yaml: cluster.etcd: the cluster needs etcd"),
        ({"enabled": True, "etcd": ["etcd:2379"]}, {}, "cluster.etcd[0]: expected http://host:port"),
        ({"enabled": True}, {"STREAMD_ETCD_ENDPOINTS": "ftp://x"}, "(from $STREAMD_ETCD_ENDPOINTS)"),
        ({"enabled": True, "etcd": "http://e:1", "capacity": 0}, {}, "cluster.capacity: expected 'auto' or"),
        ({"enabled": True, "etcd": "http://e:1", "lease_ttl_s": 1}, {}, "cluster.lease_ttl_s: expected"),
        ({"enabled": True, "etcd": "http://e:1", "node": "a b"}, {}, "cluster.node: expected a node name"),
        ({"enabled": True, "etcd": "http://e:1", "ttl": 3}, {}, "cluster.ttl"),
    ],
)
def test_problems_name_the_key(section: dict, env: dict[str, str], expected: str) -> None:
    _, problems = _parse(section, env)
    assert any(expected in p for p in problems), problems


def test_streams_may_live_in_etcd_only() -> None:
    cluster = {"enabled": True, "etcd": ["http://e:2379"], "node": "a", "streams_key": "/streamd/streams"}
    config = parse_config({"cluster": cluster}, Path("."))
    assert config.streams == () and config.cluster.streams_key == "/streamd/streams"
    with pytest.raises(ConfigError, match="streams: required key missing"):
        parse_config({"cluster": {**cluster, "streams_key": ""}}, Path("."))


def test_a_stream_list_key_is_checked_like_the_file() -> None:
    from streamd.cluster import auto_capacity
    from streamd.cluster.streams import parse_stream_list

    running = parse_config({"streams": STREAMS}, Path("."))
    (cam,) = parse_stream_list("streams:\n  - id: b\n    url: rtsp://cam/2\n", "etcd key /s", running)
    assert cam.id == "b" and cam.url == "rtsp://cam/2"
    with pytest.raises(ConfigError) as bad:
        parse_stream_list(
            "streams:\n  - id: b\n    url: rtsp://cam/2\n    detect_fps: -3\n", "etcd key /s", running
        )
    assert bad.value.problems[0].startswith("etcd key /s:4: streams[0].detect_fps: expected")
    with pytest.raises(ConfigError, match="only streams: belongs in the stream list key"):
        parse_stream_list("streams: []\nsinks: []\n", "etcd key /s", running)
    with pytest.raises(ConfigError, match="expected YAML with a streams: list"):
        parse_stream_list("- id: b\n", "etcd key /s", running)
    assert (
        auto_capacity(parse_config({"streams": STREAMS, "engine": {"type": "onnxruntime"}}, Path("."))) == 8
    )
