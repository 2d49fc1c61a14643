"""A real MQTT broker (Debian's mosquitto) on a free loopback port, which a test can stop and start again."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.sinks._helpers import free_port


class Broker:
    """mosquitto with persistence, so a subscriber's session and its queued messages survive a restart."""

    def __init__(self, folder: Path, listener: str = "allow_anonymous true\n") -> None:
        self.port = free_port()
        self.folder = folder
        self.conf = folder / "mosquitto.conf"
        # mosquitto started as root drops to the user 'mosquitto', which cannot read pytest's folders: stay.
        user = "user root\n" if os.geteuid() == 0 else ""
        self.conf.write_text(
            f"{user}per_listener_settings true\nlistener {self.port} 127.0.0.1\n{listener}persistence true\n"
            f"persistence_location {folder}/\nmax_queued_messages 100000\nmax_inflight_messages 100\n"
            f"log_dest file {folder}/mosquitto.log\n"
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.conf)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port}: {self.log()}")

    def stop(self) -> None:
        """SIGTERM: mosquitto saves its persistence file and exits; clients see the connection drop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def log(self) -> str:
        path = self.folder / "mosquitto.log"
        return path.read_text()[-3000:] if path.exists() else ""


@pytest.fixture
def broker(tmp_path):
    if shutil.which("mosquitto") is None:
        pytest.fail("mosquitto is not installed (Debian package mosquitto; .ci/system-packages installs it)")
    b = Broker(tmp_path)
    b.start()
    yield b
    b.stop()
