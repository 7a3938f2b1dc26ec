"""CUDA helpers of the device routes: cupy, torch's streams as cupy sees them, and the check of
the scales in stream order (:func:`_queue_then_check_scales`)."""

from __future__ import annotations

import math
import threading
import warnings

import numpy as np
import torch

from .rules import _non_finite_error, _refuse_non_finite


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _cupy_stream(cupy, stream, device_index: int):
    """cupy's view of a torch CUDA stream (the legacy default stream is cupy's null stream)."""
    if stream.cuda_stream == 0:
        return cupy.cuda.Stream.null
    if hasattr(stream, "__cuda_stream__") and hasattr(cupy.cuda.Stream, "from_external"):
        try:
            return cupy.cuda.Stream.from_external(stream)
        except (TypeError, ValueError, AttributeError):
            pass
    with warnings.catch_warnings():  # older cupy: the only way; newer: deprecated in favour of the above
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(stream.cuda_stream, device_index)


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream_ptr(device) -> int:
    """The ``cudaStream_t`` of torch's current stream on ``device`` (torch's C accessor when the
    build has it, as torch's compiled code uses it; else ``torch.cuda.current_stream``)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


class _ScaleProbe(threading.local):
    """Per thread and device: a pinned host buffer and an event, to read the scales in
    stream order without waiting for the GPU before the GEMM is queued."""

    def __init__(self):
        self.by_device = {}

    def get(self, cupy, device_index: int, n: int):
        rt = cupy.cuda.runtime
        probe = self.by_device.get(device_index)
        if probe is None or probe[1].size < n:
            if probe is not None:
                rt.eventDestroy(probe[2])
            mem = cupy.cuda.alloc_pinned_memory(4 * max(n, 2))
            host = np.frombuffer(mem, np.float32, max(n, 2))
            probe = self.by_device[device_index] = (mem, host, rt.eventCreateWithFlags(rt.eventDisableTiming))
        return probe


_probe = _ScaleProbe()


def _queue_then_check_scales(cupy, index, stream: int, scale_a, scale_b, rowwise: bool, prof, queue):
    """Queue a GEMM (``queue()``) on ``stream`` and refuse non-finite scales without waiting for
    the GPU before it is queued: the scales (one float32 each, or contiguous (M, 1) and (1, N))
    are copied in stream order to this thread's pinned buffer just before the GEMM, and the call
    waits only for that copy, i.e. for the work queued before, then checks them. Returns what
    ``queue()`` returns; a refused call raises instead, and the GEMM's output is dropped."""
    na, nb = (scale_a.numel(), scale_b.numel()) if rowwise else (1, 1)
    mem, host, event = _probe.get(cupy, index, na + nb)
    rt = cupy.cuda.runtime
    rt.memcpyAsync(mem.ptr, scale_a.data_ptr(), 4 * na, rt.memcpyDeviceToHost, stream)
    rt.memcpyAsync(mem.ptr + 4 * na, scale_b.data_ptr(), 4 * nb, rt.memcpyDeviceToHost, stream)
    rt.eventRecord(event, stream)
    try:
        result = queue()
    finally:  # the copies into this thread's pinned buffer are done before it is used again
        rt.eventSynchronize(event)
    if rowwise:
        _refuse_non_finite(host[:na], host[na:na + nb], prof)
    elif not (math.isfinite(host[0]) and math.isfinite(host[1])):
        raise _non_finite_error(prof)
    return result
