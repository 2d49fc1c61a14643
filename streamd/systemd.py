"""Minimal sd_notify: state lines to systemd over ``$NOTIFY_SOCKET`` (a Unix datagram socket).

No-op when the variable is unset (not started by systemd, or ``Type=simple``). ``@name`` means a Linux
abstract socket. Messages are newline-separated ``KEY=VALUE`` lines, e.g. ``READY=1``, ``STATUS=...``,
``WATCHDOG=1``, ``EXTEND_TIMEOUT_USEC=...`` (see sd_notify(3)). Sending never raises: a daemon must not die
because its supervisor went away.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def _address(raw: str) -> str | bytes | None:
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()  # abstract namespace
    if raw.startswith("/"):
        return raw
    return None  # vsock:... and other schemes are not supported


def notify(*lines: str) -> bool:
    """Send ``lines`` as one message; returns True when a message was sent."""
    raw = os.environ.get("NOTIFY_SOCKET", "")
    if not raw or not lines:
        return False
    address = _address(raw)
    if address is None:
        log.debug("NOTIFY_SOCKET %r: unsupported address, not notifying", raw)
        return False
    message = "\n".join(lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message)
    except OSError as exc:
        log.debug("sd_notify to %r failed: %s", raw, exc)
        return False
    return True


def extend_timeout(seconds: float, status: str | None = None) -> bool:
    """Ask systemd for ``seconds`` more before its current timeout (start-up, runtime or stop) fires.

    Has to be repeated before each extension runs out; ``status`` (optional) updates ``systemctl status``.
    """
    lines = [f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1e6))}"]
    if status is not None:
        lines.append(f"STATUS={status}")
    return notify(*lines)


def watchdog_usec() -> int | None:
    """The watchdog interval systemd asked for (``$WATCHDOG_USEC``), if it is meant for this process."""
    usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec)
    except ValueError:
        return None
