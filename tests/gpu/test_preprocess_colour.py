"""The preprocess kernel vs its CPU twin on the same NV12 planes, in 8-bit levels (issue 25 point 5).

The twin is ``CpuPreprocessor.nv12`` (``stages.preprocess.colour``: the kernel's YUV -> RGB, chroma of the
2 x 2 block, no rounding; cv2.resize INTER_LINEAR; normalise). Bound: >= 99.9 % of output values within one
8-bit level (``|kernel - twin| * std``), for BT.601/BT.709 x limited/full range, down- and upscaling, float32
and float16. Real planes: pictures NVDEC decodes from the bundled clips and the low-resolution clips of
``tools/make_lowres_clip.sh`` (where made), converted with the matrix and range the stream signals: the test
checks NVDEC's surfaces carry the signalled ones.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec
from tests.gpu.reference import random_nv12
from tests.gpu.test_preprocess_gpu import DeviceFrames, run_gpu

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SPECS = {
    "nanodet416-bgr": PreprocessSpec(
        416, 416, "bgr", (103.53, 116.28, 123.675), (57.375, 57.12, 58.395), "letterbox", 114
    ),
    "yolo640-rgb-unit": PreprocessSpec(640, 640, "rgb", (0.0, 0.0, 0.0), (255.0, 255.0, 255.0)),
    "stretch320x192-rgb": PreprocessSpec(320, 192, "rgb", resize="stretch", pad_value=0),
}
COMBOS = [(m, f) for m in ("bt601", "bt709") for f in (False, True)]
IDS = [f"{m}-{'full' if f else 'limited'}" for m, f in COMBOS]
# clip -> (matrix, full range) the stream signals (or the default: no colour description, under 720 lines)
CLIPS = {
    "samples/vtest.mp4": ("bt601", False),
    "samples/vtest-hevc.mp4": ("bt601", False),
    ".assets-work/lowres/vtest-384-bt601.mp4": ("bt601", False),
    ".assets-work/lowres/vtest-384-bt709.mp4": ("bt709", False),
    ".assets-work/lowres/vtest-384-full.mp4": ("bt601", True),
}


def levels(got: np.ndarray, want: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """|got - want| in 8-bit levels of the source picture (normalised values times std)."""
    assert not np.isnan(got).any(), "output elements left unwritten"
    return np.abs(got - want) * np.asarray(spec.std, np.float32).reshape(3, 1, 1)


def check(diff: np.ndarray, what: str) -> str:
    within = float((diff <= 1.0).mean())
    line = f"{what}: {100 * within:.4f} % within one level, max {float(diff.max()):.4f}"
    print(line)
    assert within >= 0.999, line
    return line


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize(("matrix", "full"), COMBOS, ids=IDS)
def test_kernel_equals_twin_synthetic(
    ctx: object, loader: object, stream: object, matrix: str, full: bool, spec_name: str, dtype: str
) -> None:
    """Random planes (smooth and pure noise, saturating values included), sizes that down- and upscale."""
    from streamd.stages.preprocess.cuda import GpuPreprocessor

    spec = SPECS[spec_name]
    sizes = [(384, 288), (1920, 1080), (641, 359), (7, 5)]
    rng = np.random.default_rng(zlib.crc32(f"{matrix}{full}{spec_name}".encode()))
    frames, planes = DeviceFrames(stream), []
    for k, (w, h) in enumerate(sizes):
        y, uv = random_nv12(rng, w, h, smooth=k % 2 == 0)
        frames.nv12(y, uv, 3 * k, k % 2, matrix=matrix, full_range=full)
        planes.append((y, uv))
    pre = GpuPreprocessor(spec, ctx, max_batch=len(sizes), dtype=dtype, loader=loader)
    got, _ = run_gpu(pre, frames.surfaces(), stream, dtype)
    pre.close()
    cpu = CpuPreprocessor(spec)
    for i, (y, uv) in enumerate(planes):
        want = np.empty((3, spec.height, spec.width), np.float32)
        cpu.nv12(y, uv, matrix, full, want)
        diff = levels(got[i], want, spec)
        check(diff, f"{sizes[i]} {matrix} full={full} {spec_name} {dtype}")
        if dtype == "float32":  # same arithmetic: only float rounding apart
            assert diff.max() < 0.02


@pytest.mark.parametrize("clip", list(CLIPS))
def test_kernel_equals_twin_on_nvdec_pictures(ctx: object, loader: object, stream: object, clip: str) -> None:
    """NVDEC pictures follow the signalled colour; kernel on the surfaces = twin on the downloaded planes."""
    from streamd.ingest.decode.nvdec import download_nv12, nvdec_available
    from streamd.stages.preprocess.cuda import GpuPreprocessor

    ok, why = nvdec_available()
    if not ok:
        pytest.skip(f"no NVDEC: {why}")
    path = ROOT / clip
    if not path.exists():
        pytest.skip(f"{clip} not made (tools/make_lowres_clip.sh)")
    from streamd.ingest.decode.nvdec import NvdecDecoder
    from streamd.ingest.sources import DemuxOptions, demuxer_class

    dmx = demuxer_class("opencv")(str(path), DemuxOptions(annexb=True))
    dec = NvdecDecoder(dmx.info, pool_size=40)
    pics: list = []
    for pkt in dmx.packets():
        for p in dec.decode(pkt):
            if len(pics) < 24:
                pics.append(p)
            else:
                p.surface.release()
        if len(pics) >= 24:
            break
    dmx.close()
    for p in pics[24:] + [p for k, p in enumerate(pics) if k % 3]:
        p.surface.release()
    pics = pics[:24:3]  # I, P and B pictures
    matrix, full = CLIPS[clip]
    spec = SPECS["nanodet416-bgr"]
    surfaces = [p.surface.planes for p in pics]
    assert {(s.matrix, s.full_range) for s in surfaces} == {(matrix, full)}, (
        "NVDEC ignores the signalled colour"
    )
    for p in pics:
        p.surface.wait(stream)
    pre = GpuPreprocessor(spec, ctx, max_batch=len(pics), dtype="float32", loader=loader)
    got, _ = run_gpu(pre, surfaces, stream, "float32")
    pre.close()
    cpu = CpuPreprocessor(spec)
    diffs = []
    for i, p in enumerate(pics):
        nv12 = download_nv12(p.surface)
        h = p.height
        want = np.empty((3, spec.height, spec.width), np.float32)
        cpu.nv12(nv12[:h], nv12[h:], matrix, full, want)  # even sizes: download_nv12 is (3 h / 2, w)
        diffs.append(levels(got[i], want, spec))
        p.surface.release(stream)
    stream.synchronize()  # type: ignore[attr-defined]
    dec.close()
    diff = np.stack(diffs)
    check(diff, f"{clip} ({len(pics)} NVDEC pictures, {matrix}, full={full})")
    assert diff.max() < 0.02
