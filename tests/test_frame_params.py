"""The preprocess kernel's per-frame parameters (built once per geometry, then broadcast) equal the record
written field by field from each surface, for mixed batches of NV12 and packed frames. No GPU needed."""

from __future__ import annotations

import numpy as np

from streamd.stages.preprocess.cuda import FRAME_DTYPE, frame_params, yuv_coefficients
from streamd.stages.preprocess.spec import PreprocessSpec, compute_transform
from streamd.types import Nv12Surface, PackedSurface


def expected(surface, spec: PreprocessSpec) -> dict:
    t, nw, nh = compute_transform(surface.width, surface.height, spec)
    row = {
        "sx": 1.0 / (nw / surface.width), "sy": 1.0 / (nh / surface.height),
        "src_w": surface.width, "src_h": surface.height,
        "x0": int(t.pad_x), "y0": int(t.pad_y), "rw": nw, "rh": nh,
    }  # fmt: skip
    if isinstance(surface, Nv12Surface):
        y_off, y_gain, r_v, g_u, g_v, b_u = yuv_coefficients(surface.matrix, surface.full_range)
        row.update(
            src0=surface.y_ptr, src1=surface.uv_ptr, pitch0=surface.y_pitch, pitch1=surface.uv_pitch,
            format=0, uv16=int(surface.uv_ptr % 2 == 0 and surface.uv_pitch % 2 == 0),
            y_mul=y_gain / 255, y_add=-y_off * y_gain / 255, r_v=r_v / 255, g_u=g_u / 255, g_v=g_v / 255,
            b_u=b_u / 255,
        )  # fmt: skip
    else:
        row.update(src0=surface.ptr, src1=0, pitch0=surface.pitch, pitch1=0, uv16=0,
                   format=1 if surface.order == "bgr" else 2,
                   y_mul=0, y_add=0, r_v=0, g_u=0, g_v=0, b_u=0)  # fmt: skip
    return row


def test_frame_params_match_field_by_field() -> None:
    rng = np.random.default_rng(3)
    spec = PreprocessSpec(416, 416)
    geometries = [(1920, 1080), (1280, 720), (768, 576), (641, 479)]
    for _ in range(30):
        surfaces = []
        for _ in range(int(rng.integers(1, 40))):
            w, h = geometries[int(rng.integers(len(geometries)))]
            ptr = int(rng.integers(1 << 20, 1 << 40)) * 2 + int(rng.integers(0, 2))  # odd addresses too
            if rng.random() < 0.7:
                matrix, full = str(rng.choice(["bt601", "bt709"])), bool(rng.random() < 0.5)
                surfaces.append(Nv12Surface.contiguous(ptr, w, h, matrix=matrix, full_range=full))
            else:
                pitch, order = 3 * w + int(rng.integers(0, 64)), str(rng.choice(["bgr", "rgb"]))
                surfaces.append(PackedSurface(ptr, w, h, pitch, order=order))
        out = np.zeros(64, FRAME_DTYPE)
        params, transforms = frame_params(surfaces, spec, out=out)
        assert len(params) == len(surfaces) and np.shares_memory(params, out)
        for k, s in enumerate(surfaces):
            assert transforms[k] == compute_transform(s.width, s.height, spec)[0]
            for field, value in expected(s, spec).items():
                assert params[field][k] == np.asarray(value, FRAME_DTYPE[field]), (k, field)


def test_single_geometry_batch_is_one_broadcast() -> None:
    spec = PreprocessSpec(320, 320)
    surfaces = [Nv12Surface.contiguous((1 << 30) + 4096 * k, 1920, 1080) for k in range(32)]
    params, _ = frame_params(surfaces, spec)
    assert list(params["src0"]) == [s.y_ptr for s in surfaces]
    assert list(params["src1"]) == [s.uv_ptr for s in surfaces]
    for field in ("sx", "sy", "x0", "y0", "rw", "rh", "y_mul", "pitch0", "uv16"):
        assert len(set(params[field].tolist())) == 1, field
