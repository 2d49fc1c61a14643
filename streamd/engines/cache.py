"""Where built engines live and how they are named: cache keys, atomic writes.

A built TensorRT plan only runs with the TensorRT version, GPU architecture and platform that built it, and it
bakes in the ONNX file, the precision recipe, the shape profile and the builder options. ``CacheKey`` holds
all of them; the file name carries a digest of the whole key, and a JSON sidecar holds the key itself so
``ls`` and a text editor say what a plan is. Writes go to a temporary file in the same folder, are fsynced and
renamed into place, so a crash or a second process never leaves a half-written plan under the final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamd.resources import default_cache_dir

CACHE_FORMAT = 1  # bump when the key's meaning changes


def engines_dir(cache_dir: Path | str | None) -> Path:
    """The folder for built engines: ``<cache_dir>/engines`` (default ``~/.cache/streamd/engines``)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "engines"


def platform_tag() -> str:
    return f"{sys.platform}-{platform.machine()}"


@dataclass(frozen=True)
class CacheKey:
    """Everything a built engine depends on. ``fields`` is JSON-serialisable; order does not matter."""

    fields: dict[str, Any]

    def canonical(self) -> str:
        return json.dumps({"format": CACHE_FORMAT, **self.fields}, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def file_stem(self, model_path: Path, label: str) -> str:
        """``<model stem>.<label>.<digest16>``, e.g. ``nanodet-coco.trt10.16-fp16-b64.3f2a...``."""
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{model_path.stem}.{label}")
        return f"{safe}.{self.digest()[:16]}"


def atomic_write(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def write_sidecar(path: Path, key: CacheKey, extra: dict[str, Any] | None = None) -> None:
    """The human-readable key next to a cached file (``<file>.json``)."""
    body = {"key": {"format": CACHE_FORMAT, **key.fields}, "digest": key.digest(), **(extra or {})}
    atomic_write(
        path.with_name(path.name + ".json"), (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()
    )


def discard(path: Path) -> None:
    """Remove a cached file and its sidecar (a corrupt or stale entry); missing files are fine."""
    for p in (path, path.with_name(path.name + ".json")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
