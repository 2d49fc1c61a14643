"""YUV -> RGB on the CPU (``stages.preprocess.colour``: the GPU kernel's arithmetic) against an independent
float64 reference, for BT.601 and BT.709, limited and full range; and the CPU decoder following the matrix and
range a stream signals (clips encoded here with PyAV + libx264, colour tags written into the SPS's VUI).

The reference uses the published equations (BT.601: R = Y + 1.402 Cr, G = Y - 0.344136 Cb - 0.714136 Cr,
B = Y + 1.772 Cb; BT.709: 1.5748, 0.187324, 0.468124, 1.8556), limited range expanded first
((Y - 16) * 255/219, (C - 128) * 255/224), chroma repeated over its 2 x 2 block, clamped to [0, 255].
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from streamd.stages.preprocess.colour import (
    nv12_to_bgr_float,
    signalled,
    yuv420_to_bgr,
    yuv420_to_bgr_float,
)
from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec
from tests.conftest import CLIP

EQUATIONS = {"bt601": (1.402, 0.344136, 0.714136, 1.772), "bt709": (1.5748, 0.187324, 0.468124, 1.8556)}
COMBOS = [(m, f) for m in ("bt601", "bt709") for f in (False, True)]
IDS = [f"{m}-{'full' if f else 'limited'}" for m, f in COMBOS]


def reference(y: np.ndarray, u: np.ndarray, v: np.ndarray, matrix: str, full: bool) -> np.ndarray:
    h, w = y.shape
    cb = np.repeat(np.repeat(u.astype(np.float64), 2, 0), 2, 1)[:h, :w] - 128.0
    cr = np.repeat(np.repeat(v.astype(np.float64), 2, 0), 2, 1)[:h, :w] - 128.0
    luma = y.astype(np.float64)
    if not full:
        luma = (luma - 16.0) * 255.0 / 219.0
        cb, cr = cb * 255.0 / 224.0, cr * 255.0 / 224.0
    r_cr, g_cb, g_cr, b_cb = EQUATIONS[matrix]
    bgr = np.stack([luma + b_cb * cb, luma - g_cb * cb - g_cr * cr, luma + r_cr * cr], -1)
    return np.clip(bgr, 0.0, 255.0)


def random_planes(width: int, height: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Noise over a gradient, the whole 0..255 range (saturating corners included)."""
    rng = np.random.default_rng(seed)
    grad = np.linspace(0, 255, height)[:, None] * 0.5 + np.linspace(0, 255, width)[None, :] * 0.5
    y = np.clip(rng.integers(-40, 41, (height, width)) + grad, 0, 255).astype(np.uint8)
    ch, cw = (height + 1) // 2, (width + 1) // 2
    u, v = (rng.integers(0, 256, (ch, cw), dtype=np.uint8) for _ in range(2))
    return y, u, v


def real_planes(count: int = 3) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    av = pytest.importorskip("av")
    out = []
    with av.open(str(CLIP)) as c:
        for i, f in enumerate(c.decode(video=0)):
            if i % 97 == 0:
                h, w = f.height, f.width
                a = f.to_ndarray(format="yuv420p")  # planar, no colour conversion
                out.append(
                    (
                        a[:h],
                        a[h : h + h // 4].reshape(h // 2, w // 2),
                        a[h + h // 4 :].reshape(h // 2, w // 2),
                    )
                )
            if len(out) == count:
                break
    return out


@pytest.mark.parametrize(("matrix", "full"), COMBOS, ids=IDS)
@pytest.mark.parametrize("size", [(64, 48), (7, 5), (1, 1), (385, 289)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_conversion_equals_reference_synthetic(matrix: str, full: bool, size: tuple[int, int]) -> None:
    y, u, v = random_planes(*size, zlib.crc32(f"{size}{matrix}{full}".encode()))
    want = reference(y, u, v, matrix, full)
    got = yuv420_to_bgr_float(y, u, v, matrix, full)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() < 2e-3  # float32 arithmetic vs float64 and 6-digit published constants
    rounded = yuv420_to_bgr(y, u, v, matrix, full)
    assert rounded.dtype == np.uint8
    assert np.abs(rounded - want).max() <= 0.5 + 2e-3  # one rounding, to the nearest level
    uv = np.empty((u.shape[0], 2 * u.shape[1]), np.uint8)
    uv[:, 0::2], uv[:, 1::2] = u, v
    assert np.array_equal(nv12_to_bgr_float(y, uv, matrix, full), got)


@pytest.mark.parametrize(("matrix", "full"), COMBOS, ids=IDS)
def test_conversion_equals_reference_real(matrix: str, full: bool) -> None:
    for y, u, v in real_planes():
        want = reference(y, u, v, matrix, full)
        assert np.abs(yuv420_to_bgr_float(y, u, v, matrix, full) - want).max() < 2e-3
        assert np.abs(yuv420_to_bgr(y, u, v, matrix, full) - want).max() <= 0.5 + 2e-3


@pytest.mark.parametrize(("matrix", "full"), COMBOS, ids=IDS)
def test_twin_nv12_input_equals_reference_then_resize(matrix: str, full: bool) -> None:
    """``CpuPreprocessor.nv12`` = the reference picture through the same letterbox (down- and upscale)."""
    y, u, v = random_planes(385, 289, 5)
    uv = np.empty((u.shape[0], 2 * u.shape[1]), np.uint8)
    uv[:, 0::2], uv[:, 1::2] = u, v
    for spec in (PreprocessSpec(416, 416, "rgb", std=(58.0, 57.0, 57.5)), PreprocessSpec(160, 96, "bgr")):
        pre = CpuPreprocessor(spec)
        got = np.empty((3, spec.height, spec.width), np.float32)
        want = np.empty_like(got)
        assert pre.nv12(y, uv, matrix, full, got) == pre(
            reference(y, u, v, matrix, full).astype(np.float32), want
        )
        levels = np.abs(got - want) * np.asarray(spec.std, np.float32).reshape(3, 1, 1)
        assert levels.max() < 2e-3


def test_signalled_matrix_and_range() -> None:
    assert signalled(1, 1, "bt601", True) == ("bt709", False)
    assert signalled(6, 2, "bt709", False) == ("bt601", True)
    assert signalled(5, None, "bt709", True) == ("bt601", True)
    assert signalled(2, 0, "bt709", False) == ("bt709", False)  # unspecified: the source's default
    assert signalled(9, None, "bt601", False) == ("bt601", False)  # BT.2020: not converted, default stands
    assert signalled(None, 2, "bt601", False) == ("bt601", True)


def encode(path: Path, colorspace: int, color_range: int, size: tuple[int, int] = (66, 50)) -> None:
    """A short H.264 clip with B-frames whose SPS signals ``colorspace`` / ``color_range`` (AVColor*)."""
    av = pytest.importorskip("av")
    rng = np.random.default_rng(colorspace * 10 + color_range)
    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = *size, "yuv420p"
        s.codec_context.colorspace, s.codec_context.color_range = colorspace, color_range
        s.codec_context.options = {"bf": "2", "x264-params": "keyint=10"}
        grad = np.linspace(0, 255, size[0], dtype=np.float64)[None, :, None]
        for _ in range(12):
            img = np.clip(rng.integers(-60, 61, (size[1], size[0], 3)) + grad, 0, 255).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(img, format="bgr24").reformat(format="yuv420p")
            frame.colorspace, frame.color_range = colorspace, color_range
            for p in s.encode(frame):
                out.mux(p)
        for p in s.encode():
            out.mux(p)


@pytest.mark.parametrize(
    ("colorspace", "color_range", "matrix", "full"),
    [(6, 1, "bt601", False), (1, 1, "bt709", False), (6, 2, "bt601", True), (1, 2, "bt709", True)],
    ids=IDS,
)
def test_cpu_decoder_follows_the_signalled_colour(
    tmp_path: Path, colorspace: int, color_range: int, matrix: str, full: bool
) -> None:
    """CpuDecoder's BGR = the reference with the stream's matrix/range, rounded; the SPS says the same to
    NVDEC (``with_colour``), whatever the source's default."""
    av = pytest.importorskip("av")
    from streamd.ingest.decode.cpu import CpuDecoder
    from streamd.ingest.decode.nvdec import find_sps, with_colour
    from streamd.ingest.sources import DemuxOptions, demuxer_class

    clip = tmp_path / f"c{colorspace}r{color_range}.mp4"
    encode(clip, colorspace, color_range)
    dmx = demuxer_class("pyav")(str(clip), DemuxOptions(annexb=True))
    info = dmx.info
    sps = find_sps(np.frombuffer(info.extradata, np.uint8), "h264")
    assert sps is not None
    for default in ("bt601", "bt709"):  # what the OpenCV source would guess
        guessed = with_colour(_with(info, default, not full), sps)
        assert (guessed.color_matrix, guessed.full_range) == (matrix, full)
    dec = CpuDecoder(_with(info, "bt709" if matrix == "bt601" else "bt601", not full))  # a wrong default
    pics = [p for pkt in dmx.packets() for p in dec.decode(pkt)] + dec.flush()
    dmx.close()
    with av.open(str(clip)) as c:
        frames = list(c.decode(video=0))
    assert len(pics) == len(frames) == 12
    for pic, f in zip(pics, frames, strict=True):
        h, w = f.height, f.width
        y, u, v = (np.frombuffer(memoryview(p), np.uint8).reshape(-1, p.line_size) for p in f.planes)
        cw, ch = (w + 1) // 2, (h + 1) // 2
        want = reference(y[:h, :w], u[:ch, :cw], v[:ch, :cw], matrix, full)
        assert np.abs(pic.image.astype(np.float64) - want).max() <= 0.5 + 2e-3


def _with(info: object, matrix: str, full: bool) -> object:
    from dataclasses import replace

    return replace(info, color_matrix=matrix, full_range=full)  # type: ignore[type-var]
