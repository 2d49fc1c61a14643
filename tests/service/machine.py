"""A real systemd for tests: PID 1 of its own PID and mount namespaces on this machine.

/etc, /opt and /var are overlays over the host's (what the test installs lands in a tmpfs that disappears
with the namespace; the host keeps its users, units and files), /tmp, /run, /var/tmp and /var/log are fresh
tmpfs (systemd's boot-time clean-up would otherwise empty the host's /tmp). The checkout under test is
bound at ``CHECKOUT`` first, so it stays reachable wherever it lies (a CI clone under /tmp would be hidden).
Commands run inside through nsenter; files inside are read from the host through /proc/PID/root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

SYSTEMD = Path("/lib/systemd/systemd")
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--mount", "--propagation", "private"]

CHECKOUT = "/opt/streamd-checkout"  # where the checkout under test appears inside (in the /opt overlay)

# Runs as "sh -c SCRIPT STAGE CHECKOUT_ON_HOST" inside the new namespaces, then becomes systemd.
_BOOT = r"""
set -e
stage=$0
src=$1
mount -t tmpfs -o mode=0700 tmpfs "$stage"
for d in etc opt var; do
    mkdir -p "$stage/$d/up" "$stage/$d/work"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$stage/$d/up,workdir=$stage/$d/work" "/$d"
done
mkdir -p /opt/streamd-checkout && mount --bind "$src" /opt/streamd-checkout
for d in /tmp /run /var/tmp /var/log; do mount -t tmpfs tmpfs "$d"; done
# no timers (apt, logrotate, man-db) firing mid-test; basic.target: none of the host's daemons (mosquitto...)
ln -sf /dev/null /etc/systemd/system/timers.target
exec /lib/systemd/systemd --system --unit=basic.target
"""


def unavailable() -> str | None:
    """Why a private systemd cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root: new PID/mount namespaces, mounts and a systemd as PID 1"
    if not SYSTEMD.exists() or shutil.which("nsenter") is None or shutil.which("unshare") is None:
        return "needs systemd (/lib/systemd/systemd) and util-linux's unshare and nsenter"
    probe = (
        "d=$(mktemp -d) && mount -t tmpfs tmpfs $d && mkdir $d/u $d/w $d/m && "
        "mount -t overlay overlay -o lowerdir=/etc,upperdir=$d/u,workdir=$d/w $d/m"
    )
    proc = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        return f"new namespaces or overlay mounts are not permitted here: {proc.stderr.strip()[-300:]}"
    return None


class PrivateSystemd:
    def __init__(self, stage: Path, checkout: Path) -> None:
        self.stage = stage
        self.checkout = checkout
        self.stage.mkdir(parents=True, exist_ok=True)
        self.log = stage.with_suffix(".log")
        self.pid = 0
        self._unshare: subprocess.Popen | None = None

    def boot(self, timeout: float = 60) -> None:
        with self.log.open("wb") as log:
            self._unshare = subprocess.Popen(
                [*UNSHARE, "sh", "-c", _BOOT, str(self.stage), str(self.checkout)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # detached: a systemd on our terminal would take it over
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            if pids and Path(f"/proc/{pids[0]}/comm").read_text().strip() == "systemd":
                self.pid = int(pids[0])
                state = self.run("systemctl", "is-system-running", timeout=10).stdout.strip()
                if state in ("running", "degraded"):
                    return
            if self._unshare.poll() is not None:
                break
            time.sleep(0.3)
        raise RuntimeError(f"systemd did not come up in {timeout:.0f} s: {self.log.read_text()[-2000:]}")

    def run(self, *command: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """COMMAND inside (its mounts and PID namespace), as root; stdout and stderr captured as text."""
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a signal to "process group 0" inside must never reach the test runner
            **kw,
        )

    def systemctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run("systemctl", "--no-pager", *args, timeout=timeout)

    def prop(self, unit: str, name: str) -> str:
        return self.systemctl("show", "-p", name, "--value", unit).stdout.strip()

    def journal(self, unit: str, since: str | None = None) -> str:
        since_args = ["--since", since] if since else []
        return self.run("journalctl", "--no-pager", "-o", "cat", "-u", unit, *since_args).stdout

    def now(self) -> str:
        """A timestamp for ``journal(since=...)``."""
        return self.run("date", "+%Y-%m-%d %H:%M:%S").stdout.strip()

    def path(self, inside: str) -> Path:
        """A path inside, as the host reaches it."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    def kill(self) -> None:
        """Kill systemd (every process of its namespace goes with it) and with it its mounts."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 9)
        if self._unshare is not None:
            try:
                self._unshare.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._unshare.kill()
