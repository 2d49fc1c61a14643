"""Where streamd's own files are: those bundled with it (the CUDA kernels, the demo config, the COCO model and
the sample clip; read-only) and the cache it writes (``default_cache_dir``).

They live in the repository's top-level ``kernels/``, ``configs/``, ``models/`` and ``samples/`` folders;
``streamd/bundled/`` links to those folders, so the same files are package data inside the wheel
(``pip install .``) and the checkout's own files in an editable install or a plain ``PYTHONPATH`` run. Every
lookup goes through ``importlib.resources``, never through the checkout's layout.
"""

from __future__ import annotations

import os
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


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/streamd`` or ``~/.cache/streamd``: built engines, verdicts, cubins (the default of
    ``engine.cache_dir``; each user of it writes into its own subfolder)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "streamd"
