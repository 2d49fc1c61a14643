"""A fake ``tensorrt`` module (10.x or 11.x flavour) and a fake CUDA, for driving the TensorRT backend on a
CPU.

``make_fakes(version)`` returns ``(module, cuda)``. The module has the classes and enums the backend uses,
with the differences between 10 and 11 that matter (no ``BuilderFlag.FP16/INT8`` and no
``ICudaEngine.device_memory_size`` in 11; ``STRONGLY_TYPED`` has another value). Every public attribute read
on the module, its classes and their objects is recorded in ``module._accessed`` as ``(owner, name)``, owners
named as in the real bindings, so the API-surface test can check them against the real names.

"Device memory" is host memory: pointers are host addresses, and ``execute_async_v3`` runs the parsed ONNX
with ONNX Runtime on the CPU, reading and writing at the bound addresses; while the fake CUDA captures a
stream the execution is recorded instead, and a graph launch replays it. Plans are JSON that names the parsed
ONNX file.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import json
import types
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import onnxruntime as ort

PLAN_MAGIC = b"FAKEPLAN"
CACHE_MAGIC = b"FAKETC"


class _Recorder:
    """Shared by one fake module: where accesses are recorded."""

    def __init__(self) -> None:
        self.accessed: set[tuple[str, str]] = set()


class _RecordedMeta(type):
    """Records public class-attribute reads on the fake classes themselves (not on subclasses the backend
    defines, whose own names are not binding names)."""

    def __getattribute__(cls, name: str) -> Any:
        if not name.startswith("_"):
            own = type.__getattribute__(cls, "__dict__")
            rec = own.get("_rec")
            if rec is not None:
                rec.accessed.add((own["_owner"], name))
        return type.__getattribute__(cls, name)


class _RecordedEnumMeta(enum.EnumMeta):
    def __getattribute__(cls, name: str) -> Any:
        if not name.startswith("_"):
            own = type.__getattribute__(cls, "__dict__")
            rec = own.get("_rec")
            if rec is not None:
                rec.accessed.add((own["_owner"], name))
        return super().__getattribute__(name)


class _Obj(metaclass=_RecordedMeta):
    """Base of fake binding objects: records public attribute reads on instances of the fake classes."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            own = type(self).__dict__
            rec = own.get("_rec")
            if rec is not None:
                rec.accessed.add((own["_owner"], name))
        return object.__getattribute__(self, name)


def _make_enum(name: str, owner: str, members: dict[str, int], rec: _Recorder) -> Any:
    classdict = _RecordedEnumMeta.__prepare__(name, (enum.IntEnum,))
    for key, value in members.items():
        classdict[key] = value
    made = _RecordedEnumMeta(name, (enum.IntEnum,), classdict)
    type.__setattr__(made, "_owner", owner)
    type.__setattr__(made, "_rec", rec)
    return made


def make_fakes(version: str = "10.16.1.11", gpu: tuple[str, tuple[int, int]] = ("NVIDIA H200", (9, 0))):
    """A fresh fake ``tensorrt`` module of ``version`` and a ``FakeCuda`` bound to it."""
    major = int(version.split(".")[0])
    rec = _Recorder()
    mod = types.ModuleType("tensorrt")
    mod.__version__ = version
    mod._accessed = rec.accessed  # type: ignore[attr-defined]
    mod._major = major  # type: ignore[attr-defined]
    mod._builds = []  # type: ignore[attr-defined]  # one dict per build_serialized_network call
    mod._network_flags = []  # type: ignore[attr-defined]

    def cls(name: str, owner: str | None = None, base: type = _Obj) -> Any:
        def deco(body: type) -> type:
            ns = {k: v for k, v in body.__dict__.items() if k not in ("__dict__", "__weakref__")}
            ns["_owner"], ns["_rec"] = owner or name, rec
            return _RecordedMeta(name, (base,), ns)

        return deco

    # -- enums -----------------------------------------------------------------------------------------------
    flags = {"DEBUG": 0, "GPU_FALLBACK": 1, "REFIT": 2, "TF32": 3}
    if major < 11:
        flags |= {"FP16": 10, "INT8": 11, "BF16": 12}
    mod.BuilderFlag = _make_enum("BuilderFlag", "BuilderFlag", flags, rec)
    net_flags = {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1} if major < 11 else {"STRONGLY_TYPED": 0}
    mod.NetworkDefinitionCreationFlag = _make_enum(
        "NetworkDefinitionCreationFlag", "NetworkDefinitionCreationFlag", net_flags, rec
    )
    mod.MemoryPoolType = _make_enum(
        "MemoryPoolType", "MemoryPoolType", {"WORKSPACE": 0, "TACTIC_SHARED_MEMORY": 3}, rec
    )
    mod.TensorIOMode = _make_enum("TensorIOMode", "TensorIOMode", {"NONE": 0, "INPUT": 1, "OUTPUT": 2}, rec)
    dtypes = {"FLOAT": 0, "HALF": 1, "INT8": 2, "INT32": 3, "BOOL": 4, "UINT8": 5, "BF16": 7, "INT64": 8}
    mod.DataType = _make_enum("DataType", "DataType", dtypes, rec)
    severity = _make_enum(
        "Severity",
        "ILogger.Severity",
        {"INTERNAL_ERROR": 0, "ERROR": 1, "WARNING": 2, "INFO": 3, "VERBOSE": 4},
        rec,
    )
    # The fake's own code reads members by item (not recorded): only the backend's reads are recorded.
    ERROR = severity["ERROR"]
    STRONGLY_BIT = 1 << net_flags["STRONGLY_TYPED"]
    WORKSPACE = mod.MemoryPoolType["WORKSPACE"]
    INPUT, OUTPUT = mod.TensorIOMode["INPUT"], mod.TensorIOMode["OUTPUT"]
    FLOAT = mod.DataType["FLOAT"]

    # -- base classes the backend subclasses -----------------------------------------------------------------
    @cls("ILogger")
    class ILogger:
        Severity = severity

        def __init__(self) -> None:
            pass

        def log(self, severity: Any, msg: str) -> None:
            raise NotImplementedError

    @cls("IProgressMonitor")
    class IProgressMonitor:
        def __init__(self) -> None:
            pass

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            raise NotImplementedError

        def step_complete(self, phase_name: str, step: int) -> bool:
            raise NotImplementedError

        def phase_finish(self, phase_name: str) -> None:
            raise NotImplementedError

    mod.ILogger, mod.IProgressMonitor = ILogger, IProgressMonitor

    # -- network, parser -------------------------------------------------------------------------------------
    @cls("ITensor")
    class ITensor:
        def __init__(self, name: str, shape: tuple[int, ...]) -> None:
            self._name, self._shape = name, shape

        @property
        def name(self) -> str:
            return self._name

        @property
        def shape(self) -> tuple[int, ...]:
            return self._shape

        @property
        def dtype(self) -> Any:
            return FLOAT

    @cls("INetworkDefinition")
    class INetworkDefinition:
        def __init__(self, flags: int) -> None:
            self._flags = flags
            self._inputs: list[Any] = []
            self._outputs: list[Any] = []
            self._onnx: str | None = None

        @property
        def num_inputs(self) -> int:
            return len(self._inputs)

        @property
        def num_outputs(self) -> int:
            return len(self._outputs)

        def get_input(self, index: int) -> Any:
            return self._inputs[index]

        def get_output(self, index: int) -> Any:
            return self._outputs[index]

    @cls("ParserError")
    class ParserError:
        def __init__(self, node: int, name: str, op: str, desc: str) -> None:
            self._node, self._name, self._op, self._desc = node, name, op, desc

        def code(self) -> str:
            return "ErrorCode.UNSUPPORTED_NODE"

        def desc(self) -> str:
            return self._desc

        def file(self) -> str:
            return "ModelImporter.cpp"

        def line(self) -> int:
            return 949

        def func(self) -> str:
            return "parseNode"

        def node(self) -> int:
            return self._node

        def node_name(self) -> str:
            return self._name

        def node_operator(self) -> str:
            return self._op

    @cls("OnnxParser")
    class OnnxParser:
        _SUPPORTED: ClassVar[set[str]] = {
            "Conv", "LeakyRelu", "Pad", "MaxPool", "Resize", "Reshape", "Concat", "Split", "Sigmoid", "Mul",
            "Add", "Cast", "Softmax", "MatMul", "Transpose", "QuantizeLinear", "DequantizeLinear",
        }  # fmt: skip

        def __init__(self, network: Any, logger: Any) -> None:
            self._network, self._logger, self._errors = network, logger, []
            self._supported = self._SUPPORTED

        @property
        def num_errors(self) -> int:
            return len(self._errors)

        def get_error(self, index: int) -> Any:
            return self._errors[index]

        def parse_from_file(self, model: str) -> bool:
            m = onnx.load(model)
            for i, node in enumerate(m.graph.node):
                if node.op_type not in self._supported:
                    self._errors.append(
                        ParserError(
                            i, node.name, node.op_type, f"No importer registered for op: {node.op_type}"
                        )
                    )
            if self._errors:
                return False

            def dims(vi: Any) -> tuple[int, ...]:
                return tuple(
                    d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim
                )

            self._network._inputs = [ITensor(i.name, dims(i)) for i in m.graph.input]
            self._network._outputs = [ITensor(o.name, dims(o)) for o in m.graph.output]
            self._network._onnx = model
            return True

    # -- builder ---------------------------------------------------------------------------------------------
    @cls("IHostMemory", base=bytes)
    class IHostMemory:
        @property
        def nbytes(self) -> int:
            return len(self)

    @cls("ITimingCache")
    class ITimingCache:
        def __init__(self, entries: int) -> None:
            self._entries = entries

        def serialize(self) -> Any:
            return IHostMemory(CACHE_MAGIC + json.dumps({"entries": self._entries}).encode())

    @cls("IOptimizationProfile")
    class IOptimizationProfile:
        def __init__(self) -> None:
            self._shapes: dict[str, tuple[tuple[int, ...], ...]] = {}

        def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:
            self._shapes[input] = (tuple(min), tuple(opt), tuple(max))

    @cls("IBuilderConfig")
    class IBuilderConfig:
        def __init__(self) -> None:
            self.progress_monitor = None
            self.builder_optimization_level = 3
            self._pools: dict[Any, int] = {}
            self._flags: set[Any] = set()
            self._profiles: list[Any] = []
            self._cache: Any = None

        def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None:
            self._pools[pool] = pool_size

        def set_flag(self, flag: Any) -> None:
            assert isinstance(flag, mod.BuilderFlag), flag
            self._flags.add(flag)

        def add_optimization_profile(self, profile: Any) -> int:
            self._profiles.append(profile)
            return len(self._profiles) - 1

        def create_timing_cache(self, serialized_timing_cache: bytes) -> Any:
            data = bytes(serialized_timing_cache)
            if not data:
                return ITimingCache(0)
            if not data.startswith(CACHE_MAGIC):
                raise RuntimeError("timing cache: bad magic")
            return ITimingCache(json.loads(data[len(CACHE_MAGIC) :])["entries"])

        def set_timing_cache(self, cache: Any, ignore_mismatch: bool) -> bool:
            self._cache = cache
            return True

        def get_timing_cache(self) -> Any:
            return self._cache

    @cls("Builder")
    class Builder:
        def __init__(self, logger: Any) -> None:
            self._logger = logger

        def create_network(self, flags: int = 0) -> Any:
            mod._network_flags.append(flags)
            return INetworkDefinition(flags)

        def create_builder_config(self) -> Any:
            return IBuilderConfig()

        def create_optimization_profile(self) -> Any:
            return IOptimizationProfile()

        def build_serialized_network(self, network: Any, config: Any) -> Any:
            strongly = bool(network._flags & STRONGLY_BIT)
            inp = network._inputs[0]
            dynamic = inp._shape[0] == -1
            if dynamic and not config._profiles:
                self._logger.log(ERROR, "Network has dynamic or shape inputs, but no optimization profile")
                return None
            if major >= 11 and not strongly:
                self._logger.log(ERROR, "weakly typed networks are not supported")
                return None
            record = {
                "flags": sorted(f.name for f in config._flags),
                "strongly_typed": strongly,
                "workspace": config._pools.get(WORKSPACE),
                "opt_level": object.__getattribute__(config, "builder_optimization_level"),
                "profile": config._profiles[0]._shapes.get(inp._name) if config._profiles else None,
                "timing_cache_in": config._cache._entries if config._cache else None,
            }
            mod._builds.append(record)
            monitor = object.__getattribute__(config, "progress_monitor")
            if monitor is not None:
                monitor.phase_start("Building engine", None, 2)
                for step in range(2):
                    monitor.phase_start("Tactic timing", "Building engine", 3)
                    for inner in range(3):
                        if not monitor.step_complete("Tactic timing", inner):
                            monitor.phase_finish("Tactic timing")
                            monitor.phase_finish("Building engine")
                            self._logger.log(ERROR, "build cancelled by the progress monitor")
                            return None
                    monitor.phase_finish("Tactic timing")
                    monitor.step_complete("Building engine", step)
                monitor.phase_finish("Building engine")
            if config._cache is not None:
                config._cache._entries += 1
            plan = {
                "version": version,
                "onnx": network._onnx,
                "input": inp._name,
                "input_shape": list(inp._shape),
                "output": network._outputs[0]._name,
                "profile": [list(s) for s in record["profile"]] if record["profile"] else None,
                **{k: record[k] for k in ("flags", "strongly_typed")},
            }
            return IHostMemory(PLAN_MAGIC + json.dumps(plan).encode())

    # -- runtime ---------------------------------------------------------------------------------------------
    @cls("IExecutionContext")
    class IExecutionContext:
        def __init__(self, engine: Any) -> None:
            self._engine = engine
            self._shape: tuple[int, ...] | None = None
            self._addr: dict[str, int] = {}

        def set_input_shape(self, name: str, shape: Any) -> bool:
            shape = tuple(shape)
            lo, _, hi = self._engine._profile
            if name != self._engine._plan["input"] or len(shape) != len(lo):
                return False
            if not all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True)):
                return False
            self._shape = shape
            return True

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            if name == self._engine._plan["input"]:
                return self._shape or tuple(self._engine._plan["input_shape"])
            return (
                (self._shape[0], *self._engine._out_per_image)
                if self._shape
                else (-1, *self._engine._out_per_image)
            )

        def set_tensor_address(self, name: str, memory: int) -> bool:
            if not memory:
                return False
            self._addr[name] = int(memory)
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            plan = self._engine._plan
            if self._shape is None or set(self._addr) != {plan["input"], plan["output"]}:
                return False
            shape, a_in, a_out = self._shape, self._addr[plan["input"]], self._addr[plan["output"]]
            run = lambda: self._engine._run(shape, a_in, a_out)  # noqa: E731
            return cuda._submit(int(stream_handle), run)

    @cls("ICudaEngine")
    class ICudaEngine:
        def __init__(self, plan: dict[str, Any]) -> None:
            self._plan = plan
            shape = tuple(plan["input_shape"])
            self._profile = (
                tuple(tuple(s) for s in plan["profile"]) if plan["profile"] else (shape, shape, shape)
            )
            self._session = ort.InferenceSession(plan["onnx"], providers=["CPUExecutionProvider"])
            probe = np.zeros((max(shape[0], 1), *shape[1:]), np.float32)  # a fixed batch N: N rows
            self._out_per_image = tuple(self._session.run(None, {plan["input"]: probe})[0].shape[1:])

        def _run(self, shape: tuple[int, ...], a_in: int, a_out: int) -> None:
            n = int(np.prod(shape))
            x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(a_in)).reshape(shape)
            y = self._session.run(None, {self._plan["input"]: x.copy()})[0].astype(np.float32)
            ctypes.memmove(a_out, y.ctypes.data, y.nbytes)

        @property
        def num_io_tensors(self) -> int:
            return 2

        @property
        def device_memory_size_v2(self) -> int:
            return 1 << 20

        def get_tensor_name(self, index: int) -> str:
            return (self._plan["input"], self._plan["output"])[index]

        def get_tensor_mode(self, name: str) -> Any:
            return INPUT if name == self._plan["input"] else OUTPUT

        def get_tensor_dtype(self, name: str) -> Any:
            return FLOAT

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            if name == self._plan["input"]:
                return tuple(self._plan["input_shape"])
            return (self._plan["input_shape"][0], *self._out_per_image)

        def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
            return [tuple(s) for s in self._profile]

        def create_execution_context(self) -> Any:
            return IExecutionContext(self)

    if major < 11:
        ICudaEngine.device_memory_size = property(lambda self: 1 << 20)

    @cls("Runtime")
    class Runtime:
        def __init__(self, logger: Any) -> None:
            self._logger = logger

        def deserialize_cuda_engine(self, serialized_engine: bytes) -> Any:
            data = bytes(serialized_engine)
            if not data.startswith(PLAN_MAGIC):
                self._logger.log(ERROR, "Serialization assertion failed: magic tag mismatch")
                return None
            plan = json.loads(data[len(PLAN_MAGIC) :])
            if plan["version"] != version:
                self._logger.log(ERROR, f"plan built by TensorRT {plan['version']}, this is {version}")
                return None
            return ICudaEngine(plan)

    made = (ITensor, INetworkDefinition, ParserError, OnnxParser, IHostMemory, ITimingCache)
    made += (IOptimizationProfile, IBuilderConfig, Builder, IExecutionContext, ICudaEngine, Runtime)
    for c in made:
        setattr(mod, c.__name__, c)
    cuda = FakeCuda(gpu)
    return _RecordingModule(mod, rec), cuda


class _RecordingModule(types.ModuleType):
    """The module object handed to the backend: records public attribute reads as ("tensorrt", name)."""

    def __init__(self, inner: types.ModuleType, rec: _Recorder) -> None:
        super().__init__("tensorrt")
        self.__dict__.update(inner.__dict__)
        object.__setattr__(self, "_rec_ref", rec)

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            object.__getattribute__(self, "_rec_ref").accessed.add(("tensorrt", name))
        return object.__getattribute__(self, name)


class FakeCuda:
    """``CudaApi`` on host memory. Streams run work immediately unless captured; graphs replay captured
    work."""

    def __init__(self, gpu: tuple[str, tuple[int, int]]) -> None:
        self.gpu = gpu
        self.calls: list[tuple[Any, ...]] = []
        self._ids = itertools.count(1000)
        self._capturing: dict[int, list[Any]] = {}
        self._graphs: dict[int, list[Any]] = {}
        self._buffers: dict[int, np.ndarray] = {}
        self.fail_capture = False

    def _submit(self, stream: int, work: Any) -> bool:
        if stream in self._capturing:
            self._capturing[stream].append(work)
        else:
            work()
        return True

    def device_info(self, device: int) -> tuple[str, tuple[int, int]]:
        return self.gpu

    def event_create(self) -> int:
        return next(self._ids)

    def event_record(self, event: int, stream: int) -> None:
        self.calls.append(("record", event, stream))

    def stream_wait_event(self, stream: int, event: int) -> None:
        self.calls.append(("wait", stream, event))

    def event_destroy(self, event: int) -> None:
        self.calls.append(("event_destroy", event))

    def begin_capture(self, stream: int) -> None:
        if self.fail_capture:
            from streamd.gpu.cuda import CUDAError

            raise CUDAError("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "fake", "cuStreamBeginCapture")
        assert stream not in self._capturing
        self._capturing[stream] = []
        self.calls.append(("begin_capture", stream))

    def end_capture(self, stream: int) -> int:
        graph = next(self._ids)
        self._graphs[graph] = self._capturing.pop(stream)
        self.calls.append(("end_capture", stream, graph))
        return graph

    def abort_capture(self, stream: int) -> None:
        self._capturing.pop(stream, None)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        self.calls.append(("launch", graph_exec, stream))
        for work in self._graphs[graph_exec]:
            work()

    def graph_destroy(self, graph_exec: int) -> None:
        self._graphs.pop(graph_exec)

    def stream_create(self) -> int:
        return next(self._ids)

    def stream_synchronize(self, stream: int) -> None:
        pass

    def stream_destroy(self, stream: int) -> None:
        pass

    def mem_alloc(self, nbytes: int) -> int:
        buf = np.zeros(max(nbytes, 1), np.uint8)
        self._buffers[buf.ctypes.data] = buf
        return buf.ctypes.data

    def mem_free(self, ptr: int) -> None:
        del self._buffers[ptr]

    def copy_to_device(self, dst: int, src: np.ndarray) -> None:
        ctypes.memmove(dst, src.ctypes.data, src.nbytes)

    def copy_to_host(self, dst: np.ndarray, src: int) -> None:
        ctypes.memmove(dst.ctypes.data, src, dst.nbytes)

    def close(self) -> None:  # DriverApi's (the engine closes a helper it made itself)
        self.calls.append(("close",))


def public_names(module: Any) -> dict[str, set[str]]:
    """owner -> public member names the fake defines (for the API-surface test)."""
    out: dict[str, set[str]] = {"tensorrt": {n for n in vars(module) if not n.startswith("_")}}
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if isinstance(value, _RecordedEnumMeta):
            out[name] = set(value.__members__)
        elif isinstance(value, _RecordedMeta) and "_owner" in type.__getattribute__(value, "__dict__"):
            members = {n for n in vars(value) if not n.startswith("_")}
            out[type.__getattribute__(value, "__dict__")["_owner"]] = members
            if name == "ILogger":
                out["ILogger.Severity"] = set(value.Severity.__members__)
    return out


__all__ = ["FakeCuda", "Path", "make_fakes", "public_names"]
