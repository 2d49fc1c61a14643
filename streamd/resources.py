"""Files bundled with streamd: the CUDA kernels, the demo config, the COCO model and the sample clip.

They live in the repository's top-level ``kernels/``, ``configs/``, ``models/`` and ``samples/`` folders;
``streamd/bundled/`` links to those folders, so the same files are package data inside the wheel
(``pip install .``) and the checkout's own files in an editable install or a plain ``PYTHONPATH`` run. Every
lookup goes through ``importlib.resources``, never through the checkout's layout.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

BUNDLED_FOLDERS = ("kernels", "configs", "models", "samples")


def bundled_path(*parts: str) -> Path:
    """The path of a bundled file or folder, e.g. ``bundled_path("configs", "demo.yaml")``.

    A real filesystem path (NVRTC, ONNX Runtime and relative paths in the demo config need one): streamd is
    installed as plain files, never imported from a zip.
    """
    if not parts or parts[0] not in BUNDLED_FOLDERS:
        raise ValueError(f"bundled files are under one of {BUNDLED_FOLDERS}, got {'/'.join(parts)!r}")
    resource = files("streamd").joinpath("bundled", *parts)
    return Path(str(resource))
