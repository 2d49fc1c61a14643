"""A GPU with no room for another hardware decoder (NVDEC's session creation fails once the GPU holds as many
as it can, bench/RESULTS.md): the stream waits with backoff and opens again, the others never notice."""

from __future__ import annotations

import logging
import time

from streamd.config.streams import StreamConfig
from streamd.ingest import decoder_slot
from streamd.ingest.decode import DecoderFull, wait_closed
from tests.sources.conftest import CLIP

FRAMES = 795  # tests/sources/conftest.py: the bundled clip


class _NoRoom:
    """What an NVDEC decoder does when the GPU holds no more: the first packet (its SPS) fails."""

    name, skipped = "nvdec", 0

    def __init__(self) -> None:
        self.closed = False

    def decode(self, packet):
        raise DecoderFull("NVDEC has no room for another decoder on GPU 0 (cuvidCreateDecoder ... error 2)")

    def flush(self):
        raise AssertionError("a decoder that never started is given up, not flushed")

    def restart(self, info) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def test_a_stream_without_a_decoder_waits_and_the_others_go_on(pipeline, monkeypatch, caplog) -> None:
    real = decoder_slot.create_decoder
    refused: list[_NoRoom] = []

    def create(kind, info, **kw):
        if kw.pop("_stream", None) == "full" and len(refused) < 2:
            refused.append(_NoRoom())
            return refused[-1]
        return real(kind, info, **kw)

    monkeypatch.setattr(decoder_slot, "create_decoder", create)
    pipe = pipeline(capacity=2)
    cfg = StreamConfig(id="full", url=str(CLIP), reconnect_initial_s=0.3, reconnect_max_s=0.6)
    full = pipe.add(cfg, policy="block", decoder_options={"_stream": "full"})
    other = pipe.add(StreamConfig(id="ok", url=str(CLIP)), policy="block")
    caplog.set_level(logging.WARNING, logger="streamd.ingest.stream")
    pipe.start()
    assert pipe.wait_until(lambda: full.stats.state == "no_decoder", 10)
    assert "cuvidCreateDecoder" in full.stats.last_error
    assert full.join(60) and other.join(60)
    for worker, sid in ((full, "full"), (other, "ok")):
        s = worker.stats
        assert s.state == "ended" and s.decoded == FRAMES and s.decode_errors == 0, (sid, s)
        assert pipe.wait_frames(sid, FRAMES, timeout=5) and pipe.seen[sid].indices == list(range(FRAMES))
    assert wait_closed(5) and len(refused) == 2 and all(d.closed for d in refused)  # given up, closed
    waits = [r for r in caplog.records if "no room for another decoder" in r.getMessage()]
    assert len(waits) == 2 and all("trying again in" in r.getMessage() for r in waits)
    # The second refusal came only after the first wait (0.3 s less at most 20 % jitter): no retry per packet.
    assert waits[1].created - waits[0].created >= 0.3 * 0.8


def test_stop_during_the_wait_ends_the_stream_at_once(pipeline, monkeypatch) -> None:
    monkeypatch.setattr(decoder_slot, "create_decoder", lambda kind, info, **kw: _NoRoom())
    pipe = pipeline(capacity=2)
    cfg = StreamConfig(id="full", url=str(CLIP), reconnect_initial_s=30.0, reconnect_max_s=60.0)
    full = pipe.add(cfg, policy="block")
    pipe.start()
    assert pipe.wait_until(lambda: full.stats.state == "no_decoder", 10)
    t0 = time.monotonic()
    pipe.stop.set()
    assert full.join(5) and time.monotonic() - t0 < 2.0
    assert full.stats.state == "ended" and full.stats.decoded == 0


def test_the_first_wait_for_a_decoder_is_long(pipeline, monkeypatch, caplog) -> None:
    """Decoders free up only when other streams end: the first retry waits DECODER_WAIT_S (5 s, less
    up to 20 % jitter), not reconnect_initial_s (0.5 s), so many waiting streams do not storm the GPU."""
    monkeypatch.setattr(decoder_slot, "create_decoder", lambda kind, info, **kw: _NoRoom())
    caplog.set_level(logging.WARNING, logger="streamd.ingest.stream")
    pipe = pipeline(capacity=2)
    # its own id: the stream thread's warnings are rate-limited per stream (3 per 10 s); the tests above
    # used "full"
    cfg = StreamConfig(id="waits-5s", url=str(CLIP), reconnect_initial_s=0.5, reconnect_max_s=30.0)
    full = pipe.add(cfg, policy="block")
    pipe.start()

    def waits() -> list[str]:
        return [r.getMessage() for r in caplog.records if "trying again in" in r.getMessage()]

    assert pipe.wait_until(lambda: bool(waits()), 10), full.stats
    delay = float(waits()[0].split("trying again in ")[1].split(" s")[0])
    assert decoder_slot.DECODER_WAIT_S * 0.8 <= delay <= decoder_slot.DECODER_WAIT_S
    pipe.stop.set()
    assert full.join(5)
