"""streamd.systemd (sd_notify) as the engine build uses it: a real datagram socket stands in for systemd."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from streamd import systemd


def receiver(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(2)
    return sock


def test_no_socket_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify("READY=1") is False
    assert systemd.extend_timeout(30) is False


def test_path_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    sock = receiver(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert systemd.extend_timeout(90.5, status="building")
    assert sock.recv(1024) == b"EXTEND_TIMEOUT_USEC=90500000\nSTATUS=building"
    sock.close()


def test_abstract_socket(monkeypatch):
    name = f"streamd-test-{uuid.uuid4().hex}"
    sock = receiver(b"\0" + name.encode())
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    assert systemd.notify("READY=1", "STATUS=up")
    assert sock.recv(1024) == b"READY=1\nSTATUS=up"
    sock.close()


def test_gone_supervisor_never_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert systemd.notify("WATCHDOG=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert systemd.notify("WATCHDOG=1") is False


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [("5000000", None, 5000000), ("5000000", "own", 5000000), ("5000000", "1", None), ("x", None, None)],
)
def test_watchdog_usec(monkeypatch, usec, pid, expected):
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is None:
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
    else:
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()) if pid == "own" else pid)
    assert systemd.watchdog_usec() == expected
