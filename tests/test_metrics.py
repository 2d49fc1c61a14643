"""Metrics, health and snapshots over a real socket: /metrics parses with prometheus-client's own parser."""

from __future__ import annotations

import json
import threading
import time

import cv2
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from streamd.latency import LATENCY_BUCKETS_MS, LatencyHistograms
from streamd.supervisor.metrics import render
from streamd.supervisor.server import MetricsServer
from tests.conftest import http_get as get
from tests.sinks._helpers import CLIP, config_with_sinks


def snapshot(stalled_stream: bool = False, wedged: bool = False) -> dict:
    hist = LatencyHistograms()
    for ms in (3.0, 7.0, 40.0, 20000.0):
        hist.observe({"preprocess": ms / 4, "infer": ms / 2, "postprocess": 1.0, "queue": 2.0, "total": ms})
    counters = dict(
        decoded=10, inferred=9, skipped=1, dropped=2, decode_errors=0, read_errors=0, reconnects=1
    )
    stream = {"state": "running", **counters, "stalls": 0, "fps": 29.5, "latency": hist.to_dict()}
    return {
        "elapsed_s": 12.5,
        "results": 19,
        "stalled": wedged,
        "per_stream": {
            "door": {**stream, "worker": 0},
            "yard": {**stream, "worker": 1, "state": "stalled" if stalled_stream else "running"},
        },
        "sink_stats": {"mqtt:broker:1883": {"written": 17, "dropped": 2, "queued": 5, "broken": None}},
        "batches": {0: {"batches": 5, "frames": 15, "size": 4}},
        "workers": {0: {"rss_bytes": 123456789, "gpu_memory_bytes": 2**30}},
    }


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_parse_with_histograms_and_labels() -> None:
    fams = families(render(snapshot()))
    latency = fams["streamd_latency_seconds"]
    assert latency.type == "histogram"
    total = {
        s.labels["le"]: s.value
        for s in latency.samples
        if s.name.endswith("_bucket") and s.labels["stream"] == "door" and s.labels["stage"] == "total"
    }
    assert len(total) == len(LATENCY_BUCKETS_MS) + 1
    assert total["0.005"] == 1 and total["0.01"] == 2 and total["0.05"] == 3 and total["+Inf"] == 4
    decoded = {s.labels["stream"]: s.value for s in fams["streamd_stream_decoded"].samples}
    assert decoded == {"door": 10, "yard": 10}  # keyed by stream alone: a moved stream keeps its series
    carriers = {(s.labels["stream"], s.labels["worker"]) for s in fams["streamd_stream_worker"].samples}
    assert carriers == {("door", "0"), ("yard", "1")}
    for name in ("streamd_stream_inferred", "streamd_stream_skipped", "streamd_stream_reconnects",
                 "streamd_stream_stalls", "streamd_stream_fps", "streamd_stream_state",
                 "streamd_batch_fill_ratio", "streamd_sink_queue_depth", "streamd_sink_dropped",
                 "streamd_resident_memory_bytes", "streamd_gpu_memory_bytes"):  # fmt: skip
        assert fams[name].samples, name
    fill = fams["streamd_batch_fill_ratio"].samples[0]
    assert fill.value == 0.75 and fill.labels == {"worker": "0"}
    rss = {s.labels["process"]: s.value for s in fams["streamd_resident_memory_bytes"].samples}
    assert rss["supervisor"] > 0 and rss["worker-0"] == 123456789
    print(f"{len(fams)} metric families; total-latency buckets for door: {total}")


def test_healthz_degraded_names_a_down_stream_503_when_strict_all_down_or_wedged() -> None:
    current = {"snap": snapshot()}
    server = MetricsServer("127.0.0.1", 0, lambda: current["snap"])
    strict = MetricsServer("127.0.0.1", 0, lambda: current["snap"], stream_down="unhealthy")
    server.start()
    strict.start()
    base = f"http://127.0.0.1:{server.address[1]}"
    strict_base = f"http://127.0.0.1:{strict.address[1]}"
    try:
        code, body = get(f"{base}/healthz")
        info = json.loads(body)
        assert code == 200 and info["status"] == "ok" and info["ok"] is True
        assert info["streams"]["door"]["state"] == "running" and info["streams"]["door"]["health"] == "ok"
        assert get(f"{strict_base}/healthz")[0] == 200
        current["snap"] = snapshot(stalled_stream=True)  # one of two streams down: degraded, still 200
        code, body = get(f"{base}/healthz")
        info = json.loads(body)
        assert code == 200 and info["status"] == "degraded" and info["ok"] is False, info
        assert list(info["down_streams"]) == ["yard"] and info["stalled_streams"] == ["yard"]
        assert not info["pipeline_wedged"]
        code, body = get(f"{strict_base}/healthz")  # metrics.stream_down: unhealthy
        assert code == 503 and json.loads(body)["status"] == "unhealthy"
        snap = snapshot()
        snap["per_stream"]["door"]["state"] = snap["per_stream"]["yard"]["state"] = "reconnecting"
        current["snap"] = snap  # every stream down: 503 whatever the policy
        code, body = get(f"{base}/healthz")
        assert code == 503 and sorted(json.loads(body)["down_streams"]) == ["door", "yard"]
        current["snap"] = snapshot(wedged=True)
        code, body = get(f"{base}/healthz")
        assert code == 503 and json.loads(body)["pipeline_wedged"] is True
        assert get(f"{base}/nothing")[0] == 404
    finally:
        server.close()
        strict.close()


def test_snapshots_are_rate_limited_and_encoded_on_request() -> None:
    calls: list[str] = []
    lock = threading.Lock()

    def frame_snapshot(sid: str) -> bytes | None:
        with lock:
            calls.append(sid)
        return b"\xff\xd8fake\xff\xd9" if sid == "door" else None

    server = MetricsServer("127.0.0.1", 0, snapshot, frame_snapshot=frame_snapshot, snapshots_per_s=2)
    server.start()
    base = f"http://127.0.0.1:{server.address[1]}"
    try:
        assert calls == [], "nothing is encoded until someone asks"
        codes = [get(f"{base}/streams/door/snapshot.jpg")[0] for _ in range(10)]
        assert codes == [200] * 10 and calls == ["door"], "ten requests within 0.5 s: one encode"
        time.sleep(0.6)
        assert get(f"{base}/streams/door/snapshot.jpg")[0] == 200 and calls == ["door", "door"]
        assert get(f"{base}/streams/yard/snapshot.jpg")[0] == 404  # no frame yet
        assert get(f"{base}/streams/nope/snapshot.jpg")[0] == 404  # unknown stream: no call at all
        assert "nope" not in calls
    finally:
        server.close()


def green_pixels(jpeg: bytes) -> int:
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    b, g, r = (image[..., i].astype(int) for i in range(3))
    return int(((g > 180) & (r < 90) & (b < 90)).sum())


def test_daemon_serves_metrics_health_and_a_snapshot_with_boxes(tmp_path, metrics_daemon) -> None:
    cfg = config_with_sinks(
        tmp_path / "m.yaml", f"  - type: jsonl\n    path: {tmp_path / 'o.jsonl'}\n", clip=CLIP, live=True,
        stream_id="demo",
    )  # fmt: skip
    daemon = metrics_daemon(cfg.read_text())
    fams = daemon.wait_for(
        lambda: (f := daemon.metrics()) and f["streamd_frames"].samples[0].value >= 20 and f, "20 frames", 120
    )
    hist = [s for s in fams["streamd_latency_seconds"].samples if s.name == "streamd_latency_seconds_count"]
    stages = {s.labels["stage"] for s in hist if s.labels["stream"] == "demo" and s.value > 0}
    assert {"preprocess", "infer", "postprocess", "queue", "total"} <= stages, stages
    code, info = daemon.healthz()
    assert code == 200 and info["streams"]["demo"]["state"] == "running"
    # The worker answers within 2 s or the request is a 404; on a box this loaded (CI) one may miss that
    code, jpeg = daemon.wait_for(
        lambda: (r := daemon.get("/streams/demo/snapshot.jpg"))[0] == 200 and r, "a snapshot", 30
    )
    assert code == 200 and jpeg[:2] == b"\xff\xd8"
    boxes = green_pixels(jpeg)
    print(f"{len(fams)} families, stages {sorted(stages)}, snapshot {len(jpeg)} bytes, {boxes} box pixels")
    assert boxes > 200, "boxes drawn"
    assert daemon.stop() == 0


def test_gpu_memory_from_nvidia_smi_without_cuda(tmp_path, monkeypatch) -> None:
    """The supervisor never touches CUDA: GPU memory comes from nvidia-smi (a stand-in script here)."""
    import streamd.supervisor.metrics as metrics

    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\ncase \"$1\" in\n  --query-gpu=*) echo '0, 1024'; echo '1, 2048' ;;\n"
        "  --query-compute-apps=*) echo '4242, 512'; echo '99, 64' ;;\nesac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(metrics, "_GPU", metrics.GpuMemory(str(fake)))
    snap = {"per_stream": {}, "workers": {0: {"pid": 4242, "rss_bytes": 1}, 1: {"pid": 7, "rss_bytes": 1}}}
    fams = families(render(snap))
    per_worker = {s.labels["process"]: s.value for s in fams["streamd_gpu_memory_bytes"].samples}
    devices = {s.labels["device"]: s.value for s in fams["streamd_gpu_device_memory_used_bytes"].samples}
    assert per_worker == {"worker-0": 512 * 2**20}
    assert devices == {"0": 1024 * 2**20, "1": 2048 * 2**20}
    assert metrics.GpuMemory("no-such-nvidia-smi").read() == ({}, {})
