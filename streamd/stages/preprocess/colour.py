"""YUV 4:2:0 -> RGB exactly as kernels/preprocess.cu converts, on the CPU (numpy + OpenCV).

One conversion for both paths, so the CPU path gives the GPU path's pictures by construction:

- the CPU decoder (``streamd.ingest.decode.cpu``) turns each yuv420p / NV12 picture into its BGR uint8 image
  with :func:`yuv420_to_bgr` (the float result rounded to nearest, at most half a level from the kernel's);
- :func:`nv12_to_bgr_float` is the kernel's conversion without that rounding (the CPU twin's NV12 input,
  ``CpuPreprocessor.nv12``; the GPU tests compare the kernel against it).

Arithmetic (the kernel's): ``l = (Y - y_off) * y_gain``; ``R = l + r_v (V - 128)``, ``G = l + g_u (U - 128) +
g_v (V - 128)``, ``B = l + b_u (U - 128)`` in float32, each clamped to [0, 255] and never rounded to 8 bits
before the resize. Coefficients come from the matrix's (Kr, Kb) (BT.601: 0.299, 0.114; BT.709: 0.2126,
0.0722); limited range scales luma by 255/219 after removing 16 and chroma by 255/224, full range uses the
codes as they are.

Chroma siting and interpolation: each luma pixel takes the chroma sample of the 2 x 2 block it belongs to
(nearest-neighbour upsampling, rows ``y // 2``, columns ``x // 2``), in both the kernel and here. That ignores
where the stream says chroma sits (H.264/HEVC default: left column, between the two rows), an error of at
most half a chroma sample at colour edges, the same on both paths; the bilinear resize that follows works on
the converted RGB pixels. FFmpeg's own converter (libswscale, used by ``to_ndarray(format="bgr24")``) differs:
its fast limited-range path is about one level darker on average (measured on the bundled clip: -1.06 levels,
up to 2.9 apart), which is why the CPU decoder no longer uses it for these formats.

Which matrix and range: what the stream signals (:func:`signalled`: the VUI's matrix_coefficients and
video_full_range_flag, as FFmpeg or ``ingest.decode.sps`` read them), else the source's default
(``VideoInfo.color_matrix``: BT.709 from 720 lines up, else BT.601; limited range).
"""

from __future__ import annotations

import cv2
import numpy as np

# (Kr, Kb) luma weights of each colour matrix (streamd.types.COLOR_MATRICES).
MATRICES = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}
# ISO/IEC 23091-2 MatrixCoefficients (= FFmpeg's AVColorSpace) that streamd converts; others use the default.
MATRIX_CODES = {1: "bt709", 5: "bt601", 6: "bt601"}
RANGE_LIMITED, RANGE_FULL = 1, 2  # FFmpeg's AVColorRange (0: unspecified)


def yuv_coefficients(matrix: str, full_range: bool) -> tuple[float, float, float, float, float, float]:
    """(y_off, y_gain, r_v, g_u, g_v, b_u): YUV -> RGB in 0..255 units, from the matrix's Kr, Kb."""
    kr, kb = MATRICES[matrix]
    kg = 1.0 - kr - kb
    y_off, y_gain, c_gain = (0.0, 1.0, 1.0) if full_range else (16.0, 255.0 / 219.0, 255.0 / 224.0)
    return (
        y_off,
        y_gain,
        2.0 * (1.0 - kr) * c_gain,
        -2.0 * kb * (1.0 - kb) / kg * c_gain,
        -2.0 * kr * (1.0 - kr) / kg * c_gain,
        2.0 * (1.0 - kb) * c_gain,
    )


def signalled(
    matrix_code: int | None, range_code: int | None, default_matrix: str, default_full: bool
) -> tuple[str, bool]:
    """(matrix, full_range) to convert with: the signalled ones where known (``matrix_code``: ISO/IEC 23091-2
    MatrixCoefficients; ``range_code``: AVColorRange, 1 limited, 2 full), else the defaults."""
    matrix = MATRIX_CODES.get(matrix_code or 0, default_matrix)
    full = default_full if range_code not in (RANGE_LIMITED, RANGE_FULL) else range_code == RANGE_FULL
    return matrix, full


def _transform(matrix: str, full_range: bool) -> np.ndarray:
    """3 x 4 affine map (Y, U, V, 1) -> (B, G, R), float32, 0..255 units."""
    y_off, y_gain, r_v, g_u, g_v, b_u = yuv_coefficients(matrix, full_range)
    rows = [(y_gain, b_u, 0.0), (y_gain, g_u, g_v), (y_gain, 0.0, r_v)]
    return np.array([(a, b, c, -y_off * a - 128.0 * (b + c)) for a, b, c in rows], np.float32)


_TRANSFORMS = {(m, f): _transform(m, f) for m in MATRICES for f in (False, True)}


def _upsample(plane: np.ndarray, width: int, height: int) -> np.ndarray:
    """Chroma plane (ceil(h/2), ceil(w/2)) -> (h, w), each sample repeated over its 2 x 2 block."""
    ch, cw = plane.shape
    return cv2.resize(plane, (2 * cw, 2 * ch), interpolation=cv2.INTER_NEAREST)[:height, :width]


def _check(y: np.ndarray, u: np.ndarray, v: np.ndarray, matrix: str) -> None:
    if matrix not in MATRICES:
        raise ValueError(f"unknown colour matrix {matrix!r}; expected one of {', '.join(MATRICES)}")
    h, w = y.shape
    ch, cw = (h + 1) // 2, (w + 1) // 2
    if u.shape != (ch, cw) or v.shape != (ch, cw):
        raise ValueError(f"chroma planes {u.shape}, {v.shape} do not fit {w}x{h}: expected {(ch, cw)}")


def _convert(y: np.ndarray, u: np.ndarray, v: np.ndarray, transform: np.ndarray) -> np.ndarray:
    h, w = y.shape
    yuv = cv2.merge([np.ascontiguousarray(y), _upsample(u, w, h), _upsample(v, w, h)]).astype(np.float32)
    bgr = cv2.transform(yuv, transform)
    return np.clip(bgr, 0.0, 255.0, out=bgr)


def yuv420_to_bgr_float(
    y: np.ndarray, u: np.ndarray, v: np.ndarray, matrix: str = "bt601", full_range: bool = False
) -> np.ndarray:
    """Planes Y (h, w), U and V (ceil(h/2), ceil(w/2)) uint8 -> (h, w, 3) float32 BGR in [0, 255]."""
    _check(y, u, v, matrix)
    return _convert(y, u, v, _TRANSFORMS[(matrix, full_range)])


def nv12_to_bgr_float(
    y: np.ndarray, uv: np.ndarray, matrix: str = "bt601", full_range: bool = False
) -> np.ndarray:
    """NV12 planes (Y (h, w), interleaved UV (ceil(h/2), 2 ceil(w/2))) uint8 -> (h, w, 3) float32 BGR."""
    return yuv420_to_bgr_float(
        y, np.ascontiguousarray(uv[:, 0::2]), np.ascontiguousarray(uv[:, 1::2]), matrix, full_range
    )


def yuv420_to_bgr(
    y: np.ndarray, u: np.ndarray, v: np.ndarray, matrix: str = "bt601", full_range: bool = False
) -> np.ndarray:
    """:func:`yuv420_to_bgr_float` rounded to the nearest level (ties to even): (h, w, 3) uint8.

    Converted in strips of rows whose float intermediates (~27 bytes a pixel) fit a core's L2 cache: 1.0 CPU
    ms per 768 x 576 picture instead of 2.1 in one pass (libswscale's converter: 0.13 ms, not exact).
    """
    _check(y, u, v, matrix)
    transform = _TRANSFORMS[(matrix, full_range)]
    h, w = y.shape
    out = np.empty((h, w, 3), np.uint8)
    strip = max(8, _STRIP_BYTES // (27 * w)) & ~1  # even: each strip starts on a chroma row
    for r0 in range(0, h, strip):
        r1 = min(h, r0 + strip)
        bgr = _convert(y[r0:r1], u[r0 // 2 : (r1 + 1) // 2], v[r0 // 2 : (r1 + 1) // 2], transform)
        out[r0:r1] = np.rint(bgr, out=bgr)  # integral values in [0, 255]: the cast is exact
    return out


_STRIP_BYTES = 640 << 10
