"""``engine.shared: true``: one engine process that every worker feeds (streamd.shared_engine), run the way an
operator runs it (``streamd run``), against the same config with an engine per worker.

- Same frames, same detections: every (stream, frame) line of both runs, boxes within 0.5 px and scores within
  1e-3 (the CPU twin: ONNX Runtime, shared memory; on a GPU, the torch engine and CUDA IPC, within fp16's
  batch-to-batch noise).
- The engine process really merges: with two workers it ran fewer, fuller batches than they sent.
- The engine process killed: the supervisor restarts it, the workers restart onto it, the streams go on with
  one numbering."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from streamd.gpu.cuda import gpu_available
from streamd.shared_engine.server import fullest_prefix, pack
from streamd.types import Detections
from tests.conftest import CLIP, MODEL, run_streamd, start_streamd, with_sitecustomize

MODEL_KEYS = (
    "  input_size: [416, 416]\n  channel_order: bgr\n  mean: [103.53, 116.28, 123.675]\n"
    "  std: [57.375, 57.12, 58.395]\n  layout: yolov8\n  class_names: coco\n  score_threshold: 0.35\n"
)


def _config(
    path: Path, clip: Path, out: Path, *, shared: bool, engine: str, loop: bool = False, metrics_port: int = 0
) -> Path:
    streams = "".join(
        f"  - id: {sid}\n    url: {clip}\n    loop: {str(loop).lower()}\n" for sid in ("a", "b", "c")
    )
    metrics = f"metrics:\n  enabled: true\n  port: {metrics_port}\n" if metrics_port else ""
    path.write_text(
        f"streams:\n{streams}model:\n  path: {MODEL}\n{MODEL_KEYS}"
        f"engine:\n  type: {engine}\n  shared: {str(shared).lower()}\n  max_batch: 8\n  compile: false\n"
        "pipeline:\n  workers: 2\n  spare_worker: false\n  batch_size: 4\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n{metrics}"
    )
    return path


def _engine_counters(port: int) -> tuple[float, float]:
    """(batches, rows) of the engine process on device 0, from /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = dict(re.findall(r'^(streamd_engine_(?:batches|rows)_total)\{device="0"\} (\S+)$', text, re.M))
    get = lambda name: float(found.get(f"streamd_engine_{name}_total", -1))  # noqa: E731
    return get("batches"), get("rows")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(out: Path) -> list[dict]:
    text = out.read_text() if out.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _by_frame(lines: list[dict]) -> dict[tuple[str, int], list[dict]]:
    return {(r["stream"], r["frame"]): r["detections"] for r in lines}


def _same_detections(a: list[dict], b: list[dict], px: float, score: float) -> bool:
    if len(a) != len(b):
        return False
    key = lambda d: (d["class_id"], -d["score"], d["box"])  # noqa: E731
    return all(
        x["class_id"] == y["class_id"]
        and abs(x["score"] - y["score"]) <= score
        and max(abs(p - q) for p, q in zip(x["box"], y["box"], strict=True)) <= px
        for x, y in zip(sorted(a, key=key), sorted(b, key=key), strict=True)
    )


def _compare(tmp_path: Path, clip: Path, engine: str, px: float, score: float, need: float) -> str:
    runs = {}
    for shared in (False, True):
        out = tmp_path / f"shared-{shared}.jsonl"
        cfg = _config(tmp_path / f"shared-{shared}.yaml", clip, out, shared=shared, engine=engine)
        done = run_streamd("run", str(cfg), "--no-status", timeout=420)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[shared], stderr = _by_frame(_lines(out)), done.stderr
    assert runs[True].keys() == runs[False].keys() and len(runs[True]) > 0  # every line, once
    same = sum(_same_detections(runs[True][k], runs[False][k], px, score) for k in runs[True])
    assert same >= need * len(runs[True]), f"{same} of {len(runs[True])} frames agree"
    return stderr


def test_a_shared_engine_gives_every_line_and_the_same_detections(tmp_path, short_clip):
    stderr = _compare(tmp_path, short_clip, "onnxruntime", 0.5, 1e-3, 1.0)
    assert "serving batches of up to 8 rows" in stderr
    m = re.search(r"engine: stopping after (\d+) batches \((\d+) rows\)", stderr)
    assert m, stderr[-3000:]
    batches, rows = int(m[1]), int(m[2])
    # 3 streams in 2 workers of batch 4: merged batches hold more rows than one worker's batch can
    assert rows / batches > 4, (batches, rows)


@pytest.mark.skipif(not gpu_available()[0], reason="no usable CUDA GPU")
def test_a_shared_engine_on_the_gpu_matches_an_engine_per_worker(tmp_path, assets):
    # fp16 in CUDA graphs of another batch size: a few boxes move by a pixel, a score by a hundredth. The
    # whole sample clip (the GPU box has no PyAV to cut the short one).
    _compare(tmp_path, CLIP, "torch", 1.5, 0.02, 0.97)


def test_a_killed_engine_process_comes_back_and_the_streams_go_on(tmp_path, short_clip):
    """Also /metrics: the engine's batches and rows count up across the restart (never back), merged batches
    (rows per batch) above one worker's batch of 4."""
    out = tmp_path / "out.jsonl"
    port = _free_port()
    cfg = _config(
        tmp_path / "c.yaml", short_clip, out, shared=True, engine="onnxruntime", loop=True, metrics_port=port
    )
    proc = start_streamd(cfg)
    log: list[str] = []
    deadline = time.monotonic() + 240
    pid = None
    while proc.poll() is None and time.monotonic() < deadline:  # the engine's pid, from the supervisor's line
        line = proc.stderr.readline()  # type: ignore[union-attr]
        log.append(line)
        if m := re.search(r"engine process ready on device 0 \(pid (\d+)\)", line):
            pid = int(m[1])
            break
    assert pid is not None, "".join(log)[-3000:]
    while len(_lines(out)) < 60 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.5)  # the engine's next beat (once a second) carries those batches
    batches0, rows0 = _engine_counters(port)
    os.kill(pid, signal.SIGKILL)
    before = len(_lines(out))
    while len(_lines(out)) < before + 120 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    time.sleep(1.5)
    batches1, rows1 = _engine_counters(port)
    written = len(_lines(out))
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)[1], None
    stderr = "".join(log) + rest
    assert "engine process on device 0 died (killed by signal 9)" in stderr, stderr[-3000:]
    assert "engine process back on device 0" in stderr, stderr[-3000:]
    print(f"engine: {batches0:.0f} batches, {rows0:.0f} rows before the kill;",
          f"{batches1:.0f}, {rows1:.0f} after; {written} lines")  # fmt: skip
    assert 0 < batches0 < rows0 and rows0 >= 60  # every line written went through the engine
    # counted on across the restart (the carry itself: the test below); the beats lag by up to a second at
    # each end, so the rows trail the lines written by what the engine did in those seconds
    assert batches1 > batches0 and rows1 > rows0 and rows1 >= 0.5 * written
    assert rows1 / batches1 > 4  # merged: fuller batches than one worker's batch of 4
    lines = _lines(out)
    assert len(lines) >= before + 120, stderr[-3000:]  # the streams went on after the kill
    for sid in ("a", "b", "c"):  # one numbering per stream across the restarts: none twice, none skipped
        frames = [r["frame"] for r in lines if r["stream"] == sid]
        assert frames == list(range(len(frames))), sid
    assert proc.returncode == 0, stderr[-3000:]


def test_the_engine_counters_carry_over_a_restart(tmp_path, short_clip):
    """The supervisor's view of an engine process (its beats): batches and rows since start, a restarted
    process's counting from 0 added to what its predecessors ran, so /metrics' counters never go back."""
    from streamd.config import load_config
    from streamd.protocol import EngineBeat, Ready
    from streamd.supervisor.engine_hosts import EngineHosts

    class Conn:  # the engine process's end of the pipe, as the reader thread sees it
        def __init__(self, messages: list) -> None:
            self.messages = messages

        def recv(self) -> object:
            if not self.messages:
                raise EOFError
            return self.messages.pop(0)

    cfg = _config(tmp_path / "c.yaml", short_clip, tmp_path / "o.jsonl", shared=True, engine="onnxruntime")
    hosts = EngineHosts(load_config(cfg), ctx=None, devices=[0])
    host = hosts.hosts[0]
    ready = Ready(1, "onnxruntime-cpu", False, "cpu")
    hosts._read(host, Conn([ready, EngineBeat(5, 2, 30), EngineBeat(10, 0, 70)]))  # type: ignore[arg-type]
    assert hosts.stats() == {0: {"batches": 10, "rows": 70, "waiting": 0}}
    hosts._read(host, Conn([ready]))  # the process died and its successor is ready: counting from 0
    assert hosts.stats()[0]["batches"] == 10 and hosts.stats()[0]["rows"] == 70
    hosts._read(host, Conn([EngineBeat(3, 1, 20)]))  # type: ignore[arg-type]
    assert hosts.stats() == {0: {"batches": 13, "rows": 90, "waiting": 1}}


def test_the_engine_runs_the_queue_prefix_that_fills_its_batch_size_best():
    pow2 = [1, 2, 4, 8, 16, 32, 64]
    assert fullest_prefix([8] * 5, pow2) == 4  # 32 rows run full; 40 would run as 64
    assert fullest_prefix([8] * 8, pow2) == 8  # 64: all of them
    assert fullest_prefix([8, 8, 8], pow2) == 2  # 16 full beats 24 as 32
    assert fullest_prefix([5, 3], pow2) == 2  # 8 full
    assert fullest_prefix([3], pow2) == 1  # the oldest always goes
    assert fullest_prefix([16, 16, 16, 16], [1, 2, 4, 8, 16, 32, 48, 64]) == 4  # other sizes: 64 full


def test_batch_step_lets_a_merged_batch_run_as_it_is():
    """engine.batch_step: the sizes the engine runs (``batch_buckets``) are the powers of two as before, plus
    every multiple of the step; the queue of seven worker batches of 8 then runs whole (56 rows as 56), where
    the powers alone cut it to 32."""
    from streamd.stages.cuda import batch_buckets

    pow2 = batch_buckets(64)
    assert pow2 == [2**k for k in range(7)]  # the default: what the engine ran before the key
    stepped = batch_buckets(64, step=8)
    assert set(pow2) <= set(stepped) and {8 * k for k in range(1, 9)} <= set(stepped)
    assert stepped == sorted(set(stepped)) and max(stepped) == 64 and len(stepped) == 11
    assert fullest_prefix([8] * 7, pow2) == 4 and fullest_prefix([8] * 7, stepped) == 7
    assert max(batch_buckets(48, step=8)) == 48 and 40 in batch_buckets(48, step=8)
    # a model whose batch is fixed at 4 runs whole multiples of 4: a step of 6 becomes 8
    fixed = batch_buckets(64, unit=4, step=6)
    assert all(b % 4 == 0 for b in fixed) and 24 in fixed and 12 not in fixed


def test_results_travel_as_padded_arrays():
    dets = [
        Detections(np.array([[1, 2, 3, 4]], np.float32), np.array([0.5], np.float32), np.array([7])),
        Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32)),
    ]
    counts, det = pack(dets)
    assert counts.tolist() == [1, 0] and det.shape == (2, 1, 6)
    assert det[0, 0].tolist() == [1, 2, 3, 4, 0.5, 7]


def test_an_engine_process_that_cannot_start_ends_the_run_with_its_exit_code(tmp_path, short_clip):
    # TensorRT is not installed here: the engine process's build fails, as a worker's would (exit 69, one
    # line naming what to install), and the workers waiting for its socket do not hold the run up
    out = tmp_path / "out.jsonl"
    cfg = _config(tmp_path / "c.yaml", short_clip, out, shared=True, engine="tensorrt")
    t0 = time.monotonic()
    done = run_streamd("run", str(cfg), "--no-status", timeout=120)
    assert done.returncode == 69, done.stderr[-3000:]
    assert "the tensorrt Python package is not installed" in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - t0 < 60
    assert not _lines(out)


WEDGE = """
import os
marker = os.environ.get("STREAMD_TEST_ENGINE_WEDGES_ONCE")
if marker:
    import time
    import streamd.shared_engine.server as _s

    _orig, _calls = _s.EngineServer._gather, [0]

    def _gather(self, slot, parts):
        _calls[0] += 1
        if _calls[0] == 20 and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(3600)  # wedged: alive, beating, no batch
        return _orig(self, slot, parts)

    _s.EngineServer._gather = _gather
"""


def test_a_wedged_engine_process_is_killed_and_the_streams_go_on(tmp_path, short_clip):
    out, marker = tmp_path / "out.jsonl", tmp_path / "wedged-once"
    cfg = _config(tmp_path / "c.yaml", short_clip, out, shared=True, engine="onnxruntime", loop=True)
    env = with_sitecustomize(tmp_path / "hook", WEDGE, STREAMD_TEST_ENGINE_WEDGES_ONCE=str(marker))
    proc = start_streamd(cfg, env=env)
    deadline = time.monotonic() + 240
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    before = len(_lines(out))
    while len(_lines(out)) < before + 120 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert marker.exists(), stderr[-3000:]  # it did wedge
    assert "(wedged); killed" in stderr and "engine process back on device 0" in stderr, stderr[-3000:]
    lines = _lines(out)
    assert len(lines) >= before + 120, stderr[-3000:]  # the streams went on after it
    for sid in ("a", "b", "c"):
        frames = [r["frame"] for r in lines if r["stream"] == sid]
        assert frames == list(range(len(frames))), sid
    assert proc.returncode == 0, stderr[-3000:]
