"""Kernel arguments packed once: the address array the driver reads points at each value, in order, and
stays valid while the PackedArgs lives (no CUDA needed)."""

from __future__ import annotations

import ctypes
import gc

from streamd.gpu.kernels import PackedArgs


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float * 3), ("b", ctypes.c_int)]


def test_addresses_point_at_the_values_in_order() -> None:
    values = (ctypes.c_uint64(0xDEADBEEF000), ctypes.c_int(-7), ctypes.c_float(0.25), Pair((1, 2, 3), 9))
    packed = PackedArgs(values)
    del values
    gc.collect()  # the values must be kept alive by the PackedArgs, not by the caller
    ptrs = (ctypes.c_void_p * 4).from_address(packed.address)
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0xDEADBEEF000
    assert ctypes.c_int.from_address(ptrs[1]).value == -7
    assert ctypes.c_float.from_address(ptrs[2]).value == 0.25
    pair = Pair.from_address(ptrs[3])
    assert list(pair.a) == [1.0, 2.0, 3.0] and pair.b == 9
    assert [ptrs[i] for i in range(4)] == [ctypes.addressof(v) for v in packed.args]
