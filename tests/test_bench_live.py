"""bench/bench_live.py on the CPU: the benchmark of record runs end to end (a real `streamd run` with ONNX
Runtime, paced streams, a kill -9 of a worker) and picks the largest clean stream count by its rule."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from bench.bench_live import largest_clean
from tests.conftest import CLIP, ROOT


def _row(n: int, **kw) -> dict:
    row = {"streams": n, "realtime": True, "drops_in_window": 0, "p99_ms": 20.0, "streams_seen": n}
    return {**row, "min_stream_share": 1.0, **kw}


def test_largest_clean_needs_every_stream_carried_without_drops_in_time() -> None:
    rows = [_row(64), _row(120, p99_ms=49.9), _row(160, p99_ms=50.1), _row(200, drops_in_window=3)]
    assert largest_clean(rows) == 120
    assert largest_clean([_row(64), _row(320, streams_seen=268)]) == 64  # 52 streams never got a decoder
    assert largest_clean([_row(64), _row(96, min_stream_share=0.9)]) == 64  # behind, not dropping yet
    assert largest_clean([_row(64), _row(96, realtime=False)]) == 64  # unpaced rows measure capacity
    assert largest_clean([_row(64, error="not ready")]) is None


@pytest.mark.slow
def test_bench_live_runs_on_the_cpu(tmp_path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "bench/bench_live.py", "--clip", str(CLIP), "--fps", "10", "--engine", "onnxruntime",
         "--streams", "2", "--workers", "2", "--devices", "0", "1", "--restart", "2", "--restart-worker", "1",
         "--ceiling-threads", "0", "--ceiling-processes", "0", "--warmup", "2", "--window", "4",
         "--engine-img-s", "40", "--out", str(out), "--tmp", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((out / "bench_live.json").read_text())
    (row,) = results["ramp"]
    daemon_log = "".join(f.read_text()[-1500:] for f in sorted(out.glob("daemon-*.log")))
    assert row["streams"] == 2 and row["devices"] == [0, 1] and row["delivered_fps"] > 0, (row, daemon_log)
    assert row["exit"] == 0 and row["streams_seen"] == 2
    # where the time goes, per stage of the detected frames; the CPU stages run infer (no engine process)
    assert {"decode", "queue", "infer", "batch"} <= set(row["stage_p50_ms"]) and "engine" not in row[
        "stage_p50_ms"
    ]
    assert all(row["stage_p99_ms"][k] >= v >= 0 for k, v in row["stage_p50_ms"].items())
    assert row["stage_p50_ms"]["batch"] <= row["p99_ms"]  # a part of the packet-to-result time
    assert 0 < row["ready_after_s"] < 300 and "compile_s" not in row  # ONNX Runtime: nothing compiled
    assert results["largest_clean_streams"] == largest_clean(results["ramp"])
    restart = results["restart"]
    assert restart["killed_worker"] == 1 and restart["moved_to_spare"] and restart["exit"] == 0
    assert " 1 worker restart(s)" in restart["summary"]  # the killed one; the other worker never restarted
    assert restart["victims_first_frames"] == [0]
    # No frame is lost across the kill: a missing frame index (in any stream) must be one the daemon counted
    # as dropped after decode, which a box too busy to keep up does by design (0 on an idle box).
    gaps = restart["victims_gaps"] + restart["others_gaps"]
    assert restart["dropped_after_decode"] is not None and gaps <= restart["dropped_after_decode"], restart
    assert "largest N with 0 drops and p99 <= 50 ms" in (out / "bench_live.md").read_text()
    # the pipeline's efficiency against the engine's own rate given on the command line (issue 26 point 3)
    assert row["engine_efficiency"] == round(row["detected_fps"] / 40, 3) and row["engine_efficiency"] > 0
    assert "of it" in (out / "bench_live.md").read_text()


def test_a_shared_engine_row_counts_its_merged_batches(tmp_path) -> None:
    """--shared: the row gives the engine process's rows per batch over the window, from the daemon's /metrics
    (engine.shared's engine counters), and the engine stage of the lines (no timing: runs beside the rest)."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "bench/bench_live.py", "--clip", str(CLIP), "--fps", "5", "--engine", "onnxruntime",
         "--streams", "3", "--workers", "2", "--batch", "2", "--shared", "--no-spare",
         "--ceiling-threads", "0", "--ceiling-processes", "0", "--warmup", "3", "--window", "6",
         "--out", str(out), "--tmp", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = json.loads((out / "bench_live.json").read_text())["ramp"]
    assert row["shared_engine"] and row["exit"] == 0 and row["delivered_fps"] > 0, row
    assert "engine" in row["stage_p50_ms"] and "infer" not in row["stage_p50_ms"]
    # the engine's rows a second over the window are the detected frames' rate (lines by decode time, a
    # window shifted by the latency: the same rate once steady), read between two fresh beats
    print(f"engine rows/s {row['engine_rows_per_s']}, detected fps {row['detected_fps']}")
    assert 0.75 * row["detected_fps"] <= row["engine_rows_per_s"] <= 1.33 * row["detected_fps"], row
    # two workers of batch 2, each with batches in flight, feed one engine of max_batch 64
    assert 1.0 <= row["engine_rows_per_batch"] <= 64, row
    assert f"engine {row['engine_rows_per_batch']} rows/batch" in (out / "bench_live.md").read_text()


def test_engine_counters_are_read_as_a_beat_brings_them() -> None:
    """The engine's counters in /metrics move once a second (its beat): the window's ends are read just after
    they move, with the time they moved (a real HTTP server on loopback serves counters that move 0.4 s after
    the first read); counters that never move (an idle engine) come back after the wait, as they are."""
    import http.server
    import threading

    from bench.bench_live import fresh_engine_counters

    moved_at: list[float] = []
    start = time.time()

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            rows = 10.0
            if time.time() - start >= 0.4:
                rows = 26.0
                if not moved_at:
                    moved_at.append(time.time())
            body = (f'streamd_engine_batches_total{{device="0"}} {rows / 2}\n'
                    f'streamd_engine_rows_total{{device="0"}} {rows}\n').encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        batches, rows, at = fresh_engine_counters(server.server_address[1])
        assert (batches, rows) == (13.0, 26.0)
        assert moved_at and 0 <= at - moved_at[0] < 0.5, (at, moved_at)  # not up to a beat (1 s) late
        t0 = time.time()
        assert fresh_engine_counters(server.server_address[1], wait_s=0.3)[:2] == (13.0, 26.0)
        assert time.time() - t0 >= 0.3  # never moved: waited it out
    finally:
        server.shutdown()
        server.server_close()
    assert fresh_engine_counters(server.server_address[1]) is None  # no daemon: nothing


def test_gpu_utilization_is_read_per_gpu_and_averaged_over_the_window(tmp_path, monkeypatch) -> None:
    """nvidia-smi's utilization query (this box has none: a stand-in answers it in nvidia-smi's csv format),
    per GPU and averaged over the window's samples; without nvidia-smi, nothing (the row gets no key)."""
    from bench.bench_live import gpu_util, mean_util

    fake = tmp_path / "nvidia-smi"
    lines = "0, 97, 41, 63\\n1, 5, 1, 0\\n"  # csv,noheader,nounits: index, then the three in %
    fake.write_text(f'#!/bin/sh\ncase "$*" in *utilization.decoder*) printf "{lines}";; esac\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    first = gpu_util()
    assert first == {0: (97.0, 41.0, 63.0), 1: (5.0, 1.0, 0.0)}
    later = {0: (89.0, 39.0, 61.0), 1: (5.0, 1.0, 0.0)}
    assert mean_util([first, later]) == {
        "0": {"gpu": 93.0, "memory": 40.0, "decoder": 62.0},
        "1": {"gpu": 5.0, "memory": 1.0, "decoder": 0.0},
    }
    fake.unlink()
    assert gpu_util() == {}


def test_engine_keys_land_in_the_engine_section(tmp_path) -> None:
    from bench.bench_live import config_text
    from streamd.config import load_config

    text = config_text(
        CLIP, 2, tmp_path / "o.jsonl", batch=4, workers="1",
        engine_keys=("verify: false", "max_batch=32", "batch_step:8"), lanes=2,
        pipeline_keys=("ring_slots: 6", "batch_timeout_ms:5", "spare_worker=false"), compile=False,
    )  # fmt: skip
    (tmp_path / "c.yaml").write_text(text)
    config = load_config(tmp_path / "c.yaml")
    assert config.engine.verify is False and config.engine.lanes == 2
    assert config.engine.max_batch == 32 and text.count("max_batch") == 1  # a key given replaces bench_live's
    assert config.engine.compile is False and config.engine.batch_step == 8  # key=value: ROWS split on spaces
    assert config.pipeline.spare_worker is False
    assert config.pipeline.ring_slots == 6 and config.pipeline.batch_timeout_ms == 5
    default = config_text(CLIP, 2, tmp_path / "o.jsonl", batch=4, workers="1")
    (tmp_path / "d.yaml").write_text(default)
    plain = load_config(tmp_path / "d.yaml")
    assert plain.engine.verify is not False and plain.engine.max_batch == 64
    assert plain.engine.compile is True and "compile: true" in default  # the daemon's default, written out


def test_compile_times_come_from_the_engines_log_lines() -> None:
    """The lines TorchEngine._compile logs (streamd/engines/torch.py), as a worker's log carries them."""
    from bench.bench_live import compile_times

    log = [
        "2026-12-02 12:11:22,652 INFO worker4 streamd.engines.torch: torch engine: compiled in 88.2 s "
        "(batch sizes [1, 2])\n",
        "2026-12-02 12:11:23,045 INFO worker0 streamd.engines.torch: torch engine: compiled in 88.9 s "
        "(batch sizes [1, 2])\n",
        "2026-12-02 12:35:10,000 WARNING worker1 streamd.engines.torch: torch engine: engine.compile failed "
        "for this model after 131.5 s (InternalTorchDynamoError: …); it runs uncompiled\n",
        "2026-12-02 12:35:11,000 INFO streamd.supervisor: streamd: ready: engine torch-cuda-fp16\n",
    ]
    skipped = (
        "2026-12-06 23:40:00,000 WARNING worker2 streamd.engines.torch: torch engine: "
        "engine.compile skipped: no C compiler (gcc/clang): …; it runs uncompiled\n"
    )
    assert compile_times([*log, skipped]) == {"compiled": [88.2, 88.9], "failed": [131.5], "skipped": [0.0]}
    assert compile_times(log[-1:]) == {}
