"""The latest frame of each stream, kept by reference, turned into a JPEG with boxes only when asked.

``LatestFrames.update(result)`` runs on the frame path (the collect thread) and costs a dict store: it keeps
a reference to the frame's host image and its detections, never a copy. A frame that lives on the GPU (no
host image) is copied to the host only after someone asked for a snapshot of its stream: ``jpeg()`` marks
the stream as wanted and waits briefly; ``capture(frame)``, called by the ingest thread before the frame is
queued (its decoder surface is still valid there, not at collect time), copies the next frame of a wanted
stream with ``to_host`` (``nv12_surface_to_bgr`` for NVDEC); its result then pairs with that copy by frame
index. Encoding happens in ``jpeg()``, on the caller's thread (the HTTP handler or the worker's message loop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import cv2
import numpy as np

from streamd.types import Detections, Frame, FrameResult

BOX_BGR = (0, 255, 0)  # pure green: easy to find again in a test
TEXT_BGR = (0, 0, 0)
_STALE_FRAMES = 30  # a copied frame whose result has not come this many frames later was dropped: copy again


def render_jpeg(
    image: np.ndarray, detections: Detections, names: Sequence[str] = (), quality: int = 80
) -> bytes:
    """A BGR uint8 image (H, W, 3) with each detection drawn as a box and a ``label score`` tag -> JPEG."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(
            f"render_jpeg: expected a BGR uint8 (H, W, 3) image, got {image.dtype} {image.shape}"
        )
    canvas = image.copy()  # the caller's frame stays untouched
    h, w = canvas.shape[:2]
    thickness = max(2, round(min(h, w) / 300))
    for (x1, y1, x2, y2), score, cid in zip(
        detections.xyxy.tolist(), detections.score.tolist(), detections.class_id.tolist(), strict=True
    ):
        p1, p2 = (round(x1), round(y1)), (round(x2), round(y2))
        cv2.rectangle(canvas, p1, p2, BOX_BGR, thickness)
        label = f"{names[cid] if 0 <= cid < len(names) else cid} {score:.2f}"
        (tw, th), base = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, 0.45, 1)
        top = max(0, p1[1] - th - base - 2)
        cv2.rectangle(canvas, (p1[0], top), (p1[0] + tw + 4, top + th + base + 2), BOX_BGR, -1)
        cv2.putText(canvas, label, (p1[0] + 2, top + th + 1), cv2.FONT_HERSHEY_SIMPLEX, 0.45, TEXT_BGR, 1)
    ok, buf = cv2.imencode(".jpg", canvas, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("render_jpeg: OpenCV could not encode the JPEG")
    return buf.tobytes()


class LatestFrames:
    """Per stream: the latest frame's host image and detections (references), for snapshots on request.

    ``to_host(frame) -> BGR array | None`` copies a GPU frame to the host; it is called on the frame path,
    but only for a stream someone is waiting for."""

    def __init__(
        self, names: Sequence[str] = (), to_host: Callable[[Frame], np.ndarray | None] | None = None
    ) -> None:
        self.names = tuple(names)
        self._to_host = to_host
        self._latest: dict[str, tuple[np.ndarray, Detections]] = {}
        self._wanted: set[str] = set()
        self._captured: dict[str, tuple[int, np.ndarray]] = {}  # GPU frames copied on request, by index
        self._arrived = threading.Condition()

    def update(self, result: FrameResult) -> None:
        """Frame path: keep references to the newest host image and detections of the stream."""
        frame = result.frame
        image = frame.image
        if image is None:  # a GPU frame: only one that capture() copied for a request has pixels here
            if not self._captured:
                return
            copied = self._captured.get(frame.stream_id)
            if copied is None or copied[0] != frame.index:
                return
            del self._captured[frame.stream_id]
            self._wanted.discard(frame.stream_id)
            image = copied[1]
        self._latest[frame.stream_id] = (image, result.detections)
        if self._wanted:
            with self._arrived:
                self._arrived.notify_all()

    def capture(self, frame: Frame) -> None:
        """Ingest thread, just before the frame is queued: a GPU frame of a stream someone is waiting for is
        copied to the host now (one frame per request); everything else returns at once."""
        host = frame.image is not None or frame.pending is not None  # its result brings its pixels
        if host or self._to_host is None or frame.stream_id not in self._wanted:
            return
        pending = self._captured.get(frame.stream_id)
        if pending is not None and frame.index - pending[0] < _STALE_FRAMES:
            return  # one copy per request: its result is on the way (unless a full live queue dropped it)
        image = self._to_host(frame)
        if image is not None:
            self._captured[frame.stream_id] = (frame.index, image)

    def jpeg(self, stream_id: str, wait_s: float = 1.0) -> bytes | None:
        """A JPEG of the stream's latest frame with its boxes; None when there is none (yet)."""
        if self._to_host is not None:  # GPU frames: ask for a host copy of the next one and wait for it
            self._wanted.add(stream_id)
            with self._arrived:
                self._arrived.wait_for(lambda: stream_id not in self._wanted, timeout=wait_s)
        latest = self._latest.get(stream_id)
        if latest is None:
            return None
        image, detections = latest
        return render_jpeg(image, detections, self.names)

    def forget(self, stream_id: str) -> None:
        self._latest.pop(stream_id, None)
        self._captured.pop(stream_id, None)


def nv12_surface_to_bgr(frame: Frame) -> np.ndarray | None:
    """``to_host`` for NVDEC frames: the frame's NV12 surface copied to the host, as BGR (one D2H copy)."""
    if frame.surface is None:
        return None
    from streamd.ingest.decode.nvdec import download_nv12  # CUDA only when a GPU frame is asked for

    nv12 = download_nv12(frame.surface)
    return cv2.cvtColor(nv12, cv2.COLOR_YUV2BGR_NV12)[: frame.height, : frame.width]
