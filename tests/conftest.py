"""Shared fixtures: repo paths, helpers to run the streamd CLI as a real subprocess, and a running daemon with
a metrics port (``metrics_daemon``)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "nanodet-coco.onnx"
CLIP = ROOT / "samples" / "vtest.mp4"
CLIP_HEVC = ROOT / "samples" / "vtest-hevc.mp4"
SCHEMA = ROOT / "streamd" / "data" / "result.schema.json"
SHORT_FRAMES = 100  # pictures of the ``short_clip`` fixture
GOP_FRAMES = 250  # pictures of the ``*_gop_clip`` fixtures: samples/vtest.mp4 has a keyframe every 25 s


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder ``build(folder)`` filled once per test run, shared by pytest-xdist's workers (each would
    otherwise build its own copy of a session fixture: the demo run and the clip encodes cost a CPU minute
    each on the 2-core CI machine). The first worker builds under a lock; the others wait and reuse it. A
    build that raises leaves nothing marked done: the next worker to ask builds again."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, shared by its workers (never an earlier run's)
    folder = root / f"shared-{name}"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".done").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            (folder / ".done").touch()
    return folder


@pytest.fixture(scope="session")
def short_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first SHORT_FRAMES pictures of samples/vtest.mp4, re-encoded at its 10 fps (H.264 with B-frames,
    two GOPs): for tests of completeness and order that need no particular frame; a run of the whole clip
    costs about a CPU minute of inference (52 ms a picture) on the CI machine."""
    return build_once(tmp_path_factory, "short-clip", _encode_short_clip) / "vtest-short.mp4"


def _encode_short_clip(folder: Path) -> None:
    import av

    path = folder / "vtest-short.mp4"
    with av.open(str(CLIP)) as src, av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 768, 576, "yuv420p"
        stream.options = {"bf": "2", "g": "50", "preset": "veryfast", "crf": "23"}
        for k, frame in enumerate(src.decode(video=0)):
            if k == SHORT_FRAMES:
                break
            picture = frame.reformat(format="yuv420p")
            picture.pts, picture.time_base = k, Fraction(1, 10)
            picture.pict_type = av.video.frame.PictureType.NONE  # x264 chooses (else it copies the source's)
            out.mux(stream.encode(picture))
        out.mux(stream.encode())
    with av.open(str(path)) as check:
        assert sum(1 for _ in check.decode(video=0)) == SHORT_FRAMES, path


@pytest.fixture(scope="session")
def first_gop_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """samples/vtest.mp4's first GOP_FRAMES pictures (its first 25 s), its packets copied up to its second
    keyframe (no re-encode: the same pictures, so the same detections, as the whole clip's): for tests of a
    whole daemon run whose point is not the clip's length; a third of the whole clip's CPU inference."""
    return build_once(tmp_path_factory, "gop-0", lambda folder: _copy_gop(folder, 0)) / "vtest-gop0.mp4"


@pytest.fixture(scope="session")
def third_gop_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """samples/vtest.mp4's pictures 500-749 (50-75 s; people walk out at the picture's bottom edge), copied
    the same way, their timestamps moved to start where the clip's do."""
    return build_once(tmp_path_factory, "gop-2", lambda folder: _copy_gop(folder, 2)) / "vtest-gop2.mp4"


def _copy_gop(folder: Path, gop: int) -> None:
    import av

    path = folder / f"vtest-gop{gop}.mp4"
    with av.open(str(CLIP)) as src, av.open(str(path), "w") as out:
        stream = out.add_stream_from_template(src.streams.video[0])
        keyframes, first_pts, shift = -1, None, 0
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is None:  # the demuxer's flush packet
                continue
            if packet.is_keyframe:
                keyframes += 1
                first_pts = packet.pts if first_pts is None else first_pts
                if keyframes == gop:
                    shift = packet.pts - first_pts
            if keyframes == gop + 1:
                break
            if keyframes == gop:
                packet.pts, packet.dts = packet.pts - shift, packet.dts - shift
                packet.stream = stream
                out.mux(packet)
    with av.open(str(path)) as check:
        assert sum(1 for _ in check.decode(video=0)) == GOP_FRAMES, path


def run_streamd(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``python -m streamd ARGS``; ``env``: variables set on top of this process's (e.g. PYTHONPATH)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **kw.pop("env", {})}
    if "input" not in kw:
        kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(
        [sys.executable, "-m", "streamd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=kw.pop("cwd", ROOT),
        env=env,
        **kw,
    )


def start_streamd(config: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``streamd run CONFIG`` as a live subprocess (no status line, stdout discarded, stderr piped); ``env``:
    variables set on top of this process's."""
    return subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", str(config), "--no-status", *extra],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def with_sitecustomize(folder: Path, code: str, **variables: str) -> dict[str, str]:
    """Environment for ``start_streamd``: a ``sitecustomize`` with ``code`` that every streamd process
    (supervisor, workers, engine process) imports at start, to inject a real fault; plus ``variables``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]), **variables}


@pytest.fixture(scope="session")
def assets() -> None:
    missing = [p for p in (MODEL, CLIP, CLIP_HEVC) if not p.exists()]
    if missing:
        pytest.fail(f"bundled assets missing: {missing} (they are committed; see models/README.md)")


@pytest.fixture(scope="session")
def demo_run(assets, tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """`streamd run` with no arguments: the bundled demo (configs/demo.yaml), JSON lines on stdout (one run
    shared by the workers, ``build_once``)."""

    def run(folder: Path) -> None:
        proc = run_streamd("run", timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (folder / "stdout").write_text(proc.stdout)
        (folder / "stderr").write_text(proc.stderr)

    folder = build_once(tmp_path_factory, "demo-run", run)
    stdout, stderr = (folder / "stdout").read_text(), (folder / "stderr").read_text()
    return subprocess.CompletedProcess(["streamd", "run"], 0, stdout, stderr)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    """(status, body) of a GET; an HTTP error status is an answer too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class RunningDaemon:
    """A supervisor (what ``streamd run`` runs) in a thread of the test process, serving its metrics port;
    its worker processes are real. ``config`` is its config file, ``port`` the metrics port."""

    def __init__(self, config: Path, port: int) -> None:
        from streamd.config import load_config
        from streamd.supervisor import Supervisor

        self.config, self.port = config, port
        self.supervisor = Supervisor(load_config(config), status_line=False)
        self.codes: list[int] = []  # the exit status, once run() returned
        self._thread = threading.Thread(target=lambda: self.codes.append(self.supervisor.run()), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, bytes]:
        return http_get(self.url + path)

    def metrics(self) -> dict:
        """``/metrics`` parsed with prometheus-client's own parser: {family name: family}."""
        from prometheus_client.parser import text_string_to_metric_families

        return {f.name: f for f in text_string_to_metric_families(self.get("/metrics")[1].decode())}

    def healthz(self) -> tuple[int, dict]:
        code, body = self.get("/healthz")
        return code, json.loads(body)

    def wait_for(self, predicate: Callable[[], Any], what: str, timeout: float = 180) -> Any:
        """``predicate()``'s first true value (an OSError counts as not yet: the port may not listen yet)."""
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                last = predicate()
            except OSError as exc:
                last = exc
            if last and not isinstance(last, Exception):
                return last
            assert self._thread.is_alive(), f"the daemon ended with {self.codes}"
            time.sleep(0.2)
        raise AssertionError(f"timed out ({timeout} s) waiting for {what}; last: {last}")

    def stop(self, timeout: float = 90) -> int | None:
        """Stop (what SIGTERM does: the workers drain) and return the exit status."""
        self.supervisor.stop.set()
        self._thread.join(timeout)
        return self.codes[0] if self.codes else None


@pytest.fixture
def metrics_daemon(tmp_path, assets) -> Iterator[Callable[[str], RunningDaemon]]:
    """Starts a running daemon with a metrics port: ``metrics_daemon(config_yaml)`` writes the config (the
    ``metrics:`` section with a free port is appended) and returns the ``RunningDaemon``; every daemon
    started is stopped at the end."""
    started: list[RunningDaemon] = []

    def start(body: str) -> RunningDaemon:
        port = free_port()
        path = tmp_path / f"daemon{len(started)}.yaml"
        path.write_text(body + metrics_section(port))
        started.append(RunningDaemon(path, port))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


def metrics_section(port: int) -> str:
    return f"metrics:\n  enabled: true\n  port: {port}\n"


# Tests that measure live-paced streams for gaps, pauses or timing (a frame dropped because another test
# shares the cores would read as a failure): they run one at a time, after the rest (README: Run the tests).
SERIAL_FILES = {
    "tests/test_reload_untouched.py",
    "tests/test_reload_single_stream.py",
    "tests/test_reload.py",
    "tests/test_supervisor.py",
    "tests/test_wedged_worker.py",
    "tests/test_bench_live.py",
    "tests/api/test_control_api.py",
    "tests/cluster/test_failover.py",
    "tests/cluster/test_changes.py",
    "tests/cluster/test_etcd_outage.py",
    "tests/sources/test_live.py",
    "tests/sources/test_live_daemon.py",
    "tests/analytics/test_lines_reload.py",
}


# Tests of those files that measure no timing (bookkeeping, a whole file run unpaced, open counts): they run
# with the rest, so the serial part waits only on what needs the cores to itself.
NOT_SERIAL = {
    "tests/test_supervisor.py::test_partition_round_robin_over_workers_and_devices",
    "tests/test_supervisor.py::test_one_spare_per_gpu_and_a_dead_worker_goes_to_its_own",
    "tests/test_supervisor.py::test_no_spare_with_one_worker_or_when_turned_off",
    "tests/test_supervisor.py::test_streams_over_two_workers_complete_and_ordered",
    "tests/test_supervisor.py::test_bad_model_fails_once_with_one_line_and_exit_78",
    "tests/test_supervisor.py::test_a_stream_that_starts_mid_window_is_not_behind",
    "tests/test_supervisor.py::test_the_overload_warning_needs_two_ticks_behind",
    "tests/test_supervisor.py::test_a_start_up_catching_up_is_no_overload_but_a_lasting_one_is",
    "tests/test_bench_live.py::test_bench_live_runs_on_the_cpu",  # gaps <= counted drops: holds under load
    "tests/test_bench_live.py::test_engine_keys_land_in_the_engine_section",
    "tests/test_bench_live.py::test_engine_counters_are_read_as_a_beat_brings_them",
    "tests/test_bench_live.py::test_a_shared_engine_row_counts_its_merged_batches",
    "tests/test_bench_live.py::test_gpu_utilization_is_read_per_gpu_and_averaged_over_the_window",
    "tests/test_bench_live.py::test_largest_clean_needs_every_stream_carried_without_drops_in_time",
    "tests/api/test_control_api.py::test_a_token_is_required_off_loopback_and_a_bad_state_file_stops_the_start",
    "tests/sources/test_live.py::test_reconnect_attempts_reopens_n_times_then_gives_up",
    "tests/sources/test_live.py::test_reconnect_attempts_one_is_one_reopen",
    "tests/sources/test_live.py::test_reconnect_attempts_zero_retries_forever",
}

# The files that take longest (measured on the 2-core CI machine, -n 4), longest first: pytest-xdist hands
# files out in collection order (README's command passes --no-loadscope-reorder), so these start first and
# no worker is left running a long file alone at the end. A file missing here just runs after them.
LONG_FILES = (
    "tests/test_shared_engine.py",
    "tests/test_zoo_families.py",
    "tests/service/test_service.py",
    "tests/test_e2e.py",
    "tests/analytics/test_classes_reload.py",
    "tests/sinks/test_mqtt_sink.py",
    "tests/test_bench_tools.py",
    "tests/analytics/test_lines_clip.py",
    "tests/sinks/test_ha_discovery.py",
    "tests/sinks/test_file_sink.py",
    "tests/clips/test_clip_rtsp.py",
    "tests/sinks/test_redis_sink.py",
    "tests/analytics/test_end_of_stream.py",
    "tests/test_packaging.py",
    "tests/engines/test_torch_compile_dynamo.py",
    "tests/test_stage_failure_restart.py",
    "tests/decode/test_cpu_decoder.py",
    "tests/test_reference_detections.py",
    "tests/service/test_seccomp_run.py",
    "tests/clips/test_retention.py",
    "tests/test_supervisor.py",
    "tests/test_health.py",
    "tests/test_config.py",
    "tests/clips/test_clip_files.py",
    "tests/test_daemon.py",
    "tests/sources/test_broken_input.py",
    "tests/test_model_check.py",
    "tests/sources/test_rtsp.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent.parent
    rank = {f: k for k, f in enumerate(LONG_FILES)}
    files = {id(item): Path(str(item.fspath)).resolve().relative_to(root).as_posix() for item in items}
    for item in items:
        name = files[id(item)]
        test = f"{name}::{item.nodeid.split('::', 1)[-1].split('[')[0]}"
        if name in SERIAL_FILES and test not in NOT_SERIAL:
            item.add_marker(pytest.mark.serial)
    # a stable sort: the other files, and the tests within each file, keep their order
    items.sort(key=lambda item: rank.get(files[id(item)], len(LONG_FILES)))
