"""docs/service.md's MPS recipe (a control-daemon unit and a drop-in for streamd) parses clean with
`systemd-analyze verify`, together with the shipped unit: no unknown key, no bad value. (Offline: nothing is
started; the recipe's binaries are swapped for /bin/true, as no GPU driver is installed here.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed"
)


def test_the_documented_mps_units_parse_clean(tmp_path) -> None:
    blocks = re.findall(r"```ini\n(.*?)```", (ROOT / "docs/service.md").read_text(), re.S)
    (mps,) = [b for b in blocks if "Type=forking" in b and "nvidia-cuda-mps-control" in b]
    (drop_in,) = [b for b in blocks if "Requires=streamd-mps.service" in b]
    mps = mps.replace("/usr/bin/nvidia-cuda-mps-control", "/bin/true")
    (tmp_path / "streamd-mps.service").write_text(mps)
    (tmp_path / "streamd.service.d").mkdir()
    (tmp_path / "streamd.service.d/mps.conf").write_text(drop_in)
    unit = (ROOT / "systemd/streamd.service").read_text()
    (tmp_path / "streamd.service").write_text(re.sub(r"/opt/streamd/bin/streamd\b", "/bin/true", unit))
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "./streamd-mps.service", "./streamd.service"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
    # and a mistake in the drop-in is seen (the check reads it)
    (tmp_path / "streamd.service.d/mps.conf").write_text(drop_in + "NoSuchKey=1\n")
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "./streamd.service"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "NoSuchKey" in proc.stderr
