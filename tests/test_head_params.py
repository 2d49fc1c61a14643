"""The host mirror of ``struct HeadParams`` (kernels/postprocess.cu) has the C struct's fields, order and
size, and a Head becomes the values the kernel reads (no GPU needed)."""

from __future__ import annotations

import ctypes
import re

from streamd.gpu.kernels import KERNEL_DIR
from streamd.stages.postprocess.cuda import HeadParams
from streamd.stages.postprocess.resolve import resolve_head
from tests.heads_data import FAMILIES


def test_host_struct_matches_kernel_struct() -> None:
    src = (KERNEL_DIR / "postprocess.cu").read_text()
    body = re.search(r"struct HeadParams \{(.*?)\n\};", src, re.S).group(1)  # type: ignore[union-attr]
    fields = []
    for line in body.splitlines():
        m = re.match(r"\s*(int|float) ([\w, \[\]]+);", line)
        if m:
            for name in m.group(2).split(","):
                base, _, count = name.strip().partition("[")
                fields.append((base, 4 * (int(count.rstrip("]")) if count else 1)))
    assert [(n, ctypes.sizeof(t)) for n, t in HeadParams._fields_] == fields
    assert ctypes.sizeof(HeadParams) == sum(s for _, s in fields)


def test_a_head_becomes_kernel_values() -> None:
    tf = FAMILIES["tf-od-api"]
    p = HeadParams.of(resolve_head(tf.settings, tf.parts()))
    assert (p.n, p.row, p.score_cols, p.cls_off, p.class_offset, p.count_off) == (100, 601, 1, 500, 1, 600)
    assert list(p.scale) == [480.0, 640.0, 480.0, 640.0]  # yxyx normalised: y by height, x by width
    yolox = FAMILIES["yolox"]
    q = HeadParams.of(resolve_head(yolox.settings, yolox.parts()))
    assert (q.levels, list(q.level_end)[:3], list(q.grid_w)[:3]) == (3, [4800, 6000, 6300], [80, 40, 20])
