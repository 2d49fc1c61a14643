from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdServer, needs_etcd


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    """A fresh etcd on loopback for one test (skips when etcd is not installed)."""
    needs_etcd()
    pytest.importorskip("etcd3gw")
    server = EtcdServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
