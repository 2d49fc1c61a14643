"""The control API against a running ``streamd run`` (CPU engine, the bundled clip), with a real HTTP
client (http.client): add a stream and its lines appear, change one and only it restarts (the untouched
stream's frames stay contiguous), remove one and its lines stop; malformed or invalid requests get a 400
naming the problem and change nothing; no token gets 401, logged with the peer; the state file brings the
API's changes back after a restart and wins over the config file for the ids it names."""

from __future__ import annotations

import http.client
import itertools
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.conftest import CLIP, CLIP_HEVC, MODEL, ROOT, free_port

TOKEN = "test-token-7f3a"
PERIOD_S = 0.1  # samples/vtest.mp4 is 10 fps
LIVE = "    realtime: true\n    loop: true\n    detect_fps: 2\n"  # few inferences: two cores carry it


def write_config(path: Path, port: int, out: Path, state: Path, u1_fps: int = 2, more: str = "") -> None:
    path.write_text(
        f"streams:\n  - id: u0\n    url: {CLIP}\n    realtime: true\n    loop: true\n"  # every frame
        f"  - id: u1\n    url: {CLIP}\n    realtime: true\n    loop: true\n    detect_fps: {u1_fps}\n{more}"
        f"model:\n  path: {MODEL}\npipeline:\n  workers: 1\n  batch_size: 4\n"
        f"tracking:\n  enabled: true\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
        f"metrics:\n  enabled: true\n  port: {port}\n"
        f"  api:\n    enabled: true\n    token: {TOKEN}\n    state_file: {state}\n    max_body_bytes: 4096\n"
        f"    timeout_s: 5\n"
    )


class Daemon:
    """``streamd run`` as a subprocess, its stderr in a file, its lines in ``out``."""

    def __init__(self, config: Path, port: int, out: Path, err: Path) -> None:
        self.port, self.out, self.err = port, out, err
        with open(err, "a") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamd", "run", str(config), "--no-status"],
                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f,
            )  # fmt: skip

    def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = TOKEN, raw: bytes | None = None
    ) -> tuple[int, dict, dict]:
        """(status, JSON answer, headers) of one request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, json.loads(r.read() or b"{}"), dict(r.getheaders())
        finally:
            conn.close()

    def lines(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(x) for x in self.out.read_text().splitlines() if x.endswith("}")]

    def count(self, sid: str) -> int:
        return sum(1 for r in self.lines() if r["stream"] == sid and "type" not in r)

    def wait(self, predicate, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except OSError:  # the port does not listen yet
                pass
            assert self.proc.poll() is None, self.err.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {self.err.read_text()[-3000:]}")

    def ids(self) -> list[str]:
        code, body, _ = self.call("GET", "/api/streams")
        assert code == 200, body
        return [s["id"] for s in body["streams"]]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=90)


def test_streams_change_at_run_time_and_survive_a_restart(tmp_path, assets) -> None:
    port, out, state = free_port(), tmp_path / "out.jsonl", tmp_path / "api-state.json"
    cfg, err = tmp_path / "live.yaml", tmp_path / "stderr.txt"
    write_config(cfg, port, out, state)
    d = Daemon(cfg, port, out, err)
    try:
        d.wait(lambda: d.count("u0") >= 4 and d.call("GET", "/api/streams")[0] == 200, "the first lines")

        # No token, a wrong one: 401, logged with the peer's address; nothing else is said.
        code, body, headers = d.call("GET", "/api/streams", token=None)
        assert code == 401 and headers.get("WWW-Authenticate") == "Bearer" and "streams" not in body
        assert d.call("DELETE", "/api/streams/u0", token="wrong")[0] == 401
        d.wait(lambda: "refused DELETE /api/streams/u0 (wrong bearer token)" in err.read_text(), "the log")
        assert "api: 127.0.0.1:" in err.read_text() and TOKEN not in err.read_text()

        # Malformed or invalid requests: 400 naming the problem (the config's messages); nothing changes.
        code, body, _ = d.call("POST", "/api/streams", raw=b'{"id": "c",')
        assert code == 400 and body["error"].startswith("malformed JSON"), body
        code, body, _ = d.call("POST", "/api/streams", {"id": "c", "url": "nowhere.mp4", "lop": True})
        assert code == 400, body
        assert "lop: unknown key; did you mean 'loop'?" in body["problems"], body
        assert any(p.startswith("url: video file not found: 'nowhere.mp4'") for p in body["problems"]), body
        code, body, _ = d.call("PATCH", "/api/streams/u1", {"detect_fps": -1})
        assert code == 400 and any(
            p.startswith("detect_fps: expected a number > 0") for p in body["problems"]
        )
        code, body, _ = d.call("PUT", "/api/streams/u1", {"id": "other", "url": str(CLIP)})
        assert code == 400 and body["problems"][0].startswith("id: the URL names stream 'u1'"), body
        assert d.call("POST", "/api/streams", [1, 2])[0] == 400
        assert d.call("POST", "/api/streams", {"id": "u0", "url": str(CLIP)})[0] == 409
        assert d.call("PATCH", "/api/streams/nope", {"loop": True})[0] == 404
        code, body, _ = d.call("POST", "/api/streams", raw=b"x" * 5000)
        assert code == 413 and "max_body_bytes" in body["error"], body
        assert d.ids() == ["u0", "u1"] and not state.exists()

        # Add c: its lines appear.
        c = {"id": "c", "url": str(CLIP_HEVC), "realtime": True, "loop": True, "detect_fps": 2}
        code, body, _ = d.call("POST", "/api/streams", c)
        assert code == 201 and body["applied"] == "added c" and body["stream"]["source"] == "api", body
        d.wait(lambda: d.count("c") >= 4, "c's lines")
        assert d.ids() == ["u0", "u1", "c"]

        # Change c (PATCH merges) and u1 (a stream of the config file): only they restart.
        n = d.count("c")
        code, body, _ = d.call("PATCH", "/api/streams/c", {"detect_fps": 3})
        assert code == 200 and body["applied"] == "changed c", body
        d.wait(lambda: d.count("c") >= n + 4, "c writes again")
        code, body, _ = d.call("PATCH", "/api/streams/u1", {"detect_fps": 3})
        assert code == 200 and body["applied"] == "changed u1", body
        code, body, _ = d.call("GET", "/api/streams/u1")
        assert body["settings"]["detect_fps"] == 3 and body["source"] == "api", body

        # Remove c: its lines stop.
        code, body, _ = d.call("DELETE", "/api/streams/c")
        assert code == 200 and body["applied"] == "removed c", body
        time.sleep(2)
        n = d.count("c")
        time.sleep(3)
        assert d.count("c") == n and d.ids() == ["u0", "u1"]

        # Add d with a zone over the whole picture: its enter/leave events reach GET /api/events.
        zone = {"name": "all", "polygon": [[0, 0], [768, 0], [768, 576], [0, 576]]}
        dd = {"id": "d", "url": str(CLIP), "realtime": True, "loop": True, "detect_fps": 5, "zones": [zone]}
        dd["clips"] = {"dir": str(tmp_path / "clips"), "on": ["api"], "pre_roll_s": 2, "post_roll_s": 1}
        assert d.call("POST", "/api/streams", dd)[0] == 201

        def events() -> list[dict]:
            return d.call("GET", "/api/events?since=0&limit=1000")[1]["events"]

        d.wait(lambda: len(events()) >= 3, "three events")
        first = events()
        assert all(e["type"] == "event" and e["stream"] == "d" for e in first), first[:3]
        assert [e["seq"] for e in first] == list(range(first[0]["seq"], first[0]["seq"] + len(first)))
        code, body, _ = d.call("GET", "/api/events?since=0&limit=2")
        assert code == 200 and [e["seq"] for e in body["events"]] == [e["seq"] for e in first[:2]]
        assert body["next"] == first[1]["seq"]
        later = d.call("GET", f"/api/events?since={body['next']}&limit=1000")[1]["events"]
        assert later and later[0]["seq"] == first[2]["seq"]
        assert d.call("GET", "/api/events?since=abc")[0] == 400

        # A clip request: 404 for an unknown stream, 501 for one without clips, else the clip's file.
        assert d.call("POST", "/api/streams/nope/clip")[0] == 404
        code, body, _ = d.call("POST", "/api/streams/u0/clip")
        assert code == 501 and "'u0' has no clips" in body["error"], body
        code, body, _ = d.call("POST", "/api/streams/d/clip")
        assert code == 202 and body["clip"].startswith(str(tmp_path / "clips" / "d")), body
        clip = Path(body["clip"])
        d.wait(clip.exists, "the clip file", timeout=60)
        probe = subprocess.run(
            ["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", str(clip)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        print(f"clip {clip.name}: {probe.stdout.strip()} s")
        assert probe.returncode == 0 and float(probe.stdout) >= 1.0, probe.stderr

        # A client that sends half a request holds only its own thread, never the daemon.
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        slow.sendall(b"POST /api/streams HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        n, t0 = d.count("u0"), time.monotonic()
        assert d.call("GET", "/api/streams")[0] == 200 and time.monotonic() - t0 < 2
        d.wait(lambda: d.count("u0") >= n + 5, "u0 goes on while a client stalls", timeout=30)
        slow.settimeout(15)
        assert slow.recv(100) == b""  # closed by the server after metrics.api.timeout_s (5 s)
        slow.close()
    finally:
        code = d.stop()
    stderr = err.read_text()
    assert code == 0, stderr[-3000:]
    saved = json.loads(state.read_text())
    assert sorted(saved["streams"]) == ["d", "u1"], saved  # c was added and removed: nothing of it stays

    # u0 was never touched: no gap in its frames, no pts jump over two frame periods.
    u0 = [r for r in d.lines() if r["stream"] == "u0" and "type" not in r]
    frames = [r["frame"] for r in u0]
    steps = [b["pts"] - a["pts"] for a, b in itertools.pairwise(u0)]
    print(f"u0: {len(frames)} frames, largest pts step {max(steps):.3f} s")
    assert frames == list(range(len(frames))) and max(steps) <= 2 * PERIOD_S + 1e-6, stderr[-2000:]
    assert stderr.count("api: add c: added c") == 1 and stderr.count("api: remove c: removed c") == 1

    # Restart: the state file's streams come back and win over the config file for their ids (u1's
    # detect_fps 4 written in the file now loses to the API's 3); the file still adds u2.
    more = f"  - id: u2\n    url: {CLIP}\n{LIVE}"
    write_config(cfg, port, out, state, u1_fps=4, more=more)
    before = d.count("d")
    d = Daemon(cfg, port, out, err)
    try:
        d.wait(lambda: d.call("GET", "/api/streams")[0] == 200, "the restart")
        assert d.ids() == ["u0", "u1", "u2", "d"]
        code, body, _ = d.call("GET", "/api/streams/u1")
        assert body["settings"]["detect_fps"] == 3 and body["source"] == "api", body
        d.wait(lambda: d.count("d") >= before + 4, "d's lines after the restart")
    finally:
        assert d.stop() == 0
    assert "overrides the config file for stream(s) u1" in err.read_text()


def test_a_token_is_required_off_loopback_and_a_bad_state_file_stops_the_start(tmp_path, assets) -> None:
    from tests.conftest import run_streamd

    port, out, state = free_port(), tmp_path / "out.jsonl", tmp_path / "state.json"
    cfg = tmp_path / "c.yaml"
    write_config(cfg, port, out, state)
    cfg.write_text(
        cfg.read_text().replace(f"    token: {TOKEN}\n", "").replace("  port:", "  host: 0.0.0.0\n  port:")
    )
    proc = run_streamd("run", str(cfg), "--no-status", timeout=60)
    assert proc.returncode == 78, proc.stderr[-2000:]
    assert (
        "metrics.api.token: metrics.host '0.0.0.0' lets other machines reach the control API" in proc.stderr
    )

    write_config(cfg, port, out, state)
    state.write_text(json.dumps({"version": 1, "streams": {"x": {"id": "x", "url": "gone.mp4"}}}))
    proc = run_streamd("run", str(cfg), "--no-status", timeout=60)
    assert proc.returncode == 78, proc.stderr[-2000:]
    assert f"{state}: streams.x.url: video file not found: 'gone.mp4'" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
