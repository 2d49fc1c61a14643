"""The CUDA driver helper used by the TensorRT engine (events, stream capture, memory), on a real GPU.

TensorRT itself cannot run on the reference GPU box; this checks the other half of its run path: a capture on
a caller's stream of work launched by someone else (here a torch kernel, there ``execute_async_v3``), graph
launch, event ordering, and the host round trip used by ``infer``. Skipped without CUDA, cuda-python or torch.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.bindings")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    from streamd.gpu.driver_api import DriverApi

    torch.cuda.init()  # the primary context, shared with torch
    api = DriverApi(0)
    yield api
    api.close()
    api.close()


def test_device_info(cuda):
    name, cc = cuda.device_info(0)
    assert name == torch.cuda.get_device_name(0)
    assert cc == torch.cuda.get_device_capability(0)


def test_capture_foreign_work_on_callers_stream_and_launch(cuda):
    stream = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        cuda.begin_capture(stream.cuda_stream)
        x.mul_(2)  # captured, not run
        x.add_(1)
        graph = cuda.end_capture(stream.cuda_stream)
    stream.synchronize()
    assert float(x[0]) == 1.0
    for _ in range(3):
        cuda.graph_launch(graph, stream.cuda_stream)
    stream.synchronize()
    assert float(x[0]) == ((1 * 2 + 1) * 2 + 1) * 2 + 1
    cuda.graph_destroy(graph)


def test_failed_capture_is_abandoned_cleanly(cuda):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        cuda.begin_capture(stream.cuda_stream)
        with pytest.raises(RuntimeError):
            torch.cuda.synchronize()  # not allowed while capturing: invalidates the capture
        cuda.abort_capture(stream.cuda_stream)
    y = torch.ones(4, device="cuda") * 3  # the device still works
    assert float(y.sum()) == 12.0


def test_events_order_two_streams(cuda):
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(1 << 22, device="cuda")
    event = cuda.event_create()
    with torch.cuda.stream(s1):
        torch.cuda._sleep(200_000_000)
        x.fill_(7)
    cuda.event_record(event, s1.cuda_stream)
    cuda.stream_wait_event(s2.cuda_stream, event)
    with torch.cuda.stream(s2):
        y = x * 2
    s2.synchronize()
    assert float(y.min()) == 14.0
    cuda.event_destroy(event)


def test_memory_round_trip(cuda):
    host = np.arange(1000, dtype=np.float32)
    back = np.zeros_like(host)
    ptr = cuda.mem_alloc(host.nbytes)
    stream = cuda.stream_create()
    cuda.copy_to_device(ptr, host)
    cuda.stream_synchronize(stream)
    cuda.copy_to_host(back, ptr)
    cuda.mem_free(ptr)
    cuda.stream_destroy(stream)
    np.testing.assert_array_equal(host, back)
