"""How many NVDEC decoders one GPU holds at once: P processes each create K PyNvVideoCodec decoders (the
options streamd's NVDEC decoder uses) and keep them all alive, each decoding the clip's first GOP.

    python tools/nvdec_sessions.py CLIP [--processes 8] [--decoders 48]

Prints, per process, how many decoders were created and gave pictures, and the first error's text; then
the total. Tells a limit on decoder count (creation or first decode fails past N, whatever the load) from a
limit on throughput (bench/bench_live.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time


def part(clip: str, k: int, packets: int, out, barrier) -> None:
    import PyNvVideoCodec as nvc

    first = None
    codec = nvc.CreateDemuxer(clip).GetNvCodecId()
    decoders, good = [], 0
    for i in range(k):
        try:
            dec = nvc.CreateDecoder(gpuid=0, codec=codec, usedevicememory=True, maxwidth=1920, maxheight=1088)
            decoders.append(dec)
            demux_i = nvc.CreateDemuxer(clip)  # fresh packets for each decoder
            pictures = 0
            for n, packet in enumerate(demux_i):
                pictures += len(dec.Decode(packet))
                if n + 1 >= packets:
                    break
            good += pictures > 0
        except Exception as exc:
            if first is None:
                first = f"decoder {i}: {type(exc).__name__}: {exc}"
    barrier.wait(timeout=240)  # every process has made all its decoders before any lets go of them
    out.put({"created": len(decoders), "gave_pictures": good, "first_error": first})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("clip")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--decoders", type=int, default=48)
    ap.add_argument("--packets", type=int, default=30)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    out, barrier = ctx.Queue(), ctx.Barrier(args.processes)
    procs = [ctx.Process(target=part, args=(args.clip, args.decoders, args.packets, out, barrier))
             for _ in range(args.processes)]  # fmt: skip
    t0 = time.time()
    for p in procs:
        p.start()
    parts = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    total = {
        "processes": args.processes,
        "decoders_per_process": args.decoders,
        "created": sum(x["created"] for x in parts),
        "gave_pictures": sum(x["gave_pictures"] for x in parts),
        "first_errors": sorted({x["first_error"] for x in parts if x["first_error"]}),
        "seconds": round(time.time() - t0, 1),
    }
    print(json.dumps(parts))
    print(json.dumps(total))


if __name__ == "__main__":
    main()
