"""The TensorRT backend driven through the fake ``tensorrt`` module of each version (10.x and 11.x).

The fake runs the parsed ONNX with ONNX Runtime at the bound addresses, so these tests check results as well
as the calls: build options, precision per version, the engine cache, parse errors, CUDA graphs, progress,
systemd.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from streamd.build_engine import add_build_engine_parser, run_build_engine
from streamd.checks.verify import create_engine
from streamd.engines.base import EngineError
from streamd.engines.options import EngineOptions, Machine
from streamd.engines.progress import BuildProgress
from streamd.engines.registry import choose_backend
from streamd.engines.tensorrt import TensorRTEngine
from streamd.gpu.cuda import Stream
from tests.engines.tiny_models import random_images


def reference(model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"images": x})[0]


def engine(fake, model: Path, tmp_path: Path, **kw) -> TensorRTEngine:
    _, cuda = fake
    kw.setdefault("max_batch", 4)
    kw.setdefault("precision", "fp32")
    return TensorRTEngine(model, EngineOptions(cache_dir=tmp_path / "cache", cuda_api=cuda, **kw))


def recorded_on(cuda, stream: int) -> int:
    """The event the engine last recorded on ``stream`` (a lane's "call done" event), from the fake CUDA's
    call log."""
    return [c[1] for c in cuda.calls if c[0] == "record" and c[2] == stream][-1]


def plans(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "engines").glob("*.plan"))


def test_fp32_build_and_infer_match_onnxruntime(fake_trt, models, tmp_path):
    trt, _ = fake_trt
    e = engine(fake_trt, models["dynamic"], tmp_path)
    assert (e.on_device, e.max_batch, e.input_shape, e.output_shape) == (True, 4, (3, 32, 32), (1, 84, 320))
    assert e.input_dtype == np.float32 and e.output_dtype == np.float32
    x = random_images(3)
    np.testing.assert_allclose(e.infer(x), reference(models["dynamic"], x), rtol=1e-5, atol=1e-5)
    (build,) = trt._builds
    assert build["profile"] == ((1, 3, 32, 32), (4, 3, 32, 32), (4, 3, 32, 32))  # opt = max by default
    assert build["workspace"] == 4 << 30 and build["opt_level"] == 3
    if trt._major >= 11:
        assert build["strongly_typed"] and trt._network_flags == [1 << 0]
    else:
        assert not build["strongly_typed"] and trt._network_flags == [0]
    e.close()
    e.close()  # twice is fine


def test_fp16_uses_builder_flag_on_10_and_converted_onnx_on_11(fake_trt, models, tmp_path):
    trt, _ = fake_trt
    e = engine(fake_trt, models["dynamic"], tmp_path, precision="fp16")
    (build,) = trt._builds
    sidecar = json.loads(Path(str(e.plan.path) + ".json").read_text())
    if trt._major >= 11:
        assert build["flags"] == [] and build["strongly_typed"]
        assert e.plan.prepared.precision_recipe == "fp16:onnx-converted,strongly-typed"
        parsed = onnx.load(str(e.plan.prepared.path))
        weights = {t.name: t.data_type for t in parsed.graph.initializer}
        assert weights["conv1.w"] == TensorProto.FLOAT16
        assert weights["resize.scales"] == TensorProto.FLOAT  # ONNX requires FP32 scales
        assert parsed.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT  # I/O stays FP32
        assert parsed.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
        assert sidecar["key"]["prepare"] == ["fp16-io32-v1"]
    else:
        assert build["flags"] == ["FP16"] and not build["strongly_typed"]
        assert e.plan.prepared.path == models["dynamic"]  # no conversion: TensorRT picks FP16 kernels itself
    x = random_images(2)
    np.testing.assert_allclose(e.infer(x), reference(models["dynamic"], x), atol=0.1)  # FP16 rounding
    assert e.input_dtype == np.float32


def test_int8_needs_qdq(fake_trt, models, tmp_path):
    trt, _ = fake_trt
    with pytest.raises(EngineError, match="QuantizeLinear/DequantizeLinear"):
        engine(fake_trt, models["dynamic"], tmp_path, precision="int8")
    assert trt._builds == []
    e = engine(fake_trt, models["qdq"], tmp_path, precision="int8")
    (build,) = trt._builds
    if trt._major >= 11:
        assert build["flags"] == [] and build["strongly_typed"]
    else:
        assert build["flags"] == ["FP16", "INT8"]
    assert e.infer(random_images(1)).shape == (1, 84, 320)


def test_engine_cache_hit_and_key(fake_trt, models, tmp_path):
    trt, _ = fake_trt
    e1 = engine(fake_trt, models["dynamic"], tmp_path)
    assert e1.plan.built
    e2 = engine(fake_trt, models["dynamic"], tmp_path)
    assert not e2.plan.built and len(trt._builds) == 1 and e2.plan.path == e1.plan.path
    key = json.loads(Path(str(e1.plan.path) + ".json").read_text())["key"]
    assert key["tensorrt"] == trt.__version__ and key["gpu"] == "NVIDIA H200"
    assert key["compute_capability"] == "9.0" and key["platform"]
    assert key["onnx_sha256"] == __import__("hashlib").sha256(models["dynamic"].read_bytes()).hexdigest()
    assert key["profile"] == {"images": [[1, 3, 32, 32], [4, 3, 32, 32], [4, 3, 32, 32]]}
    assert key["builder"]["workspace_bytes"] == 4 << 30
    # Each input of the key gives another plan.
    engine(fake_trt, models["dynamic"], tmp_path, precision="fp16")
    engine(fake_trt, models["dynamic"], tmp_path, max_batch=8)
    engine(fake_trt, models["dynamic"], tmp_path, opt_batch=2)
    engine(fake_trt, models["dynamic"], tmp_path, workspace_mb=512)
    engine(fake_trt, models["other"], tmp_path)
    assert len(plans(tmp_path)) == 6 and len(trt._builds) == 6
    assert trt._builds[3]["profile"][1] == (2, 3, 32, 32) and trt._builds[4]["workspace"] == 512 << 20


def test_cache_key_covers_gpu_and_tensorrt_version(models, tmp_path, monkeypatch):
    from tests.engines.fake_tensorrt import make_fakes

    paths = set()
    for version, gpu in [("10.16.1.11", ("NVIDIA H200", (9, 0))), ("10.16.1.11", ("NVIDIA L4", (8, 9))),
                         ("10.15.1.29", ("NVIDIA H200", (9, 0)))]:  # fmt: skip
        trt, cuda = make_fakes(version, gpu)
        monkeypatch.setitem(__import__("sys").modules, "tensorrt", trt)
        e = TensorRTEngine(
            models["dynamic"], EngineOptions(max_batch=2, precision="fp32", cache_dir=tmp_path, cuda_api=cuda)
        )
        assert e.plan.built
        paths.add(e.plan.path)
    assert len(paths) == 3


def test_corrupt_cached_plan_is_rebuilt(fake_trt, models, tmp_path, caplog):
    trt, _ = fake_trt
    e = engine(fake_trt, models["dynamic"], tmp_path)
    e.plan.path.write_bytes(b"not a plan")
    e2 = engine(fake_trt, models["dynamic"], tmp_path)
    assert e2.plan.built and len(trt._builds) == 2
    assert "does not deserialize" in caplog.text
    assert e2.plan.path.read_bytes().startswith(b"FAKEPLAN")
    x = random_images(1)
    np.testing.assert_allclose(e2.infer(x), reference(models["dynamic"], x), atol=1e-5)


def test_atomic_writes_leave_no_temp_files(fake_trt, models, tmp_path):
    engine(fake_trt, models["dynamic"], tmp_path, precision="fp16")
    names = [p.name for p in (tmp_path / "cache" / "engines").iterdir()]
    assert not [n for n in names if n.endswith(".tmp")]
    assert any(n.startswith("timing-trt") for n in names)


def test_timing_cache_is_reused_and_survives_corruption(fake_trt, models, tmp_path, caplog):
    trt, _ = fake_trt
    engine(fake_trt, models["dynamic"], tmp_path)
    engine(fake_trt, models["dynamic"], tmp_path, rebuild=True)
    assert [b["timing_cache_in"] for b in trt._builds] == [0, 1]
    (timing,) = (tmp_path / "cache" / "engines").glob("timing-*.cache")
    assert "nvidia-h200-sm90" in timing.name
    timing.write_bytes(b"garbage")
    engine(fake_trt, models["dynamic"], tmp_path, rebuild=True)
    assert trt._builds[-1]["timing_cache_in"] == 0 and "timing cache" in caplog.text


def test_fixed_batch_one_model_becomes_dynamic(fake_trt, models, tmp_path):
    trt, _ = fake_trt
    e = engine(fake_trt, models["b1"], tmp_path, max_batch=4)
    assert e.max_batch == 4 and "dynbatch-v1" in e.plan.prepared.steps
    x = random_images(4)
    ref = np.concatenate([reference(models["b1"], x[i : i + 1]) for i in range(4)])
    np.testing.assert_allclose(e.infer(x), ref, atol=1e-5)
    one = engine(fake_trt, models["b1"], tmp_path, max_batch=1)
    assert one.max_batch == 1 and trt._builds[-1]["profile"] is None  # fixed shape: no profile needed


def test_parse_errors_name_the_node(fake_trt, models, tmp_path):
    trt, _ = fake_trt
    m = onnx.load(str(models["dynamic"]))
    m.graph.node.insert(1, helper.make_node("Celu", ["c1"], ["c1_celu"], name="odd_activation"))
    m.graph.node[2].input[0] = "c1_celu"
    bad = tmp_path / "bad.onnx"
    onnx.save(m, str(bad))
    with pytest.raises(EngineError) as err:
        engine(fake_trt, bad, tmp_path)
    text = str(err.value)
    assert "cannot parse" in text and "node 1 (Celu 'odd_activation')" in text and "No importer" in text
    assert trt._builds == []


def test_enqueue_with_cuda_graphs(fake_trt, models, tmp_path):
    _, cuda = fake_trt
    e = engine(fake_trt, models["dynamic"], tmp_path, max_batch=8)
    x = random_images(8)
    out = np.zeros((8, 84, 320), np.float32)
    stream = Stream.borrow(77)
    e.enqueue(x.ctypes.data, out.ctypes.data, 8, stream)  # runs, then captures
    np.testing.assert_allclose(out, reference(models["dynamic"], x), atol=1e-5)
    assert [c[0] for c in cuda.calls].count("begin_capture") == 1
    x[:] = random_images(8, seed=9)  # new frames in the same slot buffer
    out[:] = 0
    e.enqueue(x.ctypes.data, out.ctypes.data, 8, stream)  # graph launch reads the current input
    assert [c[0] for c in cuda.calls].count("launch") == 1
    np.testing.assert_allclose(out, reference(models["dynamic"], x), atol=1e-5)
    e.enqueue(x.ctypes.data, out.ctypes.data, 3, stream)  # another batch size: its own graph
    np.testing.assert_allclose(out[:3], reference(models["dynamic"], x[:3]), atol=1e-5)
    assert [c[0] for c in cuda.calls].count("begin_capture") == 2
    assert not [c for c in cuda.calls if c[0] == "wait"]  # one stream: no cross-stream waits
    e.enqueue(x.ctypes.data, out.ctypes.data, 8, Stream.borrow(78))  # another stream waits for the last call
    assert ("wait", 78, recorded_on(cuda, 77)) in cuda.calls
    with pytest.raises(EngineError, match="batch 9"):
        e.enqueue(x.ctypes.data, out.ctypes.data, 9, stream)


def test_lanes_give_each_stream_its_own_context(fake_trt, models, tmp_path):
    """lanes 2: two streams get two execution contexts (their own bindings, graphs and event), so neither
    waits for the other; a third stream shares the first lane and waits for its last call."""
    _, cuda = fake_trt
    e = engine(fake_trt, models["dynamic"], tmp_path, max_batch=8, lanes=2)
    assert e.lanes == 2
    a, b = random_images(8, seed=1), random_images(8, seed=2)
    out_a, out_b = np.zeros((8, 84, 320), np.float32), np.zeros((8, 84, 320), np.float32)
    for _ in range(2):  # run + capture, then graph launches: one graph per lane
        e.enqueue(a.ctypes.data, out_a.ctypes.data, 8, Stream.borrow(77))
        e.enqueue(b.ctypes.data, out_b.ctypes.data, 8, Stream.borrow(78))
    np.testing.assert_allclose(out_a, reference(models["dynamic"], a), atol=1e-5)
    np.testing.assert_allclose(out_b, reference(models["dynamic"], b), atol=1e-5)
    assert [c[0] for c in cuda.calls].count("begin_capture") == 2
    assert not [c for c in cuda.calls if c[0] == "wait"]  # two lanes: no cross-stream waits
    assert recorded_on(cuda, 77) != recorded_on(cuda, 78)  # each lane its own event
    e.enqueue(a.ctypes.data, out_a.ctypes.data, 8, Stream.borrow(79))  # a third stream: lane 0 again
    assert ("wait", 79, recorded_on(cuda, 77)) in cuda.calls
    assert e.infer(a).shape == (8, 84, 320)  # the host round trip still works beside them
    e.close()


def test_a_lane_without_gpu_memory_fails_the_engine_and_frees_the_others(
    fake_trt, models, tmp_path, monkeypatch
):
    trt, cuda = fake_trt
    made = []
    real = trt.ICudaEngine.create_execution_context

    def create(self):
        made.append(len(made))
        return None if len(made) == 3 else real(self)  # the third lane's context: out of memory

    monkeypatch.setattr(trt.ICudaEngine, "create_execution_context", create)
    with pytest.raises(EngineError, match=r"each of engine\.lanes needs one"):
        engine(fake_trt, models["dynamic"], tmp_path, max_batch=8, lanes=3)
    assert len([c for c in cuda.calls if c[0] == "event_destroy"]) == 2  # the two lanes made before


def test_enqueue_without_graphs_and_when_capture_fails(fake_trt, models, tmp_path, caplog):
    _, cuda = fake_trt
    x = random_images(2)
    ref = reference(models["dynamic"], x)
    out = np.zeros((2, 84, 320), np.float32)
    plain = engine(fake_trt, models["dynamic"], tmp_path, cuda_graphs=False)
    for _ in range(2):
        plain.enqueue(x.ctypes.data, out.ctypes.data, 2, Stream.borrow(5))
    assert not [c for c in cuda.calls if c[0] in ("begin_capture", "launch")]
    np.testing.assert_allclose(out, ref, atol=1e-5)
    cuda.fail_capture = True
    out[:] = 0
    flaky = engine(fake_trt, models["dynamic"], tmp_path)
    for _ in range(2):
        flaky.enqueue(x.ctypes.data, out.ctypes.data, 2, Stream.borrow(5))
    np.testing.assert_allclose(out, ref, atol=1e-5)
    assert caplog.text.count("no CUDA graph") == 1  # tried once per (batch, stream), then runs plainly


def test_progress_display_and_cancel(fake_trt, models, tmp_path):
    out = io.StringIO()
    engine(fake_trt, models["dynamic"], tmp_path, progress=BuildProgress(out))
    text = out.getvalue()
    assert "Building engine" in text and "Building engine: done" in text
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(EngineError, match="cancelled"):
        engine(
            fake_trt,
            models["dynamic"],
            tmp_path,
            rebuild=True,
            progress=BuildProgress(io.StringIO(), cancel),
        )


def test_build_keeps_systemd_informed(fake_trt, models, tmp_path, monkeypatch):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    engine(fake_trt, models["dynamic"], tmp_path)  # default progress: log + systemd keepalive
    message = sock.recv(4096).decode()
    sock.close()
    lines = dict(line.split("=", 1) for line in message.splitlines())
    assert int(lines["EXTEND_TIMEOUT_USEC"]) >= 60_000_000  # ≥ 3 watchdog periods
    assert lines["WATCHDOG"] == "1" and "building TensorRT engine" in lines["STATUS"]


def test_create_engine_and_auto_choice(fake_trt, models, tmp_path, monkeypatch):
    _, cuda = fake_trt
    e = create_engine(
        "tensorrt", models["dynamic"], max_batch=2, precision="fp16", cache_dir=tmp_path, cuda_api=cuda
    )
    assert e.on_device and e.name.startswith("tensorrt-")
    # the start-up check ran (fake TensorRT computes with ONNX Runtime) and its verdict sits beside the plan
    assert e.verification["passed"] and not e.verification["cached"]
    assert e.plan.path.with_name(e.plan.path.name + ".verify.json").exists()
    assert choose_backend("auto", Machine(tensorrt=True, torch_cuda=True)) == "tensorrt"


def test_build_engine_command(fake_trt, models, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_build_engine_parser(parser.add_subparsers(dest="command"))
    config = SimpleNamespace(
        model=SimpleNamespace(path=models["dynamic"]),
        engine=SimpleNamespace(type="auto", precision="fp16", max_batch=4, device=0, cache_dir=tmp_path),
    )
    args = parser.parse_args(["build-engine", "--max-batch", "2"])
    assert run_build_engine(args, config) == 0
    first = capsys.readouterr()
    assert first.out.strip().endswith(".plan") and "built:" in first.err and "batch 1..2" in first.err
    assert "verified against ONNX Runtime CPU" in first.err
    assert run_build_engine(args, config) == 0
    assert "found in cache" in capsys.readouterr().err
    assert run_build_engine(parser.parse_args(["build-engine", "--max-batch", "2", "--force"]), config) == 0
    assert "built:" in capsys.readouterr().err


def test_build_engine_without_tensorrt(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails
    parser = argparse.ArgumentParser()
    add_build_engine_parser(parser.add_subparsers(dest="command"))
    config = SimpleNamespace(model=SimpleNamespace(path=tmp_path / "m.onnx"), engine=None)
    assert run_build_engine(parser.parse_args(["build-engine"]), config) == 69
    assert "tensorrt Python package is not installed" in capsys.readouterr().err
