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


def test_keep_alive_extends_the_timeout_while_a_silent_step_runs_and_stops_after(tmp_path, monkeypatch):
    """engine.compile (minutes, no progress callbacks) runs inside keep_alive: systemd hears an extension
    and the status every few seconds while it runs, and nothing once it is over."""
    import time

    from streamd.engines.progress import keep_alive

    path = str(tmp_path / "notify")
    sock = receiver(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    with keep_alive("compiling the model", every_s=0.05, extend_s=90):
        time.sleep(0.4)
    heard = []
    sock.settimeout(0.2)
    try:
        while True:
            heard.append(sock.recv(1024))
    except TimeoutError:
        pass
    assert len(heard) >= 2, heard  # about 8; a loaded CI machine may wake the thread late
    assert set(heard) == {b"EXTEND_TIMEOUT_USEC=90000000\nSTATUS=compiling the model"}
    with pytest.raises(TimeoutError):  # the block is over: no more extensions
        sock.recv(1024)
    sock.close()


def test_keep_alive_gives_up_extending_after_its_bound(tmp_path, monkeypatch, caplog):
    """A step that hangs must still trip systemd's timeout: past ``limit_s`` no extension is sent."""
    import time

    from streamd.engines.progress import keep_alive

    path = str(tmp_path / "notify")
    sock = receiver(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    with keep_alive("compiling", every_s=0.05, extend_s=90, limit_s=0.12):
        time.sleep(0.2)  # the bound passes inside the block
        sock.settimeout(0.2)
        heard = []
        try:
            while True:
                heard.append(sock.recv(1024))
        except TimeoutError:
            pass
        assert 1 <= len(heard) <= 4, heard
        with pytest.raises(TimeoutError):
            sock.recv(1024)
    assert "not extended further" in caplog.text
    sock.close()
