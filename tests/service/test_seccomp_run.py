"""tools/seccomp_run.py: the unit's system-call filter and device list applied without systemd, for real
(libseccomp loaded into real processes)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import CLIP_HEVC, ROOT

TOOL = ROOT / "tools" / "seccomp_run.py"
UNIT = ROOT / "systemd" / "streamd.service"
SIGSYS_EXIT = 128 + 31


def libseccomp_missing() -> bool:
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return True
    return False


pytestmark = pytest.mark.skipif(libseccomp_missing(), reason="libseccomp.so.2 not installed (libseccomp2)")
needs_systemd = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (makes the allow list)"
)


def seccomp_run(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def python(code: str) -> list[str]:
    return ["--", sys.executable, "-c", textwrap.dedent(code)]


@needs_systemd
def test_allow_list_is_in_sync_with_the_unit() -> None:
    proc = seccomp_run("--check-allow")
    assert proc.returncode == 0, proc.stderr


def test_allow_list_made_from_other_filter_lines_is_refused(tmp_path) -> None:
    unit = tmp_path / "streamd.service"
    unit.write_text(
        UNIT.read_text().replace("SystemCallFilter=@system-service", "SystemCallFilter=@basic-io")
    )
    proc = seccomp_run("--unit", str(unit), *python("pass"))
    assert proc.returncode == 2
    assert "other SystemCallFilter= lines" in proc.stderr


def streamd_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "clip.yaml"
    cfg.write_text(
        f"streams:\n  - id: clip\n    url: {CLIP_HEVC}\n"
        f"sinks:\n  - type: jsonl\n    path: {tmp_path / 'out.jsonl'}\n"
    )
    return cfg


def test_streamd_runs_to_the_end_under_the_strict_filter(tmp_path, assets) -> None:
    """Kill-process for any call off the list: a run that ends with every line made none."""
    cfg = streamd_config(tmp_path)
    command = ["--", sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"]
    proc = seccomp_run("--report", str(tmp_path / "r.json"), *command)
    report = json.loads((tmp_path / "r.json").read_text())
    print(f"strict: exit {report['exit_code']} in {report['seconds']} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["mode"] == "kill" and report["killed"] == []
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 100  # every frame of the clip


def test_a_shared_engine_runs_under_the_strict_filter(tmp_path, assets) -> None:
    """engine.shared: the engine process's abstract Unix socket, the workers' shared-memory rows, under the
    unit's filter (kill mode): every line of both streams, nothing killed."""
    cfg = tmp_path / "shared.yaml"
    cfg.write_text(
        f"streams:\n  - id: a\n    url: {CLIP_HEVC}\n  - id: b\n    url: {CLIP_HEVC}\n"
        "engine:\n  type: onnxruntime\n  shared: true\n"
        "pipeline:\n  workers: 2\n  spare_worker: false\n"
        f"sinks:\n  - type: jsonl\n    path: {tmp_path / 'out.jsonl'}\n"
    )
    command = ["--", sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"]
    proc = seccomp_run("--report", str(tmp_path / "r.json"), *command)
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["mode"] == "kill" and report["killed"] == []
    assert "serving batches" in proc.stderr, proc.stderr[-3000:]
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 200  # every frame of both streams


def test_streamd_is_denied_nothing_and_opens_only_allowed_devices(tmp_path, assets) -> None:
    cfg = streamd_config(tmp_path)
    command = ["--", sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"]
    proc = seccomp_run("--errno", "--check-devices", "--report", str(tmp_path / "r.json"), *command)
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["denied"] == []
    assert report["devices"], "the scan saw no device at all (streamd opens /dev/null)"
    assert all(d["covered_by"] for d in report["devices"]), report["devices"]
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 100


# engine.compile's host side, as the GPU path runs it, minus CUDA: Inductor's compile-worker pool (the one
# AsyncCompile makes: a Python subprocess that forks workers) runs the C compiler on a CPython extension
# module, as Triton builds each kernel's launcher with gcc and Python.h, and the parent imports it; then
# Inductor compiles a small convolution model on the CPU (its C++ kernels through gcc). The compiled GPU
# start under the filter, Triton and CUDA included, is tools/gpu_session.sh service (SANDBOX_COMPILE).
LAUNCHER_C = r"""
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "launcher", NULL, -1, methods};
PyMODINIT_FUNC PyInit_launcher(void) { return PyModule_Create(&module); }
"""
COMPILE = """
    import importlib.util, subprocess, sys, sysconfig
    from pathlib import Path
    import torch
    from torch._inductor.async_compile import AsyncCompile
    from streamd.engines.compile_toolchain import c_compiler, python_include_dir

    work = Path(sys.argv[1])
    so = work / ("launcher" + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = [c_compiler(), str(work / "launcher.c"), "-O3", "-shared", "-fPIC", "-o", str(so),
          f"-I{python_include_dir()}"]
    pool = AsyncCompile.process_pool()
    pool.submit(subprocess.check_call, cc).result(timeout=120)
    spec = importlib.util.spec_from_file_location("launcher", so)
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    print("launcher", launcher.add(2, 3), flush=True)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        diff = (torch.compile(model, dynamic=False)(x) - model(x)).abs().max().item()
    print("inductor", diff < 1e-4, flush=True)
"""


def test_engine_compiles_host_side_runs_under_the_strict_filter(tmp_path) -> None:
    """Kill mode: the compile-worker pool, the C compiler from it, the import of what it built, and
    Inductor's own compile make no call off the unit's list (a call off it ends the run with SIGSYS)."""
    pytest.importorskip("torch")
    from streamd.engines.compile_toolchain import toolchain_problem

    if problem := toolchain_problem():
        pytest.skip(problem)
    (tmp_path / "launcher.c").write_text(LAUNCHER_C)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # nothing from a cache
           "TORCHINDUCTOR_COMPILE_THREADS": "2", "PYTHONPATH": str(ROOT)}  # fmt: skip
    proc = seccomp_run("--report", str(tmp_path / "r.json"), *python(COMPILE), str(tmp_path), env=env)
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["mode"] == "kill" and report["killed"] == []
    assert proc.stdout.split() == ["launcher", "5", "inductor", "True"], proc.stdout
    assert list((tmp_path / "inductor").rglob("*.so")), "Inductor compiled nothing (a cache hit?)"


FORBIDDEN = """
    import ctypes, os, socket
    libc = ctypes.CDLL(None, use_errno=True)
    libc.swapoff(b"/nonexistent-seccomp-run-test")  # @swap: not in @system-service
    print("swapoff", ctypes.get_errno(), flush=True)
    try:
        os.setuid(os.getuid())  # @setuid: in @system-service, removed by ~@privileged
        print("setuid 0", flush=True)
    except OSError as e:
        print("setuid", e.errno, flush=True)
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM)  # not in RestrictAddressFamilies=
        print("socket 0", flush=True)
    except OSError as e:
        print("socket", e.errno, flush=True)
"""


def test_a_call_off_the_list_kills_the_process(tmp_path) -> None:
    proc = seccomp_run("--report", str(tmp_path / "r.json"), *python(FORBIDDEN))
    assert proc.returncode == SIGSYS_EXIT, proc.stderr
    assert "swapoff" not in proc.stdout  # killed at the call, before printing
    assert "killed by SIGSYS" in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    if os.access("/dev/kmsg", os.R_OK):  # the kernel's audit record names the call
        assert [k["syscall"] for k in report["killed"]] == ["swapoff"], report


def test_errno_mode_fails_calls_off_the_list_with_eperm_and_names_them(tmp_path) -> None:
    proc = seccomp_run("--errno", "--report", str(tmp_path / "r.json"), *python(FORBIDDEN))
    eperm = 1
    assert proc.stdout.split("\n")[:3] == [f"swapoff {eperm}", f"setuid {eperm}", f"socket {eperm}"], (
        proc.stdout
    )
    assert proc.returncode == 1  # the command succeeded, but calls were denied
    denied = {d["syscall"] for d in json.loads((tmp_path / "r.json").read_text())["denied"]}
    assert denied == {"swapoff", "setuid", "socket"}


@needs_systemd
def test_the_old_filter_kills_streamd_check_and_the_shipped_one_does_not(tmp_path, assets) -> None:
    """The filter the unit had before (~@privileged @resources without giving anything back) killed
    `streamd check` at `import numpy` (mbind): the tool must see that, and not with the shipped filter."""
    old = tmp_path / "old.service"
    text = UNIT.read_text().split("\n")
    text = [line for line in text if not line.startswith("SystemCallFilter=@chown")]
    old.write_text("\n".join(text))
    assert (
        seccomp_run(
            "--unit", str(old), "--allow-file", str(tmp_path / "old.allow"), "--write-allow"
        ).returncode
        == 0
    )
    cfg = streamd_config(tmp_path)
    check = ["--", sys.executable, "-m", "streamd", "check", str(cfg)]
    proc = seccomp_run("--unit", str(old), "--allow-file", str(tmp_path / "old.allow"), *check)
    assert proc.returncode == SIGSYS_EXIT, proc.stderr
    proc = seccomp_run(*check)
    assert proc.returncode == 0, proc.stderr


def test_device_check_reports_a_device_the_unit_does_not_allow(tmp_path) -> None:
    node = tmp_path / "kmsg-like"
    try:
        os.mknod(node, 0o600 | 0o020000, os.makedev(1, 11))  # a character device, /dev/kmsg's numbers
        os.close(os.open(node, os.O_RDONLY))
    except OSError as exc:
        pytest.skip(f"cannot make and open a device node here: {exc}")
    code = f"""
        import os, time
        a, b = os.open("/dev/null", os.O_RDWR), os.open({str(node)!r}, os.O_RDONLY)
        time.sleep(1.5)
    """
    proc = seccomp_run("--check-devices", "--report", str(tmp_path / "r.json"), *python(code))
    assert proc.returncode == 1, proc.stderr
    devices = {d["path"]: d for d in json.loads((tmp_path / "r.json").read_text())["devices"]}
    assert devices[str(node)]["covered_by"] is None
    assert (devices[str(node)]["major"], devices[str(node)]["minor"]) == (1, 11)
    assert devices["/dev/null"]["covered_by"] == "DevicePolicy=closed"
    assert devices["/dev/null"]["access"] == "rw"
    assert "NOT ALLOWED" in proc.stderr
