"""CPU reading of a ``Head``: a batch of output rows -> boxes, best scores and classes for every candidate.

numpy views over each image's row (no gathers, no copies until the arithmetic), float32 arithmetic in the
order ``kernels/postprocess.cu``'s ``decode_generic`` uses, so the CPU twin and the kernel keep the same
candidates.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import as_strided

from streamd.stages.postprocess.head import Head


def _view(
    rows: np.ndarray, offset: int, per_candidate: int, per_column: int, n: int, cols: int
) -> np.ndarray:
    """[B, n, cols] read-only view of ``rows[:, offset + a * per_candidate + j * per_column]``."""
    item = rows.itemsize
    return as_strided(
        rows[:, offset:],
        shape=(rows.shape[0], n, cols),
        strides=(rows.strides[0], per_candidate * item, per_column * item),
        writeable=False,
    )


@functools.lru_cache(maxsize=8)
def _grid(head: Head) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """YOLOX: (cell x, cell y, stride) of every candidate, float32, level by level, row-major cells."""
    xs, ys, ss = [], [], []
    for stride, gw, gh in head.grid:
        yy, xx = np.divmod(np.arange(gw * gh), gw)
        xs.append(xx)
        ys.append(yy)
        ss.append(np.full(gw * gh, stride))
    return tuple(np.concatenate(v).astype(np.float32) for v in (xs, ys, ss))  # type: ignore[return-value]


def _boxes(head: Head, rows: np.ndarray) -> np.ndarray:
    n = head.candidates
    raw = np.array(_view(rows, *head.box, n, 4), dtype=np.float32)  # a copy: [B, n, 4]
    if head.grid:
        gx, gy, stride = _grid(head)
        raw[..., 0] = (raw[..., 0] + gx) * stride
        raw[..., 1] = (raw[..., 1] + gy) * stride
        raw[..., 2] = np.exp(raw[..., 2]) * stride
        raw[..., 3] = np.exp(raw[..., 3]) * stride
    if head.box_scale != (1.0, 1.0):
        sx, sy = np.float32(head.box_scale[0]), np.float32(head.box_scale[1])
        raw *= np.array([sy, sx, sy, sx] if head.box_format == "yxyx" else [sx, sy, sx, sy], np.float32)
    a, b, c, d = (raw[..., k] for k in range(4))
    if head.box_format == "cxcywh":
        hw, hh = c * np.float32(0.5), d * np.float32(0.5)
        return np.stack([a - hw, b - hh, a + hw, b + hh], axis=-1)
    if head.box_format == "xywh":
        return np.stack([a, b, a + c, b + d], axis=-1)
    if head.box_format == "yxyx":
        return np.stack([b, a, d, c], axis=-1)
    return raw  # xyxy


def _activate(head: Head, best: np.ndarray, rows: np.ndarray) -> np.ndarray:
    if head.activation == "sigmoid":
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-best))
    if head.activation == "softmax":  # over every score column, a trailing "no object" one included
        every = np.asarray(_view(rows, *head.scores, head.candidates, head.softmax_cols), np.float32)
        top = every.max(axis=-1)
        # summed column by column, as the kernel does (numpy's .sum adds pairwise: other float32 roundings)
        total = np.cumsum(np.exp(every - top[..., None]), axis=-1, dtype=np.float32)[..., -1]
        return np.exp(best - top) / total
    return best


def decode_rows(head: Head, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows [B, row] of one batch -> (xyxy [B, N, 4], score [B, N], class id [B, N] int64, valid [B, N]);
    float32 arithmetic in the kernel's order."""
    rows = np.ascontiguousarray(rows.reshape(len(rows), -1))
    if rows.shape[1] < head.row:
        raise ValueError(f"postprocess: output rows of {rows.shape[1]} values, the head reads {head.row}")
    n = head.candidates
    xyxy = _boxes(head, rows)
    if head.classes is None:
        cols = _view(rows, *head.scores, n, head.num_classes)
        cls = cols.argmax(axis=2)  # the first maximum, as the kernel
        best = np.take_along_axis(cols, cls[..., None], axis=2)[..., 0].astype(np.float32)
    else:
        best = np.asarray(_view(rows, *head.scores, n, 1)[..., 0], np.float32)
        cls = np.asarray(_view(rows, *head.classes, 0, n, 1)[..., 0], np.float32).astype(np.int64)
        cls -= head.class_offset
    score = _activate(head, best, rows)
    if head.objectness is not None:
        score = np.asarray(_view(rows, *head.objectness, 0, n, 1)[..., 0], np.float32) * score
    valid = np.ones(score.shape, bool)
    if head.count is not None:
        valid = np.arange(n)[None] < rows[:, head.count].astype(np.int64)[:, None]
    return xyxy, score.astype(np.float32), cls.astype(np.int64), valid
