"""Kernel loader: NVRTC compile of ``kernels/*.cu`` for the device's compute capability, with a disk cache.

The cache key is the SHA-256 of the source, the target arch, the compile options and the NVRTC version, so a
restart loads the cubin without compiling, and any change to one of them compiles again. Cache files are
written atomically (temp file + rename); a corrupt or unreadable entry is recompiled. Compile errors raise
:class:`KernelCompileError` with NVRTC's log. :func:`compile_source` needs no GPU (CI uses it).

Kernels are ``extern "C"`` functions, launched with :meth:`Kernel.launch` on an explicit stream.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamd.exitcodes import EX_SOFTWARE, EX_UNAVAILABLE, StartupError
from streamd.gpu.cuda import Context, CUDAError, Stream, _quiet, check, driver
from streamd.resources import bundled_path, default_cache_dir

KERNEL_DIR = bundled_path("kernels")
BASE_OPTIONS = ("-std=c++17",)
_nvrtc_mod: Any = None


def nvrtc() -> Any:
    """``cuda.bindings.nvrtc``, imported on first use."""
    global _nvrtc_mod
    if _nvrtc_mod is None:
        try:
            from cuda.bindings import nvrtc as mod
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise KernelCompileError("cuda.bindings is not installed (pip install cuda-bindings)") from exc
        _nvrtc_mod = mod
    return _nvrtc_mod


class KernelCompileError(StartupError, RuntimeError):
    """A kernel could not be compiled or loaded. One line: the message and NVRTC's first error line; ``log``
    is NVRTC's whole program log. ``code``: ``EX_SOFTWARE`` when the source does not compile (a bug in
    kernels/), ``EX_UNAVAILABLE`` (default) when NVRTC, cuda-bindings or the source file is missing."""

    def __init__(self, message: str, log: str = "", code: int = EX_UNAVAILABLE) -> None:
        self.log = log
        errors = [line.strip() for line in log.splitlines() if "error" in line]
        super().__init__(f"{message}: {errors[0]}" if errors else message, code)


def _nvrtc_check(result: Any, call: str) -> Any:
    mod = nvrtc()
    err, outs = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err != mod.nvrtcResult.NVRTC_SUCCESS:
        _, text = mod.nvrtcGetErrorString(err)
        raise KernelCompileError(f"{call} failed: {text.decode() if isinstance(text, bytes) else text}")
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else outs


def nvrtc_version() -> tuple[int, int]:
    major, minor = _nvrtc_check(nvrtc().nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


def supported_archs() -> list[int]:
    """Compute capabilities (e.g. 90) this NVRTC can emit cubins for."""
    return [int(a) for a in _nvrtc_check(nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")]


def include_dirs() -> list[str]:
    """Folders holding the CUDA headers the kernels include (``cuda_fp16.h``): the ``nvidia-cuda-runtime``
    wheel via cuda.pathfinder, else ``$CUDA_HOME/include`` or ``/usr/local/cuda/include``."""
    dirs: list[str] = []
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
        if found:
            dirs.append(str(found))
    except Exception:
        pass
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "include" / "cuda_fp16.h").is_file():
            dirs.append(str(Path(base) / "include"))
    return list(dict.fromkeys(dirs))


def compile_source(
    source: str, arch: int, *, name: str = "kernel.cu", options: Sequence[str] = (), ptx: bool = False
) -> bytes:
    """Compile CUDA C++ ``source`` with NVRTC to a cubin for ``sm_<arch>`` (or PTX for ``compute_<arch>``)."""
    mod = nvrtc()
    prog = _nvrtc_check(
        mod.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram"
    )
    try:
        target = f"--gpu-architecture={'compute' if ptx else 'sm'}_{arch}"
        opts = [target, *BASE_OPTIONS, *(f"-I{d}" for d in include_dirs()), *options]
        err = mod.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])[0]
        log = _program_log(prog)
        if err != mod.nvrtcResult.NVRTC_SUCCESS:
            raise KernelCompileError(
                f"NVRTC could not compile {name} for {target} ({' '.join(opts)})", log, EX_SOFTWARE
            )
        if ptx:
            size = _nvrtc_check(mod.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            buf = b" " * size
            _nvrtc_check(mod.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
        else:
            size = _nvrtc_check(mod.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            buf = b" " * size
            _nvrtc_check(mod.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        return bytes(buf)
    finally:
        mod.nvrtcDestroyProgram(prog)


def _program_log(prog: Any) -> str:
    mod = nvrtc()
    size = _nvrtc_check(mod.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    if size <= 1:
        return ""
    buf = b" " * size
    _nvrtc_check(mod.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return buf.rstrip(b"\0 ").decode(errors="replace")


def cache_key(source: str, target: str, options: Sequence[str]) -> str:
    """Hex digest over source, target (``sm_90`` / ``compute_90``), options and NVRTC version."""
    h = hashlib.sha256()
    for part in (source, target, "\0".join(options), "nvrtc {}.{}".format(*nvrtc_version())):
        h.update(part.encode())
        h.update(b"\0\1")
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class LoadInfo:
    """How one module was obtained: ``"cache"`` or ``"compiled"``, seconds spent, the cache file."""

    source: str
    how: str
    seconds: float
    path: Path | None


class PackedArgs:
    """Kernel arguments packed once: the ctypes values and the array of their addresses the driver reads.
    For launches repeated with the same arguments (a pipeline slot's buffers), so a launch builds no ctypes
    objects; the values must not change while a launch that uses them is being enqueued."""

    __slots__ = ("address", "args", "ptrs")

    def __init__(self, args: Sequence[Any]) -> None:
        self.args = tuple(args)  # keeps the values alive as long as their addresses are used
        self.ptrs = (ctypes.c_void_p * len(self.args))(*(ctypes.addressof(a) for a in self.args))
        self.address = ctypes.addressof(self.ptrs)


class Kernel:
    """One ``extern "C"`` function of a loaded module."""

    def __init__(self, module: Module, name: str) -> None:
        self.module = module  # keeps the module loaded
        self.name = name
        self._call = f"cuLaunchKernel({name})"
        self.raw = check(
            driver().cuModuleGetFunction(module.raw, name.encode()), f"cuModuleGetFunction({name})"
        )

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow more than 48 KiB of dynamic shared memory per block (opt-in on Volta and newer)."""
        drv = driver()
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(drv.cuFuncSetAttribute(self.raw, attr, int(nbytes)), f"cuFuncSetAttribute({self.name})")

    def launch(
        self,
        stream: Stream,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[Any] | PackedArgs,
        shared: int = 0,
    ) -> None:
        """Enqueue the kernel on ``stream``. ``args`` are ctypes values (``c_uint64`` for pointers,
        ``c_int``, ``c_float``, ctypes structures) in the kernel's parameter order, or those packed once."""
        packed = args if isinstance(args, PackedArgs) else PackedArgs(args)
        check(
            driver().cuLaunchKernel(self.raw, *grid, *block, int(shared), stream.raw, packed.address, 0),
            self._call,
        )


class Module:
    """A loaded cubin/PTX image; ``kernel(name)`` looks functions up (cached)."""

    def __init__(self, image: bytes, info: LoadInfo) -> None:
        drv = driver()
        self.info = info
        self._image = ctypes.create_string_buffer(image, len(image))  # stable address for the driver
        self.raw = check(
            drv.cuModuleLoadData(ctypes.addressof(self._image)), f"cuModuleLoadData({info.source})"
        )
        self._finalizer = weakref.finalize(self, _quiet, drv.cuModuleUnload, self.raw)
        self._kernels: dict[str, Kernel] = {}

    def kernel(self, name: str) -> Kernel:
        if name not in self._kernels:
            self._kernels[name] = Kernel(self, name)
        return self._kernels[name]

    def close(self) -> None:
        self._kernels.clear()
        self._finalizer()


class KernelLoader:
    """Compiles and loads ``<kernel_dir>/<name>.cu`` for ``ctx``'s device, through the on-disk cubin cache.

    If this NVRTC cannot emit machine code for the device (a newer GPU than the NVRTC), it emits PTX for the
    newest arch it knows and the driver compiles it at load.
    """

    def __init__(
        self,
        ctx: Context,
        *,
        kernel_dir: Path | str | None = None,
        cache_dir: Path | str | None = None,
        options: Sequence[str] = (),
    ) -> None:
        self.ctx = ctx
        self.kernel_dir = Path(kernel_dir) if kernel_dir else KERNEL_DIR
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir() / "kernels"
        self.options = tuple(options)
        major, minor = ctx.compute_capability
        self.arch = major * 10 + minor
        self._modules: dict[str, Module] = {}

    def target(self) -> tuple[int, bool]:
        """(arch, ptx): the cubin arch, or the newest PTX arch if NVRTC has no cubin target for the device."""
        archs = supported_archs()
        if self.arch in archs:
            return self.arch, False
        older = [a for a in archs if a <= self.arch]
        if not older:
            raise KernelCompileError(
                f"NVRTC {nvrtc_version()} supports {archs}, none usable for sm_{self.arch}"
            )
        return max(older), True

    def module(self, name: str) -> Module:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def kernel(self, module: str, name: str) -> Kernel:
        return self.module(module).kernel(name)

    def _load(self, name: str) -> Module:
        t0 = time.perf_counter()
        src_path = self.kernel_dir / f"{name}.cu"
        try:
            source = src_path.read_text()
        except OSError as exc:
            raise KernelCompileError(f"kernel source {src_path} cannot be read: {exc}") from exc
        arch, ptx = self.target()
        target = f"{'compute' if ptx else 'sm'}_{arch}"
        key = cache_key(source, target, self.options)
        path = self.cache_dir / f"{name}-{target}-{key[:24]}.{'ptx' if ptx else 'cubin'}"
        image = _read_cache(path)
        if image is not None and (ptx or image.startswith(b"\x7fELF")):
            try:
                return Module(image, LoadInfo(name, "cache", time.perf_counter() - t0, path))
            except CUDAError:
                pass  # corrupt entry: compile again and overwrite it
        image = compile_source(source, arch, name=src_path.name, options=self.options, ptx=ptx)
        if ptx:
            image = image.rstrip(b"\0") + b"\0"
        _write_cache(path, image)
        return Module(image, LoadInfo(name, "compiled", time.perf_counter() - t0, path))

    def close(self) -> None:
        for m in self._modules.values():
            m.close()
        self._modules.clear()


def _read_cache(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data or None


def _write_cache(path: Path, data: bytes) -> None:
    """Atomic write; a read-only or full disk only costs a recompile next time."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
