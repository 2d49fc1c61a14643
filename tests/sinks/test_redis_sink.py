"""Redis Streams sink against a real redis-server: every line arrives (at least once, in order); across a 30 s
outage of the server under a running ``streamd run``, lines sent = lines received (duplicates counted, none
lost); the spool's byte cap drops the oldest lines and counts them; the pipeline never waits on Redis."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamd.config import ConfigError, parse_config
from streamd.config.sinks import RedisSinkConfig
from streamd.exitcodes import EX_CANTCREAT, StartupError
from streamd.sinks import SinkSet
from streamd.sinks.redis import RedisSink
from tests.conftest import CLIP, MODEL, ROOT, http_get, metrics_section, start_streamd
from tests.sinks._helpers import config_with_sinks, fake_lines, free_port
from tests.sinks._redis import RedisServer, keys_of, running_redis

if not os.environ.get("CI"):  # CI installs the dev extra: there a missing client fails at the import below
    pytest.importorskip("redis", reason="the redis client is in the dev extra: pip install -e '.[dev]'")
import redis  # noqa: F401


@pytest.fixture
def redis_server(tmp_path):
    with running_redis(tmp_path / "redis") as server:
        yield server


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    assert predicate(), f"timed out ({timeout} s) waiting for {what}"


def make_sink(port: int, spool: Path, **kw) -> RedisSink:
    kw.setdefault("retry_max_s", 0.5)
    sink = RedisSink(RedisSinkConfig(host="127.0.0.1", port=port, spool_dir=spool, **kw))
    sink.start()
    return sink


def first_seen(frames: list[int]) -> list[int]:
    seen: set[int] = set()
    return [f for f in frames if not (f in seen or seen.add(f))]


def test_lines_arrive_in_order_with_node_and_trimming(tmp_path, redis_server) -> None:
    sink = make_sink(redis_server.port, tmp_path / "spool", maxlen=500)
    assert sink.wait_usable(5) is None
    a, b = fake_lines(3000, stream="a"), fake_lines(300, stream="b")
    for i, line in enumerate(a):
        sink.submit(line, "a")
        if i < len(b):
            sink.submit(b[i], "b")
    sink.close(10)
    assert sink.written == 3300 and sink.dropped == 0 and sink.lost == 0
    got_b = redis_server.entries("streamd:b")
    assert [e["line"] for e in got_b] == [json.loads(x) for x in b]  # byte for byte, in order
    assert {e["node"] for e in got_b} == {socket.gethostname()}
    with redis_server.client() as c:
        length = c.xlen("streamd:a")
    frames = [e["line"]["frame"] for e in redis_server.entries("streamd:a")]
    print(f"stream a: {length} entries kept of 3000 (MAXLEN ~ 500); newest {frames[-1]}")
    assert 500 <= length <= 700 and frames == list(range(3000 - length, 3000))
    assert not list((tmp_path / "spool").glob("*.spool"))  # nothing was spooled, nothing left behind


@pytest.mark.slow
def test_30_s_outage_under_streamd_run_loses_nothing(tmp_path, redis_server, assets) -> None:
    """A live looping stream through ``streamd run`` into a jsonl file (what was sent) and Redis; the server
    is killed (-9) for 30 s and started again. Every (stream, frame) line of the file is in Redis."""
    out, port = tmp_path / "sent.jsonl", free_port()
    sinks = (
        f"  - type: jsonl\n    path: {out}\n"
        f"  - type: redis\n    host: 127.0.0.1\n    port: {redis_server.port}\n    spool_dir: spool\n"
        "    retry_max_s: 2\n    timeout_s: 2\n"
    )
    cfg = config_with_sinks(tmp_path / "r.yaml", sinks, clip=CLIP, live=True, extra=metrics_section(port))
    proc = start_streamd(cfg)
    sink = f'sink="redis:127.0.0.1:{redis_server.port}"'

    def metric(name: str) -> float | None:
        try:
            text = http_get(f"http://127.0.0.1:{port}/metrics")[1].decode()
        except OSError:
            return None
        found = [ln.split()[-1] for ln in text.splitlines() if ln.startswith(f"{name}{{{sink}")]
        return float(found[0]) if found else None

    try:
        wait_for(lambda: len(redis_server.entries("streamd:cam")) >= 20, 180, "lines before the outage")
        redis_server.kill()
        before = len(out.read_text().splitlines())
        time.sleep(15)
        spooled_mid = metric("streamd_sink_queue_depth")
        broken_mid = metric("streamd_sink_broken")
        time.sleep(15)
        during = len(out.read_text().splitlines()) - before
        redis_server.start()
        wait_for(lambda: metric("streamd_sink_broken") == 0, 30, "the sink to reconnect")
        wait_for(lambda: metric("streamd_sink_queue_depth") == 0, 60, "the spool to drain")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    sent = keys_of([{"line": json.loads(ln)} for ln in out.read_text().splitlines()])
    got = keys_of(redis_server.entries("streamd:cam"))
    duplicates = sum(got.values()) - len(got)
    print(
        f"30 s outage: {sum(sent.values())} lines sent ({during} during the outage), {sum(got.values())} "
        f"received, {len(got)} unique, {duplicates} duplicates, {len(set(sent) - set(got))} lost; "
        f"mid-outage queue depth {spooled_mid}, broken {broken_mid}"
    )
    assert during > 0 and spooled_mid and spooled_mid > 0 and broken_mid == 1
    assert set(got) == set(sent) and all(n == 1 for n in sent.values())
    assert "the server answers again after" in err and "the server cannot take lines (ConnectionError" in err


def test_full_spool_drops_the_oldest_and_counts_them(tmp_path) -> None:
    server = RedisServer(tmp_path)  # not started yet: the server is away from the start
    spool = tmp_path / "spool"
    sink = make_sink(server.port, spool, spool_max_bytes=1 << 20, queue_size=20000)
    lines = fake_lines(12000, stream="a")  # about 2.6 MB: more than twice the cap
    biggest = 0
    for i, line in enumerate(lines):
        sink.submit(line, "a")
        if i % 500 == 0:
            time.sleep(0.02)
            biggest = max(biggest, sum(p.stat().st_size for p in spool.glob("*.spool")))
    wait_for(lambda: sink.queued <= sink.spool.pending + 400, 30, "the writer to spool the queue")
    assert sink.wait_usable(0) is not None and sink.stats()["broken"]
    server.start()
    try:
        wait_for(lambda: sink.queued == 0, 60, "the spool to drain")
        sink.close(10)
        got = keys_of(server.entries("streamd:a"))
    finally:
        server.kill()
    from streamd.supervisor.metrics import render

    dropped = 12000 - len(got)
    text = render({"per_stream": {}, "sink_stats": {sink.name: sink.stats()}})
    print(f"spool cap 1 MiB: {dropped} of 12000 dropped (counted {sink.dropped}), peak spool {biggest} B")
    assert dropped > 0 and sink.dropped == dropped and sink.lost == dropped and sink._dropped_full == 0
    assert set(got) == {("a", f) for f in range(dropped, 12000)}  # the oldest went
    assert biggest <= 1 << 20
    assert f'streamd_sink_dropped_total{{sink="{sink.name}"}} {float(dropped)}' in text
    summary = SinkSet([sink]).summary()  # what the supervisor logs at exit, before it returns exit status 1
    assert summary is not None and f"{sink.name}: {dropped}" in summary


def test_spooled_lines_survive_a_restart_and_go_first(tmp_path, redis_server) -> None:
    spool = tmp_path / "spool"
    redis_server.kill()
    first = make_sink(redis_server.port, spool)
    lines = fake_lines(800, stream="a")
    for line in lines[:500]:
        first.submit(line, "a")
    wait_for(lambda: first.spool.pending == 500, 10, "500 lines in the spool")
    first.close(timeout=0.5)
    assert first.lost == 0 and first.written == 0  # on disk, not lost
    redis_server.start()
    second = make_sink(redis_server.port, spool)
    for line in lines[500:]:
        second.submit(line, "a")
    second.close(10)
    got = [e["line"]["frame"] for e in redis_server.entries("streamd:a")]
    print(f"after a restart: {len(got)} received, {len(got) - len(set(got))} duplicates")
    assert first_seen(got) == list(range(800)) and second.lost == 0


def test_a_silent_server_never_holds_the_pipeline(tmp_path) -> None:
    """A server that accepts and never answers: every call waits its timeout, yet submit never waits and
    no line is dropped, even with a small queue; they wait on disk."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(100)
    sink = make_sink(silent.getsockname()[1], tmp_path / "spool", timeout_s=1, queue_size=200)
    worst = 0.0
    for line in fake_lines(3000, stream="a"):
        t = time.perf_counter()
        sink.submit(line, "a")
        worst = max(worst, time.perf_counter() - t)
        time.sleep(0.0005)
    wait_for(lambda: sink.spool.pending >= 3000 - 4 * 100, 10, "the lines on disk")
    assert sink.stats()["broken"] and "Timeout" in str(sink.stats()["broken"])
    sink.close(timeout=0.5)
    silent.close()
    print(f"silent server: slowest submit {worst * 1e3:.2f} ms, {sink.spool.pending} lines spooled")
    assert worst < 0.1 and sink.dropped == 0 and sink.spool.pending == 3000


def test_refused_lines_are_counted_and_a_password_is_used(tmp_path) -> None:
    server = RedisServer(tmp_path, "--requirepass", "s3cret")
    server.start()
    try:
        os.environ["STREAMD_TEST_REDIS_PW"] = "s3cret"
        with server.client("s3cret") as c:
            c.set("streamd:bad", "not a stream")  # XADD to it answers WRONGTYPE: resending cannot help
        sink = make_sink(server.port, tmp_path / "spool", password_env="STREAMD_TEST_REDIS_PW")
        for line in fake_lines(50, stream="good"):
            sink.submit(line, "good")
        for line in fake_lines(7, stream="bad"):
            sink.submit(line, "bad")
        sink.close(10)
        no_password = make_sink(server.port, tmp_path / "spool2")
        no_password.submit(fake_lines(1)[0], "good")
        wait_for(lambda: no_password.stats()["broken"], 10, "the sink to count as broken")
        why = str(no_password.stats()["broken"])
        assert no_password.stats()["queued"] == 1
        no_password.close(timeout=0.2)
        assert no_password.spool.pending == 1  # kept on disk for the next start
        with server.client("s3cret") as c:
            good = c.xlen("streamd:good")
    finally:
        os.environ.pop("STREAMD_TEST_REDIS_PW", None)
        server.kill()
    assert good == 50 and sink.written == 50 and sink.dropped == 7 and sink.lost == 7
    assert "auth" in why.lower() and no_password.lost == 0  # not logged in: kept, not dropped


def test_a_full_server_is_waited_for_not_dropped(tmp_path) -> None:
    """maxmemory reached (OOM error replies): the lines wait in the spool and arrive once there is room."""
    server = RedisServer(tmp_path, "--maxmemory", "1mb", "--maxmemory-policy", "noeviction")
    server.start()
    try:
        sink = make_sink(server.port, tmp_path / "spool")
        for line in fake_lines(3000, stream="a"):
            sink.submit(line, "a")
        wait_for(lambda: "OutOfMemory" in str(sink.stats()["broken"]), 20, "the sink to see the server full")
        with server.client() as c:
            c.config_set("maxmemory", 0)
        wait_for(lambda: sink.queued == 0, 30, "the lines to go out")
        sink.close(10)
        got = keys_of(server.entries("streamd:a"))
    finally:
        server.kill()
    print(f"full server: {sum(got.values())} received, {len(got)} unique of 3000, resent {sink.resent}")
    assert set(got) == {("a", f) for f in range(3000)} and sink.dropped == 0 and sink.resent > 0


def test_a_reload_that_changes_the_sink_keeps_its_spool_and_order(tmp_path) -> None:
    """A reload replacing the sink (same spool folder, other options) while the server is away: the new sink
    takes the spool over once the old one closed, and every line arrives in order when the server is back."""
    server = RedisServer(tmp_path)
    spool = tmp_path / "spool"
    old = RedisSinkConfig(host="127.0.0.1", port=server.port, spool_dir=spool, retry_max_s=0.5)
    sinks = SinkSet.from_config([old])
    sinks.start()
    lines = fake_lines(500, stream="a")
    for line in lines[:300]:
        sinks.submit(line, "a")
    new = dataclasses.replace(old, maxlen=1000)
    assert sinks.reconfigure([new], timeout=2) == (1, 1)
    assert len(sinks.reload_warnings) == 1 and "ConnectionError" in sinks.reload_warnings[0]
    for line in lines[300:]:
        sinks.submit(line, "a")
    server.start()
    try:
        (sink,) = sinks.sinks
        wait_for(lambda: sink.queued == 0, 30, "the lines to go out")
        assert sinks.reconfigure([dataclasses.replace(new, maxlen=2000)], timeout=2) == (1, 1)
        assert sinks.reload_warnings == []  # the server answers: the held sink's own ping says so
        sinks.close(5)
        frames = [e["line"]["frame"] for e in server.entries("streamd:a")]
    finally:
        server.kill()
    print(f"reload while away: {len(frames)} received, {len(frames) - len(set(frames))} duplicates")
    assert first_seen(frames) == list(range(500)) and sinks.lost == 0


def test_a_spool_folder_another_process_holds_is_refused_at_start(tmp_path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from streamd.sinks.spool import Spool; "
         "Spool(Path(sys.argv[1]), 1 << 20).open(); print('held', flush=True); sys.stdin.read()",
         str(tmp_path / "spool")],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        sink = RedisSink(RedisSinkConfig(host="127.0.0.1", spool_dir=tmp_path / "spool"))
        with pytest.raises(StartupError) as info:
            sink.start()
        assert info.value.code == EX_CANTCREAT and "in use by another process" in str(info.value)
    finally:
        holder.kill()
        holder.wait()


def config_problems(tmp_path, sinks: list) -> list[str]:
    data = {"streams": [{"id": "a", "url": str(ROOT / "samples/vtest.mp4")}], "model": {"path": str(MODEL)}}
    with pytest.raises(ConfigError) as info:
        parse_config({**data, "sinks": sinks}, tmp_path)
    return info.value.problems


def test_config_checks_name_the_key(tmp_path) -> None:
    good = {"type": "redis", "host": "10.0.0.9", "spool_dir": "spool"}
    data = {"streams": [{"id": "a", "url": str(ROOT / "samples/vtest.mp4")}], "model": {"path": str(MODEL)}}
    (sink,) = parse_config({**data, "sinks": [good]}, tmp_path).sinks
    assert sink == RedisSinkConfig(host="10.0.0.9", spool_dir=tmp_path / "spool")
    found = config_problems(
        tmp_path,
        [{**good, "spool_dir": "no/such/spool", "key": "x:{camera}", "spool_max_bytes": 10}, good, good],
    )
    text = "\n".join(found)
    assert "sinks[0].spool_dir: folder not found" in text and "create it first" in text
    assert "sinks[0].key: unknown placeholder {camera}" in text
    assert "sinks[0].spool_max_bytes: expected an integer between 1048576 and 1099511627776, got 10" in text
    assert "sinks[2].spool_dir: " in text and "already used by sinks[1]" in text
    missing = config_problems(tmp_path, [{"type": "redis", "host": "h"}])
    assert any("sinks[0].spool_dir: required key missing; add spool_dir:" in p for p in missing), missing
