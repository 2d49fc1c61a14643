"""The cluster where an operator looks: /api/status, /metrics and the status page (a real headless browser),
served from a supervisor snapshot that carries a cluster node's status."""

from __future__ import annotations

import json
import urllib.request

from streamd.supervisor.metrics import render
from streamd.supervisor.server import MetricsServer
from tests.web.test_status_page import browser, wait_for  # noqa: F401 (the fixture)

CLUSTER = {
    "node": "gpu-02",
    "capacity": 4,
    "lease_ttl_s": 10,
    "lease_valid": False,
    "lease_age_s": 12.5,
    "lease_left_s": 0.0,
    "leases_lost": 1,
    "streams_total": 3,
    "streams_here": [],
    "nodes": {
        "gpu-01": {"capacity": 8, "streams": ["cam-1", "cam-3"], "lease_left_s": 7, "lease_age_s": 3},
        "gpu-02": {"capacity": 4, "streams": ["cam-2"], "lease_left_s": 9, "lease_age_s": 1},
    },
    "moves_in": {"failover": 2},
    "moves_out": {"rebalance": 1, "lost": 1},
    "recent_moves": [
        {"t": 1.0, "stream": "cam-2", "from": "gpu-03", "to": "gpu-02", "reason": "failover: gpu-03 left"},
    ],
    "fenced_lines": 17,
    "stream_list": {"source": "config file", "refused": []},
}
SNAP = {"results": 5, "elapsed_s": 2.0, "per_stream": {}, "cluster": CLUSTER}


def test_api_status_and_metrics_show_the_cluster() -> None:
    server = MetricsServer("127.0.0.1", 0, lambda: SNAP)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.address[1]}/api/status", timeout=5) as r:
            assert json.loads(r.read())["cluster"] == CLUSTER
    finally:
        server.close()
    text = render(SNAP)
    for line in (
        'streamd_cluster_node_streams{node="gpu-01"} 2.0',
        'streamd_cluster_node_streams{node="gpu-02"} 1.0',
        'streamd_cluster_node_capacity{node="gpu-01"} 8.0',
        'streamd_cluster_node_lease_age_seconds{node="gpu-01"} 3.0',
        'streamd_cluster_lease_valid{node="gpu-02"} 0.0',
        'streamd_cluster_leases_lost_total{node="gpu-02"} 1.0',
        'streamd_cluster_fenced_lines_total{node="gpu-02"} 17.0',
        'streamd_cluster_moves_total{direction="in",node="gpu-02",reason="failover"} 2.0',
        'streamd_cluster_moves_total{direction="out",node="gpu-02",reason="lost"} 1.0',
    ):
        assert line in text, line
    assert "streamd_cluster" not in render({**SNAP, "cluster": None})  # no cluster: nothing said


def test_the_status_page_shows_the_nodes_and_moves(browser) -> None:  # noqa: F811 (the fixture)
    server = MetricsServer("127.0.0.1", 0, lambda: SNAP)
    server.start()
    try:
        browser.get(f"http://127.0.0.1:{server.address[1]}/")
        script = (
            "const t = document.getElementById('cluster-nodes'); if (!t) return null;"
            "return Array.from(t.querySelectorAll('tr')).map(r =>"
            "  Array.from(r.querySelectorAll('td')).map(td => td.textContent));"
        )
        rows = wait_for(lambda: browser.execute_script(script), 15)
        assert rows[1:] == [
            ["gpu-01", "8", "cam-1 cam-3", "3", "7"],
            ["gpu-02 (this node)", "4", "cam-2", "1", "9"],
        ], rows
        moves = browser.find_element("id", "cluster-moves").text
        assert "LEASE LOST" in moves and "cam-2 gpu-03→gpu-02 (failover: gpu-03 left)" in moves, moves
    finally:
        server.close()
