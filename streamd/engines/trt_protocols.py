"""The part of the ``tensorrt`` module streamd uses (TensorRT 10.x and 11.x), as typing Protocols: only the
members ``tensorrt.py`` and ``trt_build.py`` touch. PyPI's ``tensorrt-stubs`` is unusable with mypy, so mypy
proves through these that the backend uses no other name, and tests/engines/test_tensorrt_api_surface.py
proves every name here exists in the real bindings (read out of NVIDIA's wheels, tools/extract_trt_api.py).
``VERSION_ONLY``: names of one major version only; the backend reaches them in that version's branch only.
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


class EnumValue(Protocol):  # a pybind11 enum member
    def __int__(self) -> int: ...


class BuilderFlag(Protocol):
    FP16: EnumValue
    INT8: EnumValue


class NetworkDefinitionCreationFlag(Protocol):
    STRONGLY_TYPED: EnumValue  # its value differs between 10 and 11: always use 1 << int(flag)


class MemoryPoolType(Protocol):
    WORKSPACE: EnumValue


class TensorIOMode(Protocol):
    INPUT: EnumValue


class DataType(Protocol):
    FLOAT: EnumValue
    HALF: EnumValue
    INT8: EnumValue
    INT32: EnumValue
    INT64: EnumValue
    BOOL: EnumValue
    UINT8: EnumValue


class IHostMemory(Protocol):
    """A serialized plan or timing cache, read through the buffer protocol (``memoryview``)."""


class INetworkDefinition(Protocol):
    @property
    def num_inputs(self) -> int: ...

    @property
    def num_outputs(self) -> int: ...


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


class TensorRTModule(Protocol):
    """The ``tensorrt`` module."""

    __version__: str
    ILogger: Any  # base class the backend subclasses (``log(severity, msg)``; ``ILogger.Severity``)
    IProgressMonitor: Any  # base class: phase_start / step_complete / phase_finish
    Builder: Callable[[Any], Builder]
    OnnxParser: Callable[[INetworkDefinition, Any], OnnxParser]
    Runtime: Callable[[Any], Runtime]
    BuilderFlag: BuilderFlag
    NetworkDefinitionCreationFlag: NetworkDefinitionCreationFlag
    MemoryPoolType: MemoryPoolType
    TensorIOMode: TensorIOMode
    DataType: DataType
