"""The status page in a real headless browser (Debian chromium + chromium-driver, driven by selenium): the
page loads, lists the demo stream, and its snapshot decodes and shows boxes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import ROOT
from tests.sinks._helpers import CLIP, config_with_sinks, free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

# Counts box-coloured pixels of the loaded snapshot on a canvas, in the page itself.
COUNT_BOX_PIXELS = """
const img = document.getElementById('frame-' + arguments[0]);
if (!img || !img.complete || img.naturalWidth === 0) return null;
const c = document.createElement('canvas');
c.width = img.naturalWidth; c.height = img.naturalHeight;
const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
const d = ctx.getImageData(0, 0, c.width, c.height).data;
let n = 0;
for (let i = 0; i < d.length; i += 4) if (d[i + 1] > 180 && d[i] < 90 && d[i + 2] < 90) n++;
return [c.width, c.height, n];
"""


@pytest.fixture
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.fail("chromium and chromium-driver are not installed (.ci/system-packages installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    return predicate()


def test_status_page_lists_the_demo_stream_and_shows_its_boxes(tmp_path, assets, browser) -> None:
    port = free_port()
    cfg = config_with_sinks(
        tmp_path / "web.yaml", f"  - type: jsonl\n    path: {tmp_path / 'o.jsonl'}\n", clip=CLIP, live=True,
        stream_id="demo", extra=f"metrics:\n  enabled: true\n  port: {port}\n",
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def frames_flowing() -> bool:
            try:
                text = urllib.request.urlopen(f"{base}/api/status", timeout=2).read().decode()
                return '"results": 0' not in text
            except OSError:
                return False

        assert wait_for(frames_flowing, 120), "results before the page is opened"
        browser.get(f"{base}/")
        assert browser.title == "streamd"

        def row_cells() -> list[str]:  # the page re-renders its table: read the row in one script call
            return browser.execute_script(
                "const r = document.getElementById('stream-demo');"
                "return r ? Array.from(r.querySelectorAll('td')).map(td => td.textContent) : [];"
            )

        cells = wait_for(row_cells, 15)
        assert cells, browser.page_source[-2000:]
        assert cells[0] == "demo" and cells[1] == "running", cells
        found = wait_for(lambda: browser.execute_script(COUNT_BOX_PIXELS, "demo"), 20)
        print(f"row {cells}; snapshot {found[0]}x{found[1]} with {found[2]} box pixels" if found else "none")
        assert found and found[:2] == [768, 576], "the snapshot decoded in the browser at the source size"
        assert found[2] > 200, "boxes drawn on the snapshot"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]


def test_status_page_marks_a_stale_stream_and_shows_the_last_error(browser) -> None:
    """The page over a snapshot where ``cam`` runs but its last packet is 12 s old (stale) and ``door`` is
    refused: the rows say so, with the age marked STALE and the last error, and the summary says DEGRADED."""
    from streamd.supervisor import status
    from streamd.supervisor.server import MetricsServer

    per_stream = {
        "demo": {"state": "running", "last_packet_age_s": 0.04, "fps": 25.0},
        "cam": {"state": "running", "last_packet_age_s": 12.3, "last_error": ""},
        "door": {"state": "reconnecting", "last_error": "connection refused by 10.0.0.5:554"},
    }
    for s in per_stream.values():
        s["health"], s["health_reason"], s["stale"] = status.stream_health(s)
    snap = {"results": 10, "elapsed_s": 3.0, "per_stream": per_stream}
    server = MetricsServer("127.0.0.1", 0, lambda: snap)
    server.start()
    try:
        browser.get(f"http://127.0.0.1:{server.address[1]}/")

        def rows() -> dict[str, list[str]]:
            return browser.execute_script(
                "const out = {};"
                "for (const r of document.querySelectorAll('#streams tbody tr'))"
                "  out[r.id] = Array.from(r.querySelectorAll('td')).map(td => td.textContent);"
                "return out;"
            )

        found = wait_for(lambda: len(rows()) == 3 and rows(), 15)
        summary = browser.find_element("id", "summary").text
        print(f"{summary}\n{found}")
        cam, door, demo = found["stream-cam"], found["stream-door"], found["stream-demo"]
        header = browser.execute_script(
            "return Array.from(document.querySelectorAll('#streams th')).map(th => th.textContent);"
        )
        column = {name: i for i, name in enumerate(header)}
        assert cam[column["state"]] == "running" and cam[column["health"]].startswith("down: stale")
        assert cam[column["last packet"]] == "12.3 s ago (STALE)"
        assert demo[column["health"]] == "ok" and "STALE" not in demo[column["last packet"]]
        assert door[column["last error"]] == "connection refused by 10.0.0.5:554"
        assert "DEGRADED" in summary and "cam (stale" in summary and "door (reconnecting" in summary
        red = browser.execute_script(
            "return getComputedStyle(document.querySelector('#stream-cam td.age')).color;"
        )
        assert red == "rgb(204, 0, 0)", red  # the stale age is marked, not just written
    finally:
        server.close()
