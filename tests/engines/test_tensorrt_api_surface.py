"""Every TensorRT name the backend, its typed Protocols and the fake use exists in the real bindings.

The names come from NVIDIA's ``tensorrt_cu13_bindings`` wheels 10.16.1.11 and 11.4.0.106, read out of the
pybind11 extension by tools/extract_trt_api.py (committed under tests/engines/data with the wheel's sha256).
Three checks per version: (1) the Protocols in ``streamd/engines/trt_protocols.py`` (what mypy holds the
backend to) name only real members, except members ``VERSION_ONLY`` assigns to the other version, which must
really be missing there; (2) the fake defines only real names; (3) running the backend against the fake
records what it reads, and all of it is real for that version, with the version-specific branches picking the
right names.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from streamd.engines import trt_protocols
from streamd.engines.options import EngineOptions
from streamd.engines.tensorrt import TensorRTEngine
from streamd.gpu.cuda import Stream
from tests.engines.fake_tensorrt import make_fakes, public_names
from tests.engines.tiny_models import random_images

DATA = Path(__file__).parent / "data"
VERSIONS = {10: "10.16.1.11", 11: "11.4.0.106"}

# Protocol class -> owner name in the bindings (module level is "tensorrt").
OWNERS = {"TensorRTModule": "tensorrt"}
SKIP_PROTOCOLS = {"EnumValue"}  # typing helper: pybind11 enum members' own __int__


class RealAPI:
    def __init__(self, version: str) -> None:
        text = (DATA / f"trt_api_{version}.txt").read_text()
        self.header = [line for line in text.splitlines() if line.startswith("#")]
        self.enums: dict[str, set[str]] = {}
        self.names: set[str] = set()
        section = None
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                section = line.strip("[]")
                if section.startswith("enum "):
                    self.enums[section[5:]] = set()
                continue
            if section == "names":
                self.names.add(line)
            elif section and section.startswith("enum "):
                self.enums[section[5:]].add(line)

    def has(self, owner: str, member: str) -> bool:
        if owner in self.enums:
            return member in self.enums[owner]
        return member in self.names and (owner == "tensorrt" or owner.split(".")[-1] in self.names)


@pytest.fixture(scope="module", params=sorted(VERSIONS), ids=["trt10", "trt11"])
def api(request: pytest.FixtureRequest) -> tuple[int, RealAPI]:
    return request.param, RealAPI(VERSIONS[request.param])


def protocol_members() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, cls in vars(trt_protocols).items():
        if not (inspect.isclass(cls) and getattr(cls, "_is_protocol", False)) or name in SKIP_PROTOCOLS:
            continue
        members = set(getattr(cls, "__annotations__", {}))
        members |= {n for n, v in vars(cls).items() if callable(v) or isinstance(v, property)}
        members = {m for m in members if not m.startswith("_") or m == "__version__"}
        out[OWNERS.get(name, name)] = members
    return out


def test_data_files_carry_provenance(api):
    major, real = api
    header = "\n".join(real.header)
    assert re.search(rf"wheel: tensorrt_cu13_bindings-{re.escape(VERSIONS[major])}-\S+\.whl", header)
    assert re.search(r"sha256: [0-9a-f]{64}", header)
    assert len(real.names) > 1000 and {"BuilderFlag", "DataType", "ILogger.Severity"} <= set(real.enums)


def test_protocols_name_only_real_members(api):
    major, real = api
    missing = []
    for owner, members in protocol_members().items():
        for member in members:
            only = trt_protocols.VERSION_ONLY.get(f"{owner}.{member}")
            present = real.has(owner, member)
            if only is None or only == major:
                if not present:
                    missing.append(f"{owner}.{member}")
            elif present:
                missing.append(f"{owner}.{member} (VERSION_ONLY says {only} only, but {major} has it)")
    assert not missing, f"TensorRT {VERSIONS[major]}: {missing}"


def test_version_only_names_are_really_gone(api):
    major, real = api
    for name, only in trt_protocols.VERSION_ONLY.items():
        owner, member = name.rsplit(".", 1)
        assert real.has(owner, member) == (only == major), name


def test_fake_defines_only_real_names(api):
    major, real = api
    fake, _ = make_fakes(VERSIONS[major])
    unreal = [
        f"{owner}.{m}"
        for owner, members in public_names(fake).items()
        for m in members
        if not real.has(owner, m)
    ]
    assert not unreal, f"the fake TensorRT {VERSIONS[major]} defines names the real one lacks: {unreal}"


def _exercise(version: str, models: dict[str, Path], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> set:
    """Drive every backend path against the fake of ``version``; return what it read."""
    trt, cuda = make_fakes(version)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    for precision, model in (("fp32", "dynamic"), ("fp16", "dynamic"), ("int8", "qdq"), ("fp32", "b1")):
        e = TensorRTEngine(
            models[model], EngineOptions(max_batch=4, precision=precision, cache_dir=tmp, cuda_api=cuda)
        )
        x = random_images(2)
        out = np.zeros((2, *e.output_shape[1:]), np.float32)
        e.enqueue(x.ctypes.data, out.ctypes.data, 2, Stream.borrow(3))
        e.enqueue(x.ctypes.data, out.ctypes.data, 2, Stream.borrow(4))
        e.infer(x)
        e.close()
    TensorRTEngine(
        models["dynamic"], EngineOptions(max_batch=4, precision="fp32", cache_dir=tmp, cuda_api=cuda)
    )  # cache hit
    bad = tmp / "bad.onnx"
    import onnx
    from onnx import helper

    m = onnx.load(str(models["dynamic"]))
    m.graph.node.append(helper.make_node("Celu", ["output0"], ["unused"]))
    onnx.save(m, str(bad))
    with pytest.raises(Exception, match="cannot parse"):
        TensorRTEngine(bad, EngineOptions(max_batch=2, precision="fp32", cache_dir=tmp, cuda_api=cuda))
    return set(trt._accessed)


def test_backend_reads_only_real_names(api, models, tmp_path, monkeypatch):
    major, real = api
    accessed = _exercise(VERSIONS[major], models, tmp_path, monkeypatch)
    unreal = sorted(f"{o}.{n}" for o, n in accessed if not real.has(o, n))
    assert not unreal, f"the backend read names TensorRT {VERSIONS[major]} does not have: {unreal}"
    # The version-specific branches took the names of their version.
    if major >= 11:
        assert ("ICudaEngine", "device_memory_size_v2") in accessed
        assert ("NetworkDefinitionCreationFlag", "STRONGLY_TYPED") in accessed
        assert not {n for o, n in accessed if o == "BuilderFlag"}
        assert ("ICudaEngine", "device_memory_size") not in accessed
    else:
        assert {
            ("BuilderFlag", "FP16"),
            ("BuilderFlag", "INT8"),
            ("ICudaEngine", "device_memory_size"),
        } <= accessed
    assert ("IExecutionContext", "execute_async_v3") in accessed
    assert {("ParserError", n) for n in ("desc", "node", "node_name", "node_operator")} <= accessed
