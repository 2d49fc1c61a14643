"""What ``engine.compile`` needs on the host besides torch: a C compiler and Python's headers.

Inductor's GPU kernels are Triton kernels, and Triton builds a small C module (its CUDA driver utilities and
each kernel's launcher) with the host's C compiler the first time it runs, including ``Python.h``. On a box
without them (a minimal Debian/Ubuntu install, a slim container image) the compile fails only after Dynamo's
trace, seconds to minutes in, with "Failed to find C compiler" or "Python.h: No such file or directory".
``toolchain_problem`` looks the way Triton looks (``$CC``, else ``gcc``, else ``clang`` on ``PATH``;
``Python.h`` in the interpreter's include folder, Debian's ``posix_local`` scheme read as
``posix_prefix``), so the engine can skip the compile at once and ``streamd check`` can say so before a
start. No torch or CUDA import here: the check stays quick.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

FIX = "Debian/Ubuntu: apt install gcc python3-dev; or set engine.compile: false"


def c_compiler() -> str | None:
    """The compiler Triton would run: ``$CC`` as given, else ``gcc``, else ``clang``; None when none."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or (cc if os.path.isfile(cc) and os.access(cc, os.X_OK) else None)
    return shutil.which("gcc") or shutil.which("clang")


def python_include_dir() -> Path:
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":  # Debian's: its include folder is posix_prefix's, as Triton reads it
        scheme = "posix_prefix"
    return Path(sysconfig.get_paths(scheme=scheme)["include"])


def toolchain_problem() -> str | None:
    """Why Triton could not build its modules on this host (one phrase, with the fix), or None."""
    missing = []
    if c_compiler() is None:
        cc = os.environ.get("CC")
        missing.append(f"no C compiler ($CC={cc!r} is not executable)" if cc else "no C compiler (gcc/clang)")
    header = python_include_dir() / "Python.h"
    if not header.is_file():
        missing.append(f"no {header} (Python's headers)")
    if not missing:
        return None
    return f"{' and '.join(missing)}: Triton builds its kernels' launchers with them ({FIX})"
