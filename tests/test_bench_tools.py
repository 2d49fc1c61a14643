"""bench/bench_engines.py and bench/bench_memory.py on the CPU: their flows run end to end (torch engine on
the host; a real `streamd run` with ONNX Runtime and a fake nvidia-smi), a failing row is reported and the
run goes on, the budget skips the slowest variants, and the memory fit recovers known figures."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_memory import ENGINE_PID, config_dict, fit, parse_variant, split_settings
from tests.conftest import CLIP, ROOT
from tests.engines.conftest import torch_ready  # noqa: F401 (the fixture)
from tests.engines.tiny_models import make_detector


def _engines(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "bench/bench_engines.py", "--device", "cpu", "--seconds", "0.05", "--out", str(out),
         *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, json.loads((out / "bench_engines.json").read_text())


@pytest.mark.usefixtures("torch_ready")
def test_bench_engines_any_model_size_batches_and_variants(tmp_path) -> None:
    model = make_detector(tmp_path / "dyn.onnx", dynamic_hw=True)
    _, result = _engines(
        tmp_path, "--model", str(model), "--input-size", "64", "48", "--batches", "1", "3",
        "--precisions", "fp16", "--variants", "graphs", "lanes2",
    )  # fmt: skip
    rows = result["rows"]
    assert [(r["variant"], r["batch"]) for r in rows] == [
        ("default", 1),
        ("default", 3),
        ("lanes 2", 1),
        ("lanes 2", 3),
    ]
    assert all("error" not in r and r["img_per_s"] > 0 and r["latency_ms"] > 0 for r in rows), rows
    assert all(r["input"] == "64x48" and r["load_s"] > 0 for r in rows)
    assert result["meta"]["model"] == "dyn.onnx" and not result["skipped"]


@pytest.mark.usefixtures("torch_ready")
def test_bench_engines_reports_a_failing_row_and_goes_on(tmp_path) -> None:
    fixed = make_detector(tmp_path / "b2.onnx", batch=2)  # a fixed batch of 2: batch 1 must fail, alone
    _, result = _engines(
        tmp_path, "--model", str(fixed), "--batches", "1", "2", "--precisions", "fp32", "--variants", "graphs"
    )
    bad, ok = result["rows"]
    assert bad["batch"] == 1 and "fixed at 2" in bad["error"]
    assert ok["batch"] == 2 and "error" not in ok and ok["img_per_s"] > 0


@pytest.mark.usefixtures("torch_ready")
def test_bench_engines_budget_skips_the_slowest_variants(tmp_path) -> None:
    model = make_detector(tmp_path / "m.onnx")
    _, result = _engines(
        tmp_path, "--model", str(model), "--batches", "1", "--precisions", "fp32", "--budget-s", "0.01",
        "--variants", "graphs", "lanes2", "compile",
    )  # fmt: skip
    assert [r["variant"] for r in result["rows"]] == ["default"]  # the first always runs
    assert [s.split(":")[0] for s in result["skipped"]] == ["compile fp32", "lanes 2 fp32"]  # slowest first
    assert "Skipped to stay within --budget-s" in (tmp_path / "out" / "bench_engines.md").read_text()


@pytest.mark.usefixtures("torch_ready")
def test_bench_engines_skips_nothing_on_a_guess_before_the_first_engine(tmp_path) -> None:
    """Two compile variants guessed at 150 s each would not fit 100 s, but the first one's measured start-up
    (a second on this CPU, where compile is not applied) is what the second is then estimated at: both run."""
    model = make_detector(tmp_path / "m.onnx")
    _, result = _engines(
        tmp_path, "--model", str(model), "--batches", "1", "--precisions", "fp32", "--budget-s", "100",
        "--variants", "compile", "compile+alldyn",
    )  # fmt: skip
    assert [r["variant"] for r in result["rows"]] == ["compile", "compile, every dim dynamic"]
    assert not result["skipped"]


def test_memory_fit_recovers_per_camera_and_per_worker() -> None:
    rows = [
        {"streams": n, "gpu_processes": p, "gpu_mb_total": 50.0 * n + 1500.0 * p}
        for n, p in ((16, 2), (64, 5), (120, 9))
    ]
    assert fit(rows) == {"mb_per_camera": 50.0, "mb_per_worker": 1500.0}
    assert fit(rows[:1]) == {} and fit([*rows[:1], {"streams": 64, "error": "not ready"}]) == {}
    # engine.shared: one engine process of 6,000 MB beside the decode workers, out of the fit
    shared = [
        {**r, "gpu_processes": r["gpu_processes"] + 1, "engine_processes": 1, "gpu_mb_engines": 6000.0,
         "gpu_mb_total": r["gpu_mb_total"] + 6000.0}
        for r in rows
    ]  # fmt: skip
    assert fit(shared) == {"mb_per_camera": 50.0, "mb_per_worker": 1500.0, "mb_per_engine_process": 6000}


def test_memory_names_the_engine_process_by_the_daemons_line() -> None:
    from streamd.supervisor import engine_hosts

    source = Path(engine_hosts.__file__).read_text()
    assert '"engine process %s on device %d (pid %d): %s"' in source  # the line ENGINE_PID reads
    fmt = "engine process %s on device %d (pid %d): %s"
    line = fmt % ("ready", 0, 4242, "torch fp16")  # the logging call's own format
    assert ENGINE_PID.findall(f"x\n{line}\n") == ["4242"]


def test_memory_variants_split_into_environment_and_config_keys(tmp_path) -> None:
    name, settings = parse_variant(
        "mine:PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,engine.cuda_graphs=false"
    )
    env, keys = split_settings(settings)
    assert name == "mine" and env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert keys == {"engine.cuda_graphs": False}
    args = argparse.Namespace(
        model=Path("m.onnx"), input_size=[640, 640], model_key=["layout: yolov8"], clip=CLIP, engine="torch",
        precision="fp16", batch=32, workers="auto", decoder=None,
    )  # fmt: skip
    cfg = config_dict(args, 3, tmp_path / "o.jsonl", keys)
    assert cfg["engine"]["cuda_graphs"] is False and len(cfg["streams"]) == 3
    assert cfg["model"] == {"path": "m.onnx", "input_size": [640, 640], "layout": "yolov8"}


SHIM = """#!/usr/bin/env python3
import os
for pid in os.listdir("/proc"):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
    except OSError:
        continue
    if b"BENCH_SHIM=1" in env:  # the daemon's processes: 2000 MiB with the variant's variable, else 700
        print(f"{pid}, {2000 if b'SHIM_EXTRA=1' in env else 700}")
"""


@pytest.mark.slow
def test_bench_memory_runs_on_the_cpu_with_a_fake_nvidia_smi(tmp_path, monkeypatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(SHIM)
    smi.chmod(0o755)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "bench/bench_memory.py", "--clip", str(CLIP), "--engine", "onnxruntime",
         "--precision", "fp32", "--decoder", "cpu", "--batch", "4", "--fps", "10", "--streams", "1", "2",
         "--variants", "baseline", "--variant", "extra:SHIM_EXTRA=1,pipeline.frame_queue=1", "--warmup", "1",
         "--window", "3", "--sample-every", "1", "--nvidia-smi", str(smi), "--out", str(out),
         "--tmp", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "BENCH_SHIM": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "bench_memory.json").read_text())
    rows = {(r["variant"], r["streams"]): r for r in result["rows"]}
    assert set(rows) == {("baseline", 1), ("baseline", 2), ("extra", 1), ("extra", 2)}
    for (variant, _), row in rows.items():
        assert "error" not in row and row["exit"] == 0 and row["delivered_fps"] > 0, row
        per = set(row["gpu_mb_per_process"].values())
        assert per == {2000 if variant == "extra" else 700}, row  # the variant's variable reached the daemon
        assert row["gpu_processes"] >= 2  # the supervisor and its worker(s), nothing outside the daemon
        assert row["gpu_mb_total"] == row["gpu_processes"] * per.pop()
    assert set(result["fits"]) == {"baseline", "extra"}
    assert "| extra | 2 |" in (out / "bench_memory.md").read_text()


@pytest.mark.usefixtures("torch_ready")
def test_bench_engines_autotune_variant_sets_inductor_and_sets_it_back() -> None:
    import torch._inductor.config as config

    from bench.bench_engines import inductor_settings, plan

    args = argparse.Namespace(legacy=False, variants=["graphs", "compile+autotune"], precisions=["fp16"])
    variants = plan(args)
    assert [v.label for v in variants] == ["default", "compile + max-autotune"]
    tuned = variants[1]
    assert tuned.compile and tuned.inductor == {"max_autotune": True}
    was = config.max_autotune
    before = inductor_settings(tuned.inductor)
    assert config.max_autotune is True and before == {"max_autotune": was}
    assert inductor_settings(before) == {"max_autotune": True} and config.max_autotune == was
    assert inductor_settings({}) == {}


def test_bench_engines_compile_variants_ask_for_their_settings() -> None:
    """``compile+alldyn`` (the nineteenth session's side-by-side) asks for torch_compile's "all", and
    ``compile+cdt`` for Inductor's coordinate-descent tuning; the plain ``compile`` variant leaves the
    engine's default, "batch", and Inductor's settings alone."""
    from bench.bench_engines import plan
    from streamd.engines import torch_compile

    args = argparse.Namespace(
        legacy=False, variants=["compile", "compile+cdt", "compile+alldyn"], precisions=["fp16"]
    )
    plain, cdt, alldyn = plan(args)
    assert plain.compile and cdt.compile and alldyn.compile
    assert (plain.dynamic, cdt.dynamic, alldyn.dynamic) == ("", "", "all")
    assert cdt.inductor == {"coordinate_descent_tuning": True} and not plain.inductor
    assert torch_compile.DYNAMIC_DIMS == "batch"


def test_bench_engines_inductor_variants_name_real_inductor_settings() -> None:
    """Each Inductor-tuned variant sets keys this torch's Inductor has (a renamed key would otherwise make the
    variant an error row on the GPU box, a device call lost)."""
    pytest.importorskip("torch")
    import torch._inductor.config as config

    from bench.bench_engines import plan

    names = ["compile+autotune", "compile+cdt", "compile+1x1mm", "compile+freeze"]
    args = argparse.Namespace(legacy=False, variants=names, precisions=["fp16"])
    variants = plan(args)
    assert len(variants) == len(names)
    for v in variants:
        assert v.compile and v.inductor, v.name
        for key in v.inductor:
            assert hasattr(config, key), (v.name, key)
