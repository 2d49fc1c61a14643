"""Installed the way users install: build the wheel, install it into a fresh venv, run the demo from there.

The wheel must carry the kernels, the demo config, the bundled model and clip (README: ``pip install .`` then
``streamd run``). It is built as ``pip install .`` builds it: in an isolated build environment holding what
pyproject.toml's ``[build-system]`` asks for, so the test does not depend on the setuptools (or ``wheel``)
of the venv running it (a fresh Python 3.11 venv has setuptools 65 and no ``wheel``). To stay fast, the fresh
venv installs only streamd itself (``--no-deps --no-index``) and borrows the third-party packages of the
interpreter running the tests through a ``.pth`` line (paths in a ``.pth`` are appended after the venv's own
site-packages, and ``.pth`` files inside them, such as an editable streamd's finder, are not run, so the
installed wheel is what gets imported).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import venv
import zipfile
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

IGNORED = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "out", ".whl", ".cache")
PACKAGE_DATA = (
    "streamd/bundled/kernels/preprocess.cu",
    "streamd/bundled/kernels/postprocess.cu",
    "streamd/bundled/configs/demo.yaml",
    "streamd/bundled/models/nanodet-coco.onnx",
    "streamd/bundled/samples/vtest.mp4",
    "streamd/data/result.schema.json",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the source tree (no stale build/ folder can leak into it)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(*IGNORED))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(work),
            ".",
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = work.glob("streamd-*.whl")
    return built


def test_wheel_carries_the_bundled_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in PACKAGE_DATA if name not in names]
    assert not missing, f"not in {wheel.name}: {missing}"
    assert not any(name.startswith("tests/") for name in names)


def test_fresh_venv_runs_the_demo(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*install, str(wheel)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONUNBUFFERED"] = "1"
    probe = (
        "import streamd; from streamd.resources import bundled_path; print(streamd.__file__); "
        "print(bundled_path('kernels', 'preprocess.cu').is_file())"
    )
    where, kernels_found = subprocess.check_output(
        [py, "-c", probe], cwd=tmp_path, env=env, text=True
    ).split()
    assert Path(where).is_relative_to(env_dir), f"streamd imported from {where}, not the new venv"
    assert kernels_found == "True"
    # The demo from the installed wheel, stopped the way an operator would (Ctrl-C) once it has written a
    # hundred lines: tests/test_e2e.py runs the whole demo from the checkout; here the point is the install.
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            [env_dir / "bin" / "streamd", "run", "--no-status"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
        )
    assert proc.stdout is not None
    out = proc.stdout
    try:
        head = [out.readline() for _ in range(100)]
        proc.send_signal(signal.SIGINT)
        # the rest through the same file object (communicate() would read the pipe under what readline
        # had already buffered, and lose it), in a thread so a daemon that does not stop fails the test
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.append(out.read()), daemon=True)
        reader.start()
        reader.join(timeout=120)
        code = proc.wait(timeout=10)
    finally:
        proc.kill()
    err = err_path.read_text()
    assert code == 0, err[-3000:]
    lines = [line for line in "".join(head + rest).splitlines() if line]
    schema = json.loads((ROOT / "streamd" / "data" / "result.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for line in lines:
        validator.validate(json.loads(line))
    frames = [json.loads(line)["frame"] for line in lines]
    assert frames == list(range(len(frames))) and 100 <= len(frames) < 795, len(frames)
