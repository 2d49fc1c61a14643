"""Typed view of the part of the ``tensorrt`` Python module that streamd uses (TensorRT 10.x and 11.x).

PyPI's ``tensorrt-stubs`` is unusable with mypy, so the backend types ``tensorrt`` through these Protocols:
mypy then proves that ``tensorrt.py`` touches no name outside this file, and
``tests/engines/test_tensorrt_api_surface.py`` proves that every name here exists in the real bindings of the
versions that use it (names read out of the ``tensorrt_cu13_bindings`` wheels, see tools/extract_trt_api.py).

Names that exist in one major version only are listed in ``VERSION_ONLY``; the backend reaches them only in
that version's branch (the contract tests check that against the fake module of each version).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

# "Class.member" -> the only TensorRT major version that has it (all other names are in both 10 and 11).
VERSION_ONLY: dict[str, int] = {
    "BuilderFlag.FP16": 10,  # TRT 11: precision comes from the (strongly typed) network
    "BuilderFlag.INT8": 10,
    "ICudaEngine.device_memory_size": 10,  # TRT 11: device_memory_size_v2 only
}


class EnumValue(Protocol):
    """A pybind11 enum member: usable as a key and convertible to int."""

    def __int__(self) -> int: ...

    @property
    def name(self) -> str: ...


class Severity(Protocol):  # ILogger.Severity
    INTERNAL_ERROR: EnumValue
    ERROR: EnumValue
    WARNING: EnumValue
    INFO: EnumValue
    VERBOSE: EnumValue


class BuilderFlag(Protocol):
    FP16: EnumValue  # TRT 10 only
    INT8: EnumValue  # TRT 10 only


class NetworkDefinitionCreationFlag(Protocol):
    STRONGLY_TYPED: EnumValue  # value differs between 10 and 11: always use 1 << int(flag)


class MemoryPoolType(Protocol):
    WORKSPACE: EnumValue


class TensorIOMode(Protocol):
    INPUT: EnumValue
    OUTPUT: EnumValue


class DataType(Protocol):
    FLOAT: EnumValue
    HALF: EnumValue
    BF16: EnumValue
    INT8: EnumValue
    INT32: EnumValue
    INT64: EnumValue
    BOOL: EnumValue
    UINT8: EnumValue


class IHostMemory(Protocol):
    """Serialized plan or timing cache; supports the buffer protocol (``memoryview(mem)``)."""

    @property
    def nbytes(self) -> int: ...


class ITensor(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> Sequence[int]: ...

    @property
    def dtype(self) -> EnumValue: ...


class INetworkDefinition(Protocol):
    @property
    def num_inputs(self) -> int: ...

    @property
    def num_outputs(self) -> int: ...

    def get_input(self, index: int) -> ITensor: ...

    def get_output(self, index: int) -> ITensor: ...


class ParserError(Protocol):
    def code(self) -> EnumValue: ...

    def desc(self) -> str: ...

    def file(self) -> str: ...

    def line(self) -> int: ...

    def func(self) -> str: ...

    def node(self) -> int: ...

    def node_name(self) -> str: ...

    def node_operator(self) -> str: ...


class OnnxParser(Protocol):
    @property
    def num_errors(self) -> int: ...

    def get_error(self, index: int) -> ParserError: ...

    def parse_from_file(self, model: str) -> bool: ...


class IOptimizationProfile(Protocol):
    def set_shape(self, input: str, min: Sequence[int], opt: Sequence[int], max: Sequence[int]) -> None: ...


class ITimingCache(Protocol):
    def serialize(self) -> IHostMemory: ...


class IBuilderConfig(Protocol):
    progress_monitor: Any  # an IProgressMonitor subclass instance
    builder_optimization_level: int

    def set_memory_pool_limit(self, pool: EnumValue, pool_size: int) -> None: ...

    def set_flag(self, flag: EnumValue) -> None: ...

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int: ...

    def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache: ...

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool: ...

    def get_timing_cache(self) -> ITimingCache | None: ...


class Builder(Protocol):
    def create_network(self, flags: int = 0) -> INetworkDefinition: ...

    def create_builder_config(self) -> IBuilderConfig: ...

    def create_optimization_profile(self) -> IOptimizationProfile: ...

    def build_serialized_network(
        self, network: INetworkDefinition, config: IBuilderConfig
    ) -> IHostMemory | None: ...


class IExecutionContext(Protocol):
    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool: ...

    def get_tensor_shape(self, name: str) -> Sequence[int]: ...

    def set_tensor_address(self, name: str, memory: int) -> bool: ...

    def execute_async_v3(self, stream_handle: int) -> bool: ...


class ICudaEngine(Protocol):
    @property
    def num_io_tensors(self) -> int: ...

    @property
    def device_memory_size(self) -> int: ...  # TRT 10 only

    @property
    def device_memory_size_v2(self) -> int: ...

    def get_tensor_name(self, index: int) -> str: ...

    def get_tensor_mode(self, name: str) -> EnumValue: ...

    def get_tensor_dtype(self, name: str) -> EnumValue: ...

    def get_tensor_shape(self, name: str) -> Sequence[int]: ...

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> Sequence[Sequence[int]]: ...

    def create_execution_context(self) -> IExecutionContext | None: ...


class Runtime(Protocol):
    def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None: ...


class ILoggerClass(Protocol):
    """``tensorrt.ILogger``: subclassed by the backend (``log(severity, msg)``)."""

    Severity: Severity


class TensorRTModule(Protocol):
    """The ``tensorrt`` module."""

    __version__: str
    ILogger: Any  # base class; its ``Severity`` enum is typed by ILoggerClass
    IProgressMonitor: Any  # base class: phase_start / step_complete / phase_finish
    Builder: Callable[[Any], Builder]
    OnnxParser: Callable[[INetworkDefinition, Any], OnnxParser]
    Runtime: Callable[[Any], Runtime]
    BuilderFlag: BuilderFlag
    NetworkDefinitionCreationFlag: NetworkDefinitionCreationFlag
    MemoryPoolType: MemoryPoolType
    TensorIOMode: TensorIOMode
    DataType: DataType
