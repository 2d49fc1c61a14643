"""``systemctl reload`` that can fail: the reload's outcome travels back to the command that asked for it.

systemd 252 (Debian 12) has no ``Type=notify-reload``; ``ExecReload=/bin/kill -HUP $MAINPID`` always
succeeds, so a refused config was visible only in the journal. Instead the unit runs ``streamd reload
--pid $MAINPID``: it reads the daemon's reload outcome file, sends SIGHUP, waits for the outcome's
generation to move on and exits 0 (applied) or 1 (refused, with the daemon's reasons on stderr, which
``systemctl reload`` and the journal show).

The outcome file lives in the service's runtime directory (``$RUNTIME_DIRECTORY``, set by systemd for
``RuntimeDirectory=`` and seen by the daemon and by ``ExecReload`` alike), or ``$STREAMD_RUNTIME_DIR``.
Without either the daemon writes nothing and ``streamd reload`` only signals.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

OUTCOME_FILE = "reload.json"


@dataclass(frozen=True)
class ReloadOutcome:
    generation: int  # 0: the daemon started (baseline); each SIGHUP handled adds one
    ok: bool
    message: str  # one line: what was applied, or why it was refused
    pid: int
    time: float


def runtime_dir() -> Path | None:
    """Where the outcome file lives (the first of ``$RUNTIME_DIRECTORY``'s colon-separated folders)."""
    raw = os.environ.get("RUNTIME_DIRECTORY") or os.environ.get("STREAMD_RUNTIME_DIR")
    return Path(raw.split(":", 1)[0]) if raw else None


def write_outcome(generation: int, ok: bool, message: str) -> None:
    """Written atomically (rename) so a reader never sees half a file; never raises."""
    folder = runtime_dir()
    if folder is None:
        return
    outcome = ReloadOutcome(generation, ok, message, os.getpid(), time.time())
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".reload.")
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(outcome), f)
        os.replace(tmp, folder / OUTCOME_FILE)
    except OSError:
        pass


def read_outcome(folder: Path) -> ReloadOutcome | None:
    try:
        raw = json.loads((folder / OUTCOME_FILE).read_text())
        return ReloadOutcome(**raw)
    except (OSError, ValueError, TypeError):
        return None


def request_reload(pid: int, timeout: float = 60.0) -> int:
    """SIGHUP ``pid`` and wait for its outcome: 0 applied, 1 refused or no answer in ``timeout``."""
    folder = runtime_dir()
    before = read_outcome(folder) if folder is not None else None
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        print(f"streamd reload: cannot signal pid {pid}: {exc.strerror}", file=sys.stderr)
        return 1
    if folder is None or before is None or before.pid != pid:
        # No outcome file to watch (not under systemd's RuntimeDirectory, or the daemon is still starting):
        # the signal is sent; the journal says what happened.
        print("streamd reload: SIGHUP sent (no reload outcome to wait for)", file=sys.stderr)
        return 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = read_outcome(folder)
        if now is not None and now.pid == pid and now.generation > before.generation:
            print(f"streamd reload: {now.message}", file=sys.stderr)
            return 0 if now.ok else 1
        time.sleep(0.1)
    print(f"streamd reload: no answer from pid {pid} in {timeout:.0f} s", file=sys.stderr)
    return 1
