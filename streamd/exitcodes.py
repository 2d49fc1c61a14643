"""Exit codes of ``streamd`` (BSD sysexits.h, as systemd and shell scripts understand them) and the one
exception type a start-up failure is raised as, so every entry point ends in one line and a documented code.
"""

from __future__ import annotations

EX_OK = 0
EX_FAILURE = 1  # ran, but something was lost: a stream failed, a sink dropped output, a worker kept dying
EX_UNAVAILABLE = 69  # a needed service or device is unavailable (no GPU, CUDA/NVDEC init, engine build)
EX_SOFTWARE = 70  # internal error (a bug): the message says where
EX_CANTCREAT = 73  # cannot create or write an output (sink file, cache dir)
EX_CONFIG = 78  # the config is invalid or does not fit the model


class StartupError(Exception):
    """A failure before the pipeline runs: ``str(exc)`` is the one line to print, ``code`` the exit code."""

    def __init__(self, message: str, code: int = EX_UNAVAILABLE) -> None:
        super().__init__(message)
        self.code = code
