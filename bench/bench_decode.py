"""NVDEC decode-only throughput: streamd's demuxer + NvdecDecoder vs a plain PyNvVideoCodec loop, same run.

    PYTHONPATH=/path/to/wheels python bench/bench_decode.py [--clip CLIP] [--streams 1 8 32] [--json OUT]

For each stream count N, N threads each decode the whole clip (enough passes for about ``--seconds``;
decoders are created before the clock starts):

- ``raw``: the ceiling: ``nvc.CreateDemuxer(clip)`` (PyNvVideoCodec's C++ demuxer) + ``nvc.CreateDecoder(
  usedevicememory=True)``, ``for packet in demuxer: decoder.Decode(packet)``;
- ``streamd``: our demuxer (``--demux``: OpenCV raw packets by default, the backend the GPU box has) + our
  ``NvdecDecoder`` (our context and stream, each picture copied device-to-device into a pooled NV12 buffer,
  event recorded), every surface released at once (a consumer that keeps up).

Reports total fps (frames of all threads / wall time), the ratio streamd/raw, and the PCIe traffic NVML saw
during each run next to the pixel rate it would take to move the decoded pictures to the host (the check
that no pixel crosses PCIe). The clip defaults to a synthetic 1080p30 H.264 clip (300 frames) in
.cache/bench/ (gitignored), made with ffmpeg's testsrc2 by ``--make-clip``; the GPU box has no ffmpeg, so
make it here and carry ``.cache/bench`` along.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_CLIP = ROOT / ".cache" / "bench" / "synthetic-1080p30-h264.mp4"


def make_clip(path: Path, frames: int = 300) -> None:
    """1080p30 H.264 (x264 fast, CRF 23, GOP 60, B-frames) from ffmpeg's testsrc2."""
    if shutil.which("ffmpeg") is None:
        raise SystemExit(
            f"{path} is missing and ffmpeg is not installed to make it; make it elsewhere and copy it"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ffmpeg", "-nostdin", "-loglevel", "error", "-y",
         "-f", "lavfi", "-i", "testsrc2=size=1920x1080:rate=30",
         "-frames:v", str(frames), "-c:v", "libx264", "-preset", "fast", "-crf", "23", "-g", "60",
         "-pix_fmt", "yuv420p", "-movflags", "+faststart", str(path)],
        check=True,
    )  # fmt: skip


class PcieSampler:
    """Mean PCIe TX (GPU -> host) and RX (host -> GPU) throughput over a run, from NVML (MB/s)."""

    def __init__(self, device: int = 0) -> None:
        self.ok = False
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device)
            self.ok = True
        except Exception as exc:
            print(f"(no NVML PCIe counters: {exc})")
        self._stop = threading.Event()
        self._tx: list[float] = []
        self._rx: list[float] = []

    def _run(self) -> None:
        nv = self._nvml
        while not self._stop.is_set():
            self._tx.append(nv.nvmlDeviceGetPcieThroughput(self._handle, nv.NVML_PCIE_UTIL_TX_BYTES) / 1e3)
            self._rx.append(nv.nvmlDeviceGetPcieThroughput(self._handle, nv.NVML_PCIE_UTIL_RX_BYTES) / 1e3)

    def __enter__(self) -> PcieSampler:
        self._tx.clear()
        self._rx.clear()
        self._stop.clear()
        if self.ok:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.ok:
            self._thread.join()

    @property
    def mb_s(self) -> tuple[float | None, float | None]:
        if not self._tx:
            return None, None
        return sum(self._tx) / len(self._tx), sum(self._rx) / len(self._rx)


def run_threads(n: int, setup, work) -> tuple[int, float]:
    """``setup(i)`` in each of n threads, then all start ``work(state)`` together; (frames, seconds)."""
    barrier = threading.Barrier(n + 1)
    counts = [0] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            state = setup(i)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            return
        try:
            barrier.wait()
            counts[i] = work(state)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(counts), elapsed


def raw_case(nvc, clip: str, passes: int):
    def setup(_i: int):
        dmx = nvc.CreateDemuxer(clip)
        dec = nvc.CreateDecoder(
            gpuid=0, codec=dmx.GetNvCodecId(), cudacontext=0, cudastream=0, usedevicememory=True
        )
        return dmx, dec

    def work(state) -> int:
        dmx, dec = state
        n = 0
        for p in range(passes):
            if p:
                dmx = nvc.CreateDemuxer(clip)
            for packet in dmx:
                n += len(dec.Decode(packet))
        eos = nvc.PacketData()
        eos.bsl, eos.bsl_data, eos.decode_flag = 0, 0, nvc.VideoPacketFlag.ENDOFSTREAM
        return n + len(dec.Decode(eos))

    return setup, work


def ours_case(clip: str, passes: int, demux: str):
    from streamd.ingest.decode.nvdec import NvdecDecoder
    from streamd.ingest.sources import DemuxOptions, demuxer_class

    cls = demuxer_class(demux)

    def setup(_i: int):
        dmx = cls(clip, DemuxOptions(annexb=True))
        return dmx, NvdecDecoder(dmx.info, pool_size=8)

    def work(state) -> int:
        dmx, dec = state
        n = 0
        try:
            for p in range(passes):
                if p:
                    dmx.close()
                    dmx = cls(clip, DemuxOptions(annexb=True))
                for packet in dmx.packets():
                    for pic in dec.decode(packet):
                        pic.surface.release()
                        n += 1
            for pic in dec.flush():
                pic.surface.release()
                n += 1
        finally:
            dmx.close()
            dec.close()
        return n

    return setup, work


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=3.0, help="aim for about this long per run")
    ap.add_argument("--demux", default="opencv", choices=["opencv", "pyav", "auto"])
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    ap.add_argument("--make-clip", action="store_true", help="only (re)make the clip with ffmpeg, then exit")
    args = ap.parse_args()

    if args.make_clip or not args.clip.exists():
        make_clip(args.clip)
        if args.make_clip:
            print(f"made {args.clip}")
            return 0
    import PyNvVideoCodec as nvc

    from streamd.ingest.sources import DemuxOptions, demuxer_class

    probe = demuxer_class(args.demux)(str(args.clip), DemuxOptions(annexb=True))
    info = probe.info
    clip_frames = sum(1 for _ in probe.packets())
    probe.close()
    pixel_bytes = info.width * info.height * 3 // 2
    print(f"clip {args.clip.name}: {info.codec} {info.width}x{info.height}, {clip_frames} frames; "
          f"PyNvVideoCodec {nvc.__version__}; demux {args.demux}")  # fmt: skip
    sampler = PcieSampler()
    results = []
    est_fps = {1: 200.0}  # first guess for sizing passes; refined by the raw run of each count
    for n in args.streams:
        guess = est_fps.get(n, 1500.0)
        passes = max(1, math.ceil(args.seconds * guess / (n * clip_frames)))
        row: dict = {"streams": n, "passes": passes}
        for name, (setup, work) in (
            ("raw", raw_case(nvc, str(args.clip), passes)),
            ("streamd", ours_case(str(args.clip), passes, args.demux)),
        ):
            with sampler:
                frames, secs = run_threads(n, setup, work)
            tx, rx = sampler.mb_s
            row[name] = {"frames": frames, "seconds": round(secs, 3), "fps": round(frames / secs, 1),
                         "pcie_tx_mb_s": tx, "pcie_rx_mb_s": rx}  # fmt: skip
        row["ratio"] = round(row["streamd"]["fps"] / row["raw"]["fps"], 3)
        row["pixel_mb_s_if_copied_to_host"] = round(row["streamd"]["fps"] * pixel_bytes / 1e6, 1)
        results.append(row)
        print(
            f"{n:3d} streams x {passes} pass(es): raw {row['raw']['fps']:8.1f} fps | streamd "
            f"{row['streamd']['fps']:8.1f} fps | ratio {row['ratio']:.3f} | frames {row['raw']['frames']}/"
            f"{row['streamd']['frames']} | PCIe TX/RX during streamd run: {row['streamd']['pcie_tx_mb_s']}/"
            f"{row['streamd']['pcie_rx_mb_s']} MB/s vs {row['pixel_mb_s_if_copied_to_host']} MB/s of pixels",
            flush=True,
        )
    if args.json:
        meta = {
            "clip": str(args.clip.name),
            "width": info.width,
            "height": info.height,
            "frames": clip_frames,
            "pynvvideocodec": nvc.__version__,
            "demux": args.demux,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "host": os.uname().nodename,
        }
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
