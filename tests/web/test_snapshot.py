"""The snapshot renderer and the latest-frame holder: references only on the frame path, GPU frames copied
to the host only for a request."""

from __future__ import annotations

import threading

import cv2
import numpy as np

from streamd.types import Detections, Frame, FrameResult
from streamd.web.snapshot import LatestFrames, render_jpeg


def detections() -> Detections:
    return Detections(
        np.array([[10, 20, 110, 220]], np.float32), np.array([0.9], np.float32), np.array([0], np.int32)
    )


def green(jpeg: bytes) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    return (img[..., 1] > 180) & (img[..., 0] < 90) & (img[..., 2] < 90)


def test_render_draws_the_boxes_and_leaves_the_frame_alone() -> None:
    image = np.full((240, 320, 3), 128, np.uint8)
    mask = green(render_jpeg(image, detections(), ["person"]))
    assert mask.shape == (240, 320)
    left, right = mask[100:200, 5:16].mean(axis=0).max(), mask[100:200, 104:116].mean(axis=0).max()
    assert left > 0.8 and right > 0.8, "left and right edges drawn"
    assert mask[60:180, 30:90].mean() < 0.01, "inside the box untouched"
    assert (image == 128).all(), "a copy is drawn on, never the pipeline's frame"


def test_host_frames_are_kept_by_reference() -> None:
    latest = LatestFrames(["person"])
    image = np.zeros((240, 320, 3), np.uint8)
    latest.update(FrameResult(Frame("a", 0, 0.0, 320, 240, image=image), detections()))
    assert latest._latest["a"][0] is image, "no copy on the frame path"
    assert latest.jpeg("a")[:2] == b"\xff\xd8" and latest.jpeg("b") is None


def test_gpu_frames_are_copied_once_per_request_before_they_are_queued() -> None:
    copies: list[int] = []

    def to_host(frame: Frame) -> np.ndarray:
        copies.append(frame.index)
        return np.full((frame.height, frame.width, 3), 60, np.uint8)

    latest = LatestFrames(["person"], to_host=to_host)
    gpu = [Frame("g", i, i / 10, 320, 240, surface=object()) for i in range(6)]
    for f in gpu[:3]:  # nobody asked: no copy at ingest, nothing kept at collect
        latest.capture(f)
        latest.update(FrameResult(f, detections()))
    assert copies == [] and latest._latest == {}
    answer: list[bytes | None] = []
    asking = threading.Thread(target=lambda: answer.append(latest.jpeg("g", wait_s=5)))
    asking.start()
    while "g" not in latest._wanted:
        pass
    latest.capture(gpu[3])  # ingest thread: the next frame of the wanted stream is copied
    latest.capture(gpu[4])
    latest.update(FrameResult(gpu[3], detections()))  # collect: its result pairs with the copy
    asking.join()
    assert copies == [3], "one copy per request"
    assert answer and answer[0] is not None and green(answer[0]).sum() > 200
    latest.capture(gpu[5])
    assert copies[-1] != 5, "the request was served: no more copies"
