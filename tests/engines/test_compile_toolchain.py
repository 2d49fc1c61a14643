"""engine.compile's host toolchain: a C compiler and Python.h, looked for as Triton looks (its launchers are
C modules built on first use), so a box without them skips the compile at once and `streamd check` says so."""

from __future__ import annotations

import logging
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from streamd.engines import compile_toolchain
from streamd.engines.compile_toolchain import c_compiler, python_include_dir, toolchain_problem


def test_where_it_finds_a_toolchain_that_toolchain_builds_a_python_module(tmp_path: Path) -> None:
    """The lookup is worth something only if what it finds works: build and import a C extension with the
    compiler and include folder it names, the way Triton builds its launchers."""
    if toolchain_problem() is not None:
        pytest.skip(f"this host lacks it: {toolchain_problem()}")
    src = tmp_path / "probe.c"
    src.write_text(
        "#include <Python.h>\n"
        'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "probe", NULL, -1, NULL};\n'
        "PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&m); }\n"
    )
    so = tmp_path / f"probe{sysconfig.get_config_var('EXT_SUFFIX')}"
    cc = c_compiler()
    assert cc is not None
    subprocess.run([cc, str(src), "-O1", "-shared", "-fPIC", f"-I{python_include_dir()}", "-o", str(so)],
                   check=True, timeout=120)  # fmt: skip
    out = subprocess.run([sys.executable, "-c", "import probe; print(probe.__name__)"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert out.stdout.strip() == "probe"


def test_no_compiler_on_the_path_is_named_with_the_fix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no gcc, no clang
    problem = toolchain_problem()
    assert problem is not None and "no C compiler (gcc/clang)" in problem
    assert "apt install gcc python3-dev" in problem and "engine.compile: false" in problem


def test_cc_is_used_as_given_and_a_wrong_one_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    fake = tmp_path / "mycc"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    assert c_compiler() == str(fake)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    problem = toolchain_problem()
    assert problem is not None and "$CC='/nonexistent/cc' is not executable" in problem


def test_missing_python_headers_are_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(compile_toolchain, "python_include_dir", lambda: tmp_path)
    problem = toolchain_problem()
    assert problem is not None and f"no {tmp_path / 'Python.h'} (Python's headers)" in problem
    (tmp_path / "Python.h").write_text("")
    assert toolchain_problem() is None or "Python.h" not in toolchain_problem()


def test_the_engine_skips_the_compile_at_once_without_a_toolchain(torch_ready, models, monkeypatch, caplog):
    """TorchEngine._compile (a GPU engine's start-up step) returns before Dynamo or CUDA is touched: the
    reason is the engine's compile_failure, logged once, and the module is the uncompiled one."""
    import numpy as np

    from streamd.engines.options import EngineOptions
    from streamd.engines.torch import TorchEngine

    engine = TorchEngine(models["dynamic"], EngineOptions(max_batch=2, device="cpu", threads=1))
    module = engine.module
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with caplog.at_level(logging.WARNING, logger="streamd.engines.torch"):
        engine._compile(np.zeros((1, 3, 8, 8), np.float32), 2)
    assert engine.module is module and "no C compiler" in (engine.compile_failure or "")
    assert any("engine.compile skipped: no C compiler" in r.getMessage() for r in caplog.records)


def test_check_warns_only_where_the_torch_engine_would_compile_on_a_gpu(tmp_path: Path, monkeypatch) -> None:
    from streamd.checks.toolchain import compile_warning
    from streamd.config import load_config

    root = Path(__file__).resolve().parents[2]
    model, clip = root / "models" / "nanodet-coco.onnx", root / "samples" / "vtest.mp4"

    def config(engine: str):
        path = tmp_path / "c.yaml"
        path.write_text(f"streams:\n  - id: a\n    url: {clip}\nmodel:\n  path: {model}\nengine:\n{engine}")
        return load_config(path, model_file=False)

    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    torch_gpu = config("  type: torch\n")
    warning = compile_warning(torch_gpu, gpu=True)
    assert warning is not None and warning.startswith("engine.compile: no C compiler")
    assert "runs uncompiled" in warning
    assert compile_warning(torch_gpu, gpu=False) is None  # the CPU torch engine does not compile
    assert compile_warning(config("  type: torch\n  compile: false\n"), gpu=True) is None
    assert compile_warning(config("  type: onnxruntime\n"), gpu=True) is None


def test_auto_compiles_only_where_it_would_take_the_torch_engine(tmp_path: Path, monkeypatch) -> None:
    """engine.type auto takes TensorRT where it is installed and ONNX Runtime where torch is not: the check's
    warning follows the backend auto would take, not the bare key."""
    from streamd.checks.toolchain import compile_warning, torch_would_compile
    from streamd.config import load_config

    root = Path(__file__).resolve().parents[2]
    path = tmp_path / "c.yaml"
    path.write_text(
        f"streams:\n  - id: a\n    url: {root / 'samples' / 'vtest.mp4'}\n"
        f"model:\n  path: {root / 'models' / 'nanodet-coco.onnx'}\nengine:\n  type: auto\n"
    )
    auto = load_config(path, model_file=False)

    def only(*names: str):
        return lambda name: name in names

    assert torch_would_compile(auto, only("torch"))
    assert not torch_would_compile(auto, only("torch", "tensorrt"))  # TensorRT first
    assert not torch_would_compile(auto, only())  # ONNX Runtime
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert compile_warning(auto, gpu=True, importable=only("torch")) is not None
    assert compile_warning(auto, gpu=True, importable=only("torch", "tensorrt")) is None
