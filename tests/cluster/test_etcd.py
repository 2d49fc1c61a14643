"""The etcd client and the lease against a real etcd: owner keys created only if absent and gone with their
lease, guarded writes, bounded waits when etcd is away, and the local fencing deadline."""

from __future__ import annotations

import socket
import time

import pytest

from streamd.cluster.etcd import Etcd, EtcdError
from streamd.cluster.membership import Membership
from streamd.cluster.ownership import Keys
from streamd.cluster.resume import Position
from streamd.protocol import Resume
from tests.cluster._etcd import EtcdServer, free_port


def test_owner_key_only_if_absent_and_gone_with_its_lease(etcd_server: EtcdServer) -> None:
    client = Etcd([etcd_server.url], 2.0)
    a, b = Keys(client, "/t", "a"), Keys(client, "/t", "b")
    lease_a, lease_b = client.grant(5), client.grant(5)
    rev = a.claim("cam1", lease_a)
    assert rev > 0 and b.claim("cam1", lease_b) == 0  # never two owners
    view = b.read()
    assert view.owner == {"cam1": "a"} and view.revision == {"cam1": rev}
    # b cannot write a's stream position, a can
    pos = Position(Resume(10, 1.0, round(time.time(), 3)), 10.0, "a", final=False)
    assert not b.save({"cam1": pos}, {"cam1": rev + 1}) and a.save({"cam1": pos}, {"cam1": rev})
    assert b.read().positions["cam1"] == pos
    client.revoke(lease_a)  # a dies cleanly: its key goes with its lease
    assert b.read().owner == {} and b.claim("cam1", lease_b) > rev
    assert client.keepalive(lease_a) == -1 and client.keepalive(lease_b) > 0
    client.revoke_if_alive(lease_a)  # gone already: fine
    with pytest.raises(EtcdError, match="not found"):
        client.revoke(lease_a)
    assert not a.release("cam1", rev, None)  # a's old claim is not b's key
    client.close()


def test_a_lease_not_renewed_expires_within_its_ttl(etcd_server: EtcdServer) -> None:
    client = Etcd([etcd_server.url], 2.0)
    lease = client.grant(2)
    Keys(client, "/t", "a").claim("cam", lease)
    t0 = time.monotonic()
    while client.get("/t/owners/cam") is not None:
        assert time.monotonic() - t0 < 4.0
        time.sleep(0.1)
    assert 1.0 < time.monotonic() - t0 < 4.0
    client.close()


def test_unreachable_etcd_fails_within_the_timeout() -> None:
    silent = socket.socket()  # accepts, never answers: a host that hangs
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    closed = free_port()
    client = Etcd([f"http://127.0.0.1:{silent.getsockname()[1]}", f"http://127.0.0.1:{closed}"], 0.5)
    t0 = time.monotonic()
    with pytest.raises(EtcdError, match="cannot reach etcd"):
        client.grant(5)
    assert time.monotonic() - t0 < 0.5 * 2 + 0.5  # one timeout per endpoint at most
    silent.close()


def test_a_second_endpoint_serves_when_the_first_is_down(etcd_server: EtcdServer) -> None:
    client = Etcd([f"http://127.0.0.1:{free_port()}", etcd_server.url], 1.0)
    assert client.grant(5) > 0
    client.close()


def test_fencing_deadline_follows_acknowledged_keepalives(etcd_server: EtcdServer) -> None:
    m = Membership(Etcd([etcd_server.url], 1.0), prefix="/t", node="n", capacity=4, ttl_s=2, margin_s=0.5)
    m.join(wait_s=1.0)
    assert m.valid and 1.4 < m.deadline - time.monotonic() <= 1.5
    m.start()
    time.sleep(3.0)  # renewed by the thread: still valid past the first TTL
    assert m.valid and m.lost == 0
    m._stop.set()  # the keep-alive thread stops, like a paused process
    assert m._thread is not None
    m._thread.join(timeout=2)
    t_last = m.last_ack
    while m.valid:
        time.sleep(0.02)
    assert abs(time.monotonic() - (t_last + 2 - 0.5)) < 0.1  # invalid at ack + TTL - margin, not later
    m.lease = 0
    m.etcd.close()


def test_a_node_name_in_use_is_refused(etcd_server: EtcdServer) -> None:
    def member() -> Membership:
        return Membership(
            Etcd([etcd_server.url], 1.0), prefix="/t", node="same", capacity=1, ttl_s=5, margin_s=1
        )

    first, second = member(), member()
    first.join(wait_s=1.0)
    with pytest.raises(EtcdError, match="held by another running node"):
        second.join(wait_s=1.0)
    first.close()  # its lease is revoked: the name is free at once
    second.join(wait_s=1.0)
    assert second.valid
    second.close()


def test_etcd_unreachable_at_start_is_one_line_and_69(tmp_path) -> None:
    import subprocess
    import sys

    from tests.conftest import CLIP, ROOT

    port = free_port()  # nothing listens there
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        f"streams:\n  - id: a\n    url: {CLIP}\n"
        f"cluster:\n  enabled: true\n  etcd: [http://127.0.0.1:{port}]\n  node: n1\n  timeout_s: 1\n"
    )
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - t0
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line or line.startswith("streamd:")]
    print(f"exit {done.returncode} after {took:.1f} s: {errors}")
    assert done.returncode == 69, done.stderr
    assert len(errors) == 1 and f"cluster: cannot join through etcd at http://127.0.0.1:{port}" in errors[0]
    assert "Traceback" not in done.stderr
