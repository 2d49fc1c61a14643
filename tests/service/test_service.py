"""The shipped unit under a real systemd, installed the way docs/service.md says (systemd/install.sh).

One systemd (PID 1 of its own namespaces, tests/service/machine.py) for the module; the tests run in file
order, each leaving streamd.service active with a valid config. They print what they measure (pytest -s).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import ROOT
from tests.service.machine import CHECKOUT, PrivateSystemd, unavailable

UNIT = "streamd.service"
CONFIG = "/etc/streamd/streamd.yaml"
OUTPUT = "/var/lib/streamd/detections.jsonl"
INSTALL = f"{CHECKOUT}/systemd/install.sh"  # the checkout as the private systemd sees it
WATCHDOG_S = 30
RESTART_S = 5
STOP_TIMEOUT_S = 30

why_not = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_not is not None, reason=str(why_not))]


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``check()`` holds; fails after ``timeout``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.25)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def box(tmp_path_factory) -> Iterator[PrivateSystemd]:
    machine = PrivateSystemd(tmp_path_factory.mktemp("service") / "root", ROOT)
    machine.boot()
    try:
        yield machine
    finally:
        machine.kill()


@pytest.fixture(scope="module")
def installed(box: PrivateSystemd) -> dict:
    """systemd/install.sh as docs/service.md runs it: no option on a CPU box."""
    start = time.monotonic()
    proc = box.run(INSTALL, timeout=900)
    took = time.monotonic() - start
    print(f"\ninstall.sh: exit {proc.returncode} in {took:.1f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"seconds": took, "output": proc.stdout + proc.stderr}


class Output:
    """The jsonl output, read from the host."""

    def __init__(self, box: PrivateSystemd) -> None:
        self.file = box.path(OUTPUT)

    def lines(self, stream: str | None = None) -> int:
        try:
            text = self.file.read_text()
        except FileNotFoundError:
            return 0
        if stream is None:
            return text.count("\n")
        return sum(1 for line in text.splitlines() if json.loads(line).get("stream") == stream)


def config_text(box: PrivateSystemd) -> str:
    return box.path(CONFIG).read_text()


def write_config(box: PrivateSystemd, text: str) -> None:
    box.path(CONFIG).write_text(text)  # keeps the file's owner and mode


def main_pid(box: PrivateSystemd) -> int:
    return int(box.prop(UNIT, "MainPID") or 0)


def running_pid(box: PrivateSystemd) -> int:
    """The supervisor's pid once the unit runs: never 0 (``kill -STOP 0`` would stop the caller's group)."""
    wait_for(lambda: running(box) and main_pid(box) > 0, 90, "the unit running")
    return main_pid(box)


def restarts(box: PrivateSystemd) -> int:
    return int(box.prop(UNIT, "NRestarts") or 0)


def running(box: PrivateSystemd) -> bool:
    return box.prop(UNIT, "ActiveState") == "active" and main_pid(box) != 0


def with_stream(text: str, stream_id: str) -> str:
    """The config with one more stream: the installed clip under another id."""
    block = (
        f"  - id: {stream_id}\n    url: /opt/streamd/share/streamd/samples/vtest.mp4\n"
        "    realtime: true\n    loop: true\n    detect_fps: 2\n"
    )
    return text.replace("\nmodel:", f"\n{block}\nmodel:", 1)


BAD = "score_threshold: 7  # out of (0, 1): refused"


def broken(text: str) -> str:
    return re.sub(r"score_threshold: [0-9.]+", BAD, text, count=1)


def test_install_starts_the_service_and_lines_are_written(box, installed) -> None:
    assert box.prop(UNIT, "ActiveState") == "active"  # Type=notify: active means READY=1 arrived
    assert box.systemctl("is-enabled", UNIT).stdout.strip() == "enabled"
    out = Output(box)
    took = wait_for(lambda: out.lines() >= 3, 60, "3 lines in " + OUTPUT)
    print(f"first 3 lines {took:.1f} s after install.sh returned")
    passwd = box.run("getent", "passwd", "streamd").stdout.strip().split(":")
    assert passwd[5] == "/var/lib/streamd" and passwd[6].endswith("nologin"), passwd
    group = int(passwd[3])
    st = os.stat(box.path(CONFIG))
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o777)) == (0, group, "0o640")  # camera passwords
    st = os.stat(box.path("/var/lib/streamd"))
    assert (st.st_uid, oct(st.st_mode & 0o777)) == (int(passwd[2]), "0o750")
    assert box.path("/etc/logrotate.d/streamd").exists()
    assert box.path("/opt/streamd/bin/streamd").exists()
    analysis = box.run("systemd-analyze", "security", "--no-pager", UNIT).stdout  # the loaded unit, online
    exposure = float(re.findall(r"Overall exposure level for streamd.service: ([0-9.]+)", analysis)[0])
    print(f"systemd-analyze security {UNIT}: {exposure}")
    assert exposure <= 2.0


def test_example_configs_pass_check_where_installed(box, installed) -> None:
    """configs/service.yaml (installed) and configs/edge-box.yaml with the password file its header asks for,
    checked as the service user."""
    edge = box.path("/etc/streamd/edge-box.yaml")
    edge.write_text((ROOT / "configs" / "edge-box.yaml").read_text())
    made = box.run(
        "install", "-o", "root", "-g", "streamd", "-m", "0640", "/dev/null", "/etc/streamd/mqtt-password"
    )
    assert made.returncode == 0, made.stderr
    box.path("/etc/streamd/mqtt-password").write_text("secret\n")
    try:
        for config in (CONFIG, "/etc/streamd/edge-box.yaml"):
            proc = box.run("runuser", "-u", "streamd", "--", "/opt/streamd/bin/streamd", "check", config)
            assert proc.returncode == 0, proc.stderr
    finally:
        edge.unlink()
        box.path("/etc/streamd/mqtt-password").unlink()


def test_install_again_upgrades_and_keeps_the_config(box, installed) -> None:
    write_config(box, config_text(box) + "# edited by the operator\n")
    before = main_pid(box)
    start = time.monotonic()
    proc = box.run(INSTALL, timeout=900)
    print(f"\ninstall.sh again: exit {proc.returncode} in {time.monotonic() - start:.1f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "keeping the existing /etc/streamd/streamd.yaml" in proc.stdout
    assert config_text(box).endswith("# edited by the operator\n")
    assert running(box) and main_pid(box) != before  # restarted on the new code


def test_reload_adds_a_stream(box, installed) -> None:
    out = Output(box)
    write_config(box, with_stream(config_text(box), "second"))
    proc = box.systemctl("reload", UNIT)
    assert proc.returncode == 0, proc.stderr
    took = wait_for(lambda: out.lines("second") >= 2, 60, "lines of the added stream")
    print(f"\nreload: lines of the new stream {took:.1f} s after systemctl reload returned")


def test_refused_reload_fails_and_the_old_config_keeps_running(box, installed) -> None:
    out = Output(box)
    good, pid = config_text(box), main_pid(box)
    since = box.now()
    write_config(box, broken(good))
    proc = box.systemctl("reload", UNIT)
    assert proc.returncode != 0  # systemctl reload reports the refusal ...
    assert "model.score_threshold" in box.journal(UNIT, since)  # ... and the journal says why
    assert running(box) and main_pid(box) == pid
    before = {s: out.lines(s) for s in ("demo", "second")}
    wait_for(
        lambda: all(out.lines(s) > n + 1 for s, n in before.items()), 30, "lines after the refused reload"
    )
    write_config(box, good)
    assert box.systemctl("reload", UNIT).returncode == 0


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate not installed (.ci/system-packages)")
def test_logrotate_moves_the_file_and_the_daemon_reopens(box, installed) -> None:
    proc = box.run("logrotate", "--force", "/etc/logrotate.d/streamd")
    assert proc.returncode == 0, proc.stderr
    assert box.path(OUTPUT + ".1").exists()
    out = Output(box)
    took = wait_for(lambda: out.lines() >= 2, 30, "lines in a new " + OUTPUT)
    print(f"\nlogrotate: new file written {took:.1f} s later")


def test_stop_drains_and_exits_0(box, installed) -> None:
    since = box.now()
    start = time.monotonic()
    proc = box.systemctl("stop", UNIT)
    took = time.monotonic() - start
    print(f"\nsystemctl stop: {took:.1f} s")
    assert proc.returncode == 0, proc.stderr
    assert took < STOP_TIMEOUT_S
    assert box.prop(UNIT, "Result") == "success"
    assert box.prop(UNIT, "ExecMainStatus") == "0"
    assert "after draining" in box.journal(UNIT, since)
    assert box.systemctl("start", UNIT).returncode == 0


def test_kill_9_of_the_supervisor_is_restarted(box, installed) -> None:
    box.systemctl("reset-failed", UNIT)  # this test and the next restart on purpose: keep the start limit out
    pid, count = running_pid(box), restarts(box)
    assert box.run("kill", "-KILL", str(pid)).returncode == 0
    took = wait_for(  # restarted by systemd (NRestarts moves), running again under a new pid
        lambda: restarts(box) > count and running(box) and main_pid(box) != pid,
        RESTART_S + 60,
        "restart after kill -9",
    )
    print(f"\nkill -9: active again (READY) {took:.1f} s later")
    assert restarts(box) == count + 1


def test_stopped_supervisor_is_restarted_by_the_watchdog(box, installed) -> None:
    box.systemctl("reset-failed", UNIT)
    pid, count = running_pid(box), restarts(box)
    since = box.now()
    assert box.run("kill", "-STOP", str(pid)).returncode == 0
    killed = wait_for(lambda: main_pid(box) != pid, WATCHDOG_S + 10, "the watchdog killing the supervisor")
    assert "Watchdog timeout" in box.journal(UNIT, since)
    restart = killed + wait_for(
        lambda: restarts(box) > count, RESTART_S + 10, "the restart after the watchdog"
    )
    ready = restart + wait_for(lambda: running(box), 60, "READY after the watchdog restart")
    print(
        f"\nSIGSTOP: watchdog kill {killed:.1f} s, restart {restart:.1f} s, READY {ready:.1f} s after SIGSTOP"
    )


def test_bad_config_at_start_exits_78_and_is_not_restarted(box, installed) -> None:
    good = config_text(box)
    write_config(box, broken(good))
    box.systemctl("reset-failed", UNIT)
    count = restarts(box)
    proc = box.systemctl("restart", UNIT)
    assert proc.returncode != 0
    assert box.prop(UNIT, "ExecMainStatus") == "78"
    time.sleep(RESTART_S + 3)  # a restart would have been scheduled by now
    assert box.prop(UNIT, "ActiveState") == "failed"
    assert restarts(box) == count
    write_config(box, good)
    box.systemctl("reset-failed", UNIT)
    assert box.systemctl("start", UNIT).returncode == 0


def test_nothing_is_denied_by_the_system_call_filter(box, installed) -> None:
    """The shipped unit answers a denied call with EPERM, which nothing logs: run start, reload and stop
    once more with the filter's action set to kill (a drop-in), so that a denied call would kill."""
    dropin = box.path("/etc/systemd/system/streamd.service.d/kill.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text("[Service]\nSystemCallErrorNumber=kill\n")
    try:
        box.systemctl("daemon-reload")
        box.systemctl("reset-failed", UNIT)
        since = box.now()
        assert box.systemctl("restart", UNIT).returncode == 0
        out = Output(box)
        before = out.lines("second")
        write_config(box, config_text(box).replace("id: second", "id: third"))
        assert box.systemctl("reload", UNIT).returncode == 0
        wait_for(lambda: out.lines("third") >= 2 and out.lines("demo") > before, 60, "lines under kill mode")
        assert box.systemctl("stop", UNIT).returncode == 0
        assert box.prop(UNIT, "Result") == "success", box.journal(UNIT, since)[-3000:]
        log = box.journal(UNIT, since)
        assert "SIGSYS" not in log and "31/SYS" not in log, log[-3000:]
        assert "0 worker restart(s)" in log, log[-3000:]
    finally:
        dropin.unlink()
        box.systemctl("daemon-reload")
    assert "31/SYS" not in box.journal(UNIT)
    assert box.systemctl("start", UNIT).returncode == 0


def test_a_shared_engine_runs_as_the_service(box, installed) -> None:
    """engine.shared under the real unit with its filter set to kill: the engine process (abstract socket,
    the workers' shared-memory rows, PrivateTmp, RemoveIPC) comes up, both workers' streams write lines, and
    stop drains through it and exits 0."""
    good = config_text(box)
    shared = with_stream(good, "viaengine").replace("engine:\n", "engine:\n  shared: true\n", 1)
    shared += "\npipeline:\n  workers: 2\n  spare_worker: false\n"
    dropin = box.path("/etc/systemd/system/streamd.service.d/kill.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text("[Service]\nSystemCallErrorNumber=kill\n")
    try:
        write_config(box, shared)
        box.systemctl("daemon-reload")
        box.systemctl("reset-failed", UNIT)
        since = box.now()
        assert box.systemctl("restart", UNIT).returncode == 0, box.journal(UNIT, since)[-3000:]
        out = Output(box)
        before = out.lines("demo")
        wait_for(
            lambda: out.lines("viaengine") >= 2 and out.lines("demo") > before + 1, 90, "lines via the engine"
        )
        assert box.systemctl("stop", UNIT).returncode == 0
        log = box.journal(UNIT, since)
        assert box.prop(UNIT, "Result") == "success", log[-3000:]
        assert "engine process ready on device" in log and "serving batches" in log, log[-3000:]
        assert "SIGSYS" not in log and "31/SYS" not in log, log[-3000:]
        assert "0 worker restart(s)" in log and "after draining" in log, log[-3000:]
    finally:
        dropin.unlink()
        box.systemctl("daemon-reload")
        write_config(box, good)
    assert box.systemctl("start", UNIT).returncode == 0


def test_uninstall_keeps_config_and_data_purge_removes_them(box, installed) -> None:
    proc = box.run(INSTALL, "--uninstall", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not box.path("/etc/systemd/system/streamd.service").exists()
    assert not box.path("/opt/streamd").exists()
    assert box.path(CONFIG).exists() and box.path(OUTPUT).exists()
    assert box.run("getent", "passwd", "streamd").returncode == 0
    assert box.systemctl("is-active", UNIT).stdout.strip() != "active"
    proc = box.run(INSTALL, "--uninstall", "--purge", timeout=120)
    assert proc.returncode == 0, proc.stderr
    for gone in ("/etc/streamd", "/var/lib/streamd", "/var/cache/streamd", "/etc/logrotate.d/streamd"):
        assert not box.path(gone).exists(), gone
    assert box.run("getent", "passwd", "streamd").returncode != 0
