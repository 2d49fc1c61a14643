"""ByteTrack-style multi-object tracking for one stream, vectorised per frame.

Per detected frame (``ByteTracker.update``):

1. Every track's constant-velocity Kalman state (box centre, aspect, height and their velocities, as in
   ByteTrack) is predicted to this frame, ``dt`` = frames since the previous update (``detect_fps`` skips).
2. High-score detections (``score >= high_score``) are matched to all live tracks (seen now or lost less than
   ``lost_timeout_s`` ago) on the IoU matrix, cost 1 - IoU, gated at ``match_iou``.
3. The remaining (low-score) detections are matched to the tracks still unmatched, gated at IoU 0.3
   (ByteTrack's second association: occluded objects score low).
4. Unmatched detections scoring at least ``new_track_score`` start new tracks, except duplicates: a box
   overlapping (IoU >= 0.3, same class) a box that continued a track is a second box on the same object
   (NMS keeps such pairs below its IoU threshold) and starts nothing. Tracks unseen for longer than
   ``lost_timeout_s`` end.

IoU matrices are numpy, the assignment is ``lap.lapjv`` (Jonker-Volgenant, with a cost limit), the Kalman
predict/update run on all tracks at once. No Python loop runs over box pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamd.config.tracking import TrackingConfig

_W_POS, _W_VEL = 1.0 / 20, 1.0 / 160  # ByteTrack's noise weights (relative to the box height)
_SECOND_IOU = 0.3  # measured on vtest: fewer id switches than ByteTrack's 0.5
_NO_TRACK = -1
_DUPLICATE_IOU = 0.3  # measured on vtest: id switches 4.2 -> 1.6 per 100 frames, 1 % of boxes


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, 4) x (m, 4) xyxy boxes -> (n, m) IoU."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)), np.float64)
    a = a.astype(np.float64).T[:, :, None]  # (4, n, 1)
    b = b.astype(np.float64).T[:, None, :]  # (4, 1, m)
    iw = np.maximum(np.minimum(a[2], b[2]) - np.maximum(a[0], b[0]), 0.0)
    ih = np.maximum(np.minimum(a[3], b[3]) - np.maximum(a[1], b[1]), 0.0)
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / np.maximum(union, 1e-12)  # union 0 only for empty boxes, whose inter is 0


LAP_FIX = "pip install 'lap>=0.5' (a streamd dependency), or set tracking: {enabled: false}"


def lap_missing() -> str | None:
    """Why ``import lap`` fails, None when it works. ``assign`` imports it only at the first ambiguous match,
    which can come minutes into a run and then stops the worker's pipeline (the fifteenth session's GPU box
    lacked it); start-up, reloads, the control API and the cluster's stream list ask here first."""
    try:
        import lap  # noqa: F401
    except Exception as exc:  # ImportError, or a build for another numpy ("dtype size changed")
        return f"{type(exc).__name__}: {exc}"
    return None


def missing_dependency(streams: Sequence[Any], tracking: Any = None) -> str | None:
    """One line when a stream tracks and lap cannot be imported, else None. ``tracking``: the config's global
    section; when it turns tracking on, the line names ``tracking.enabled`` instead of the stream's key."""
    tracked = [i for i, s in enumerate(streams) if s.tracking.enabled]
    if not tracked:
        return None
    why = lap_missing()
    if why is None:
        return None
    i = tracked[0]
    key = "tracking.enabled" if getattr(tracking, "enabled", False) else f"streams[{i}].tracking.enabled"
    more = f" and {len(tracked) - 1} more" if len(tracked) > 1 else ""
    return (
        f"{key} (stream {streams[i].id}{more}): tracking needs the lap package, which cannot be imported "
        f"({why}); {LAP_FIX}"
    )


def assign(iou: np.ndarray, min_iou: float) -> tuple[np.ndarray, np.ndarray]:
    """Optimal one-to-one matching maximising total IoU, pairs below ``min_iou`` excluded.
    Returns (rows, cols) of the matched pairs."""
    if iou.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    gate = iou >= min_iou
    if (gate.sum(0) <= 1).all() and (gate.sum(1) <= 1).all():  # no conflict: the gated pairs are the optimum
        rows, cols = np.nonzero(gate)
        return rows.astype(np.int64), cols.astype(np.int64)
    import lap  # small C extension (numpy only); `streamd check` and start-up ask lap_missing() first

    _, x, _ = lap.lapjv(1.0 - iou, extend_cost=True, cost_limit=1.0 - min_iou)
    rows = np.nonzero(x >= 0)[0]
    cols = x[rows].astype(np.int64)
    ok = iou[rows, cols] >= min_iou
    return rows[ok], cols[ok]


def xyxy_to_xyah(b: np.ndarray) -> np.ndarray:
    out = np.empty((len(b), 4))
    w = b[:, 2] - b[:, 0]
    h = np.maximum(b[:, 3] - b[:, 1], 1e-3)
    out[:, 0] = b[:, 0] + w / 2
    out[:, 1] = b[:, 1] + h / 2
    out[:, 2] = w / h
    out[:, 3] = h
    return out


def xyah_to_xyxy(m: np.ndarray) -> np.ndarray:
    half = np.empty((len(m), 2))
    half[:, 1] = m[:, 3] / 2
    half[:, 0] = m[:, 2] * half[:, 1]
    return np.concatenate([m[:, :2] - half, m[:, :2] + half], 1)


# The Kalman filter is ByteTrack's (state x, y, aspect, height and their velocities; noise relative to
# the height). Its F, Q, H and R never couple two coordinates, and its initial covariance is diagonal, so
# the 8 x 8 covariance stays four independent 2 x 2 blocks (position, velocity of one coordinate). We keep
# just those: ``var`` (k, 3, 4) = P_pp, P_pv, P_vv per coordinate; every step is then a few elementwise
# numpy operations over all tracks, with the same results as the 8 x 8 form.
_POS_W = np.array([_W_POS, _W_POS, 0.0, _W_POS])  # std = weight * height, plus the constant below
_POS_C = np.array([0.0, 0.0, 1e-2, 0.0])
_VEL_W = np.array([_W_VEL, _W_VEL, 0.0, _W_VEL])
_VEL_C = np.array([0.0, 0.0, 1e-5, 0.0])
_MEAS_C = np.array([0.0, 0.0, 1e-1, 0.0])


def kalman_initiate(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, 4) xyah measurements -> mean (k, 8), variances (k, 3, 4)."""
    mean = np.concatenate([z, np.zeros_like(z)], 1)
    h = z[:, 3:4]
    var = np.zeros((len(z), 3, 4))
    var[:, 0] = (2 * _POS_W * h + _POS_C) ** 2
    var[:, 2] = (10 * _VEL_W * h + _VEL_C) ** 2
    return mean, var


def kalman_predict(mean: np.ndarray, var: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Advance every state by ``dt`` frames (constant velocity); new arrays."""
    if len(mean) == 0 or dt <= 0:
        return mean, var
    h = mean[:, 3:4]
    pp, pv, vv = var[:, 0], var[:, 1], var[:, 2]
    out_mean = mean.copy()
    out_mean[:, :4] += dt * mean[:, 4:]
    out = np.empty_like(var)
    out[:, 0] = pp + 2 * dt * pv + dt * dt * vv + dt * (_POS_W * h + _POS_C) ** 2
    out[:, 1] = pv + dt * vv
    out[:, 2] = vv + dt * (_VEL_W * h + _VEL_C) ** 2
    return out_mean, out


def kalman_update(mean: np.ndarray, var: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Correct states (k, 8) with measurements (k, 4) xyah; new arrays."""
    if len(mean) == 0:
        return mean, var
    h = mean[:, 3:4]
    pp, pv, vv = var[:, 0], var[:, 1], var[:, 2]
    s = pp + (_POS_W * h + _MEAS_C) ** 2
    k_pos, k_vel = pp / s, pv / s
    innovation = z - mean[:, :4]
    out_mean = np.concatenate([mean[:, :4] + k_pos * innovation, mean[:, 4:] + k_vel * innovation], 1)
    out = np.empty_like(var)
    out[:, 0] = (1 - k_pos) * pp
    out[:, 1] = (1 - k_pos) * pv
    out[:, 2] = vv - k_vel * pv
    return out_mean, out


@dataclass(slots=True)
class TrackUpdate:
    """What one update says: per detection its ``track_id`` (-1: not tracked) and ``track_age`` (frames since
    the track was first seen), and the ids of the tracks that ended at this frame."""

    track_id: np.ndarray  # (n,) int64
    track_age: np.ndarray  # (n,) int64
    ended: list[int]


@dataclass(slots=True)
class PredictedTracks:
    """Tracks seen in the last update, with boxes predicted to a later frame."""

    xyxy: np.ndarray  # (k, 4) float32
    score: np.ndarray  # (k,) float32: the last detection's score
    class_id: np.ndarray  # (k,) int32
    track_id: np.ndarray  # (k,) int64
    track_age: np.ndarray  # (k,) int64


class ByteTracker:
    """Tracks of one stream. ``update`` once per detected frame, in frame order; ``predict`` for frames after
    the last update (skipped frames) does not change the state."""

    def __init__(self, config: TrackingConfig) -> None:
        self.cfg = config
        self.next_id = 1
        self.ids = np.zeros(0, np.int64)
        self.cls = np.zeros(0, np.int32)
        self.score = np.zeros(0, np.float32)
        self.first = np.zeros(0, np.int64)  # frame index where the track started
        self.seen_t = np.zeros(0, np.float64)  # stream time (s) of the last match
        self.seen_now = np.zeros(0, bool)  # matched in the last update
        self.mean = np.zeros((0, 8))
        self.var = np.zeros((0, 3, 4))
        self.index: int | None = None  # frame index of the last update
        # the last update's tracks as ``predict`` reads them: filled skipped frames (two of three at
        # detect_fps 10 on 30 fps) reuse it instead of indexing every array again; cleared by ``update``
        self._shown: tuple[np.ndarray, ...] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def _dt(self, index: int) -> float:
        return 1.0 if self.index is None else float(index - self.index)

    def update(
        self, xyxy: np.ndarray, score: np.ndarray, class_id: np.ndarray, index: int, t: float
    ) -> TrackUpdate:
        """Detections of frame ``index`` (stream time ``t`` seconds) -> track ids; advances the state."""
        cfg = self.cfg
        n = len(score)
        self._shown = None
        self.mean, self.var = kalman_predict(self.mean, self.var, self._dt(index))
        self.index = index
        det_track = np.full(n, -1, np.int64)  # detection -> row of the track it matched
        boxes = xyah_to_xyxy(self.mean) if len(self.ids) else np.zeros((0, 4))
        iou = iou_matrix(xyxy, boxes)
        if cfg.class_aware and iou.size:
            iou = iou * (class_id[:, None] == self.cls[None, :])
        high = score >= cfg.high_score
        free_track = np.ones(len(self.ids), bool)
        # 1. high-score detections against every live track
        hi = np.nonzero(high)[0]
        r, c = assign(iou[hi], cfg.match_iou)
        det_track[hi[r]] = c
        free_track[c] = False
        # 2. the other detections against the tracks still free (also lost ones: an occluded object's low
        #    score detection is what brings it back)
        lo = np.nonzero(~high)[0]
        if len(lo) and free_track.any():
            cand = np.nonzero(free_track)[0]
            r, c = assign(iou[lo][:, cand], _SECOND_IOU)
            det_track[lo[r]] = cand[c]
            free_track[cand[c]] = False
        # correct the matched tracks
        matched_det = np.nonzero(det_track >= 0)[0]
        rows = det_track[matched_det]
        if len(rows):
            z = xyxy_to_xyah(xyxy[matched_det].astype(np.float64))
            self.mean[rows], self.var[rows] = kalman_update(self.mean[rows], self.var[rows], z)
            self.score[rows] = score[matched_det]
            self.seen_t[rows] = t
        self.seen_now = ~free_track
        # end tracks lost for too long
        alive = self.seen_now | (t - self.seen_t <= cfg.lost_timeout_s)
        ended = self.ids[~alive].tolist()
        if not alive.all():
            remap = np.cumsum(alive) - 1
            det_track[matched_det] = remap[det_track[matched_det]]
            self._keep(alive)
        # start tracks from unmatched confident detections
        new = np.nonzero((det_track < 0) & (score >= cfg.new_track_score))[0]
        if len(new) and len(matched_det):  # a box overlapping one that continued a track is a duplicate of it
            overlap = iou_matrix(xyxy[new], xyxy[matched_det])
            overlap *= class_id[new][:, None] == class_id[matched_det][None, :]
            new = new[overlap.max(axis=1) < _DUPLICATE_IOU]
        if len(new):
            start = len(self.ids)
            mean, var = kalman_initiate(xyxy_to_xyah(xyxy[new].astype(np.float64)))
            k = len(new)
            self.ids = np.concatenate([self.ids, np.arange(self.next_id, self.next_id + k)])
            self.next_id += k
            self.cls = np.concatenate([self.cls, class_id[new].astype(np.int32)])
            self.score = np.concatenate([self.score, score[new].astype(np.float32)])
            self.first = np.concatenate([self.first, np.full(k, index, np.int64)])
            self.seen_t = np.concatenate([self.seen_t, np.full(k, t)])
            self.seen_now = np.concatenate([self.seen_now, np.ones(k, bool)])
            self.mean = np.concatenate([self.mean, mean])
            self.var = np.concatenate([self.var, var])
            det_track[new] = np.arange(start, start + k)
        track_id = np.full(n, _NO_TRACK, np.int64)
        age = np.zeros(n, np.int64)
        tracked = det_track >= 0
        track_id[tracked] = self.ids[det_track[tracked]]
        age[tracked] = index - self.first[det_track[tracked]]
        return TrackUpdate(track_id, age, ended)

    def _keep(self, mask: np.ndarray) -> None:
        for name in ("ids", "cls", "score", "first", "seen_t", "seen_now", "mean", "var"):
            setattr(self, name, getattr(self, name)[mask])

    def predict(self, index: int) -> PredictedTracks:
        """Boxes of the tracks seen in the last update, predicted to frame ``index`` (state unchanged): the
        mean of ``kalman_predict`` (its covariance is not needed for a box). Every array returned is the
        caller's (new each call): it may change them in place."""
        if self._shown is None:
            rows = np.nonzero(self.seen_now)[0]
            mean = self.mean[rows]
            self._shown = (
                mean[:, :4],
                mean[:, 4:],
                self.score[rows],
                self.cls[rows],
                self.ids[rows],
                self.first[rows],
            )
        pos, vel, score, cls, ids, first = self._shown
        if len(ids):
            dt = self._dt(index)
            xyxy = xyah_to_xyxy(pos + dt * vel if dt > 0 else pos).astype(np.float32)
        else:
            xyxy = np.zeros((0, 4), np.float32)
        return PredictedTracks(xyxy, score.copy(), cls.copy(), ids.copy(), index - first)
