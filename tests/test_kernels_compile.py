"""Every kernel compiles with NVRTC for sm_75, sm_87 and sm_90, without a GPU (CPU CI).

Needs ``cuda-bindings`` + ``nvidia-cuda-nvrtc`` + ``nvidia-cuda-runtime`` (headers) from PyPI; skipped with
the reason when they are missing. Also checks the cache key, the compile-error log, and that the host-side
parameter layouts match the kernels' structs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamd.gpu.kernels import KERNEL_DIR

KERNELS = sorted(KERNEL_DIR.glob("*.cu"))
ARCHS = (75, 87, 90)


def _nvrtc_or_skip() -> None:
    try:
        from streamd.gpu.kernels import nvrtc_version

        nvrtc_version()
    except Exception as exc:
        pytest.skip(
            f"NVRTC unavailable (pip install cuda-bindings nvidia-cuda-nvrtc nvidia-cuda-runtime): {exc}"
        )


def test_kernels_found() -> None:
    assert {p.name for p in KERNELS} >= {"preprocess.cu", "postprocess.cu"}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", KERNELS, ids=[p.name for p in KERNELS])
def test_kernel_compiles(path: Path, arch: int) -> None:
    _nvrtc_or_skip()
    from streamd.gpu.kernels import compile_source

    cubin = compile_source(path.read_text(), arch, name=path.name)
    assert cubin[:4] == b"\x7fELF", "NVRTC did not return a cubin (ELF)"
    names = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\)\s+)?(\w+)\(", path.read_text()))
    assert names
    for name in names - {"__launch_bounds__"}:  # that one: the decode kernels' macro (checked below)
        assert name.encode() in cubin, f"{name} missing from the {path.name} cubin"


def test_decode_kernels_all_present() -> None:
    _nvrtc_or_skip()
    from streamd.gpu.kernels import compile_source
    from streamd.stages.postprocess.cuda import LAYOUT_IDS

    cubin = compile_source((KERNEL_DIR / "postprocess.cu").read_text(), 90, name="postprocess.cu")
    for layout in LAYOUT_IDS:
        for dt in ("f32", "f16"):
            assert f"decode_{layout}_{dt}".encode() in cubin


def test_compile_error_carries_the_log() -> None:
    _nvrtc_or_skip()
    from streamd.gpu.kernels import KernelCompileError, compile_source

    with pytest.raises(KernelCompileError, match="no_such_identifier") as info:
        compile_source('extern "C" __global__ void k(int* p) { *p = no_such_identifier; }', 90, name="bad.cu")
    assert "bad.cu" in info.value.log and "sm_90" in str(info.value)
    assert "\n" not in str(info.value) and info.value.code == 70  # one line; a bug in the kernel source


def test_start_up_failures_of_the_cuda_layer_carry_exit_codes(tmp_path) -> None:
    """Missing kernels or no CUDA are 69 (unavailable); both are StartupErrors, so the worker exits with one
    line and that code instead of a traceback."""
    from streamd.exitcodes import StartupError
    from streamd.gpu.cuda import CUDAError
    from streamd.gpu.kernels import KernelCompileError

    missing = KernelCompileError(f"kernel source {tmp_path / 'x.cu'} cannot be read: no such file")
    cuda = CUDAError("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected", "cuInit")
    for exc in (missing, cuda):
        assert isinstance(exc, StartupError) and isinstance(exc, RuntimeError) and exc.code == 69
    assert str(cuda) == "CUDA_ERROR_NO_DEVICE in cuInit: no CUDA-capable device is detected"


def test_cache_key_changes_with_inputs() -> None:
    _nvrtc_or_skip()
    from streamd.gpu.kernels import cache_key

    base = cache_key("src", "sm_90", ())
    assert base == cache_key("src", "sm_90", ())
    assert (
        len(
            {
                base,
                cache_key("src2", "sm_90", ()),
                cache_key("src", "sm_87", ()),
                cache_key("src", "sm_90", ("-G",)),
            }
        )
        == 4
    )


def test_host_structs_match_kernel_structs() -> None:
    """FRAME_DTYPE / Normalise mirror the C structs: same field names, order and sizes (no GPU needed)."""
    import ctypes

    from streamd.stages.preprocess.cuda import FRAME_DTYPE, Normalise

    src = (KERNEL_DIR / "preprocess.cu").read_text()
    body = re.search(r"struct FrameParams \{(.*?)\n\};", src, re.S).group(1)  # type: ignore[union-attr]
    sizes = {"unsigned long long": 8, "double": 8, "int": 4, "float": 4}
    fields = []
    for line in body.splitlines():
        m = re.match(r"\s*(unsigned long long|double|int|float) ([\w, ]+);", line)
        if m:
            fields += [(n.strip(), sizes[m.group(1)]) for n in m.group(2).split(",")]
    assert [(n, FRAME_DTYPE[n].itemsize) for n in FRAME_DTYPE.names] == fields
    assert FRAME_DTYPE.itemsize == sum(s for _, s in fields) == 96
    assert ctypes.sizeof(Normalise) == 48


def test_import_streamd_gpu_needs_no_cuda() -> None:
    import subprocess
    import sys

    code = (
        "import sys, streamd.gpu, streamd.stages.preprocess.cuda, streamd.stages.postprocess.cuda;"
        "print('cuda.bindings' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
