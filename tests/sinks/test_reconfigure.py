"""SinkSet.reconfigure (reload): unchanged sinks keep running, changed ones are swapped without a gap or a
reordering, an output that cannot be opened leaves the running set alone."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest

from streamd.config.sinks import JsonlSinkConfig
from streamd.exitcodes import StartupError
from streamd.sinks import SinkSet
from tests.sinks._helpers import fake_lines


def frames(path) -> list[int]:
    return [json.loads(line)["frame"] for line in path.read_text().splitlines()]


def test_reconfigure_keeps_unchanged_sinks_and_swaps_changed_ones_in_order(tmp_path) -> None:
    a = JsonlSinkConfig(path=tmp_path / "a.jsonl")
    b = JsonlSinkConfig(path=tmp_path / "b.jsonl")
    b2 = dataclasses.replace(b, flush_every=50)  # same file, other options
    c = JsonlSinkConfig(path=tmp_path / "c.jsonl")
    sinks = SinkSet.from_config([a, b])
    sinks.start()
    kept = sinks.sinks[0]
    lines = fake_lines(3000)

    def feed() -> None:
        for i, line in enumerate(lines):
            sinks.submit(line, "demo")
            if i % 100 == 0:
                time.sleep(0.002)

    feeder = threading.Thread(target=feed)
    feeder.start()
    time.sleep(0.02)
    started, closed = sinks.reconfigure([a, b2, c])
    feeder.join()
    sinks.close()
    assert (started, closed) == (2, 1) and sinks.sinks[0] is kept
    assert frames(tmp_path / "a.jsonl") == list(range(3000)), "the untouched sink saw no gap"
    assert frames(tmp_path / "b.jsonl") == list(range(3000)), "the swapped sink: no gap, no reordering"
    got = frames(tmp_path / "c.jsonl")
    assert got == list(range(3000 - len(got), 3000)) and got, "the new sink from the swap on"
    assert sinks.lost == 0
    print(f"c started at frame {got[0]}")


def test_reconfigure_with_an_unwritable_sink_changes_nothing(tmp_path) -> None:
    a = JsonlSinkConfig(path=tmp_path / "a.jsonl")
    sinks = SinkSet.from_config([a])
    sinks.start()
    before = list(sinks.sinks)
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(StartupError):
        sinks.reconfigure([a, JsonlSinkConfig(path=tmp_path / "dir.jsonl")])
    assert sinks.sinks == before
    sinks.submit(fake_lines(1)[0], "demo")
    sinks.close()
    assert frames(tmp_path / "a.jsonl") == [0]


def test_a_reload_that_adds_an_unreachable_mqtt_sink_says_so(tmp_path, caplog) -> None:
    """Not refused (streamd starts with such a sink too, and the broker may come later), but logged, listed in
    ``reload_warnings`` and counted as broken (``streamd_sink_broken``) until it connects."""
    from streamd.config.sinks import MqttSinkConfig
    from tests.sinks._helpers import free_port

    a = JsonlSinkConfig(path=tmp_path / "a.jsonl")
    sinks = SinkSet.from_config([a])
    sinks.start()
    caplog.set_level("INFO")
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    started, closed = sinks.reconfigure([a, MqttSinkConfig(host="127.0.0.1", port=port)])
    took = time.monotonic() - t0
    try:
        print(f"reconfigure took {took:.2f} s; warnings {sinks.reload_warnings}")
        assert (started, closed) == (1, 0)
        assert len(sinks.reload_warnings) == 1 and f"mqtt:127.0.0.1:{port}" in sinks.reload_warnings[0]
        assert "cannot reach the broker" in sinks.reload_warnings[0]
        assert "reload: sink mqtt:127.0.0.1" in caplog.text
        assert sinks.stats()[f"mqtt:127.0.0.1:{port}"]["broken"]
        assert took < SinkSet.USABLE_WAIT_S + 1
    finally:
        sinks.close(timeout=2)
