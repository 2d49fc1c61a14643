"""The on-disk spool on its own: order across segments, the read position kept across a reopen, a record cut
short by a crash, the byte cap, one process per folder."""

from __future__ import annotations

import pytest

from streamd.sinks.spool import Spool, SpoolError


def records(start: int, n: int) -> list[tuple[str, str]]:
    return [(f"s{i % 3}", f'{{"frame":{i}}}\n') for i in range(start, start + n)]


def drain(spool: Spool, batch: int = 7) -> list[tuple[str, str]]:
    out = []
    while spool.pending:
        got = spool.peek(batch)
        assert got, "pending records but nothing to read"
        out += got
        spool.commit()
    return out


def test_order_across_segments_and_a_reopen(tmp_path) -> None:
    spool = Spool(tmp_path / "q", max_bytes=1 << 20, segment_bytes=200)  # many small segments
    assert spool.open() == 0
    for start in range(0, 100, 10):
        assert spool.append(records(start, 10)) == 0
    assert len(list((tmp_path / "q").glob("*.spool"))) >= 4
    first = spool.peek(5)
    spool.commit()
    spool.peek(5)  # read, not committed: must come again after the reopen
    spool.close()
    again = Spool(tmp_path / "q", max_bytes=1 << 20, segment_bytes=200)
    assert again.open() == 95
    rest = drain(again)
    assert first + rest == [(sid, line.rstrip("\n")) for sid, line in records(0, 100)]
    again.close()
    assert not list((tmp_path / "q").glob("*.spool"))  # all delivered: nothing left on disk


def test_a_record_cut_by_a_crash_is_dropped_at_open(tmp_path) -> None:
    spool = Spool(tmp_path / "q", max_bytes=1 << 20)
    spool.open()
    spool.append(records(0, 4))
    spool._out.close()  # the process dies: no close(), and half a record at the end
    (segment,) = (tmp_path / "q").glob("*.spool")
    with open(segment, "ab") as f:
        f.write(b's0\t{"frame":')
    spool._out = None
    spool.close()
    again = Spool(tmp_path / "q", max_bytes=1 << 20)
    assert again.open() == 4
    assert [line for _, line in drain(again)] == [f'{{"frame":{i}}}' for i in range(4)]


def test_the_cap_drops_whole_oldest_segments_and_counts_them(tmp_path) -> None:
    spool = Spool(tmp_path / "q", max_bytes=2000, segment_bytes=250)
    spool.open()
    dropped = sum(spool.append(records(start, 10)) for start in range(0, 200, 10))
    kept = drain(spool, batch=50)
    frames = [int(line.split(":")[1].rstrip("}")) for _, line in kept]
    print(f"cap 2000 B: {dropped} of 200 dropped, {len(kept)} kept ({frames[0]}..{frames[-1]})")
    assert dropped == spool.dropped and dropped + len(kept) == 200
    assert frames == list(range(dropped, 200)) and spool.size <= 2000


def test_one_process_per_folder(tmp_path) -> None:
    a = Spool(tmp_path / "q", max_bytes=1 << 20)
    a.open()
    with pytest.raises(SpoolError, match="in use by another process"):
        Spool(tmp_path / "q", max_bytes=1 << 20).open()
    a.close()
    b = Spool(tmp_path / "q", max_bytes=1 << 20)
    assert b.open() == 0
    b.close()
