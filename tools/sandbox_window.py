#!/usr/bin/env python3
"""What a run of live streams delivered in its last WINDOW seconds, from its JSONL output.

    tools/sandbox_window.py OUT.jsonl [--window 60] [--fps 30]

Prints one line: streams, lines in the window, the slowest stream's share of WINDOW x FPS, frame-index gaps
(frames dropped after decode) inside the window, and p99 of latency_ms.arrival. Exit 1 when some stream is
under 95 % of its rate, a gap shows, or the output covers less than WINDOW seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--fps", type=float, default=30.0)
    args = p.parse_args()
    rows = []
    with open(args.out) as f:
        for line in f:
            if line.endswith("}\n") or line.endswith("}"):
                r = json.loads(line)
                if "type" not in r:
                    rows.append(r)
    if not rows:
        print("no lines")
        return 1
    end = max(r["time"] for r in rows)
    start = end - args.window
    first = min(r["time"] for r in rows)
    per: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["time"] >= start:
            per[r["stream"]].append(r)
    gaps = 0
    for mine in per.values():
        frames = sorted(r["frame"] for r in mine)
        gaps += sum(b - a - 1 for a, b in itertools.pairwise(frames) if b > a + 1)
    expected = args.window * args.fps
    share = min(len(v) for v in per.values()) / expected
    lat = [r["latency_ms"] for v in per.values() for r in v]
    arrival = sorted(x.get("arrival", x["total"]) for x in lat)
    p99 = arrival[min(len(arrival) - 1, int(0.99 * len(arrival)))]
    covered = end - first
    print(
        f"{len(per)} streams, {sum(len(v) for v in per.values())} lines in the last {args.window:.0f} s "
        f"(output covers {covered:.0f} s), slowest stream {share:.3f} of {args.fps:g} fps, {gaps} gaps, "
        f"arrival p99 {p99:.1f} ms"
    )
    return 0 if share >= 0.95 and gaps == 0 and covered >= args.window else 1


if __name__ == "__main__":
    sys.exit(main())
