"""The routes of a checked call to a backend, tried in order by :func:`_route`.

* the tensor-core pointer path (:func:`_tensor_core_call`): CUDA tensors' pointers straight
  to ``cublasLtMatmul``, when the backend ladder picks ``cublaslt-tc``;
* the exact-kernel route (:func:`_exact_kernel_call`): the FP8 codes shared with cupy and
  computed by ``cuda-tiled`` or ``cuda-simple``, when the ladder picks one of them;
* the general route (:func:`_general_call`): the scales and the bias read on the host, then
  the backend the ladder picks for the call, on cupy views of CUDA operands
  (:func:`_gemm_on_device`) or on numpy views of CPU ones.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from .. import backends
from ..backends import EXACT_KERNELS as _EXACT_KERNELS
from ..backends import TENSOR_CORE as _TENSOR_CORE
from ..call import Operands
from ..memory import check_output
from .convert import _as_torch, _fp8_numpy, _host_numpy, _to_torch
from .device import _cupy, _cupy_stream, _current_stream_ptr, _queue_then_check_scales
from .dtypes import _FP8, _OUT
from .rules import _refuse_non_finite


def _route(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, rowwise: bool):
    """A checked call (tensorwise or rowwise scales, a non-empty shape) on the first route that
    takes it: for CUDA tensors (with cupy) the tensor-core pointer path, then the exact-kernel
    route; then the general route."""
    on_device = a.device.type == "cuda" and _cupy() is not None
    if on_device:  # both device paths take dense operands: made so once (a copy only if padded)
        a, b = _dense_operands(a, b)
        if backend in ("auto", _TENSOR_CORE):
            y = _tensor_core_call(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, rowwise)
            if y is not None:
                return y
        y = _exact_kernel_call(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, rowwise)
        if y is not None:
            return y
    return _general_call(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, rowwise, on_device)


def _device_codes(cupy, a, b):
    """cupy views (no copy) of dense CUDA operands' codes: a (M, K) and bt (N, K), C-contiguous."""
    return cupy.asarray(a.detach().view(torch.uint8)), cupy.asarray(b.detach().view(torch.uint8)).T


def _dense(a, b) -> tuple:
    """Whether ``a`` (M, K) is C-contiguous and ``b`` (K, N) the transpose of a C-contiguous (N, K)."""
    return (a.stride(1) == 1 and a.stride(0) == a.shape[1]), (b.stride(0) == 1 and b.stride(1) == b.shape[0])


def _dense_operands(a, b):
    """``a`` row-major and ``b`` column-major with padded leading dimensions (which torch
    accepts), made dense on the device: a (M, K) C-contiguous, b the transpose of a
    C-contiguous (N, K)."""
    dense_a, dense_b = _dense(a, b)
    if not dense_a:
        a = a.contiguous()
    if not dense_b:
        b = b.t().contiguous().t()
    return a, b


# --------------------------------------------------------------------------- tensor-core pointer path

def _call(prof, a, b, out_dt, rowwise: bool, bias, fast: bool):
    """The profile's :class:`~cpemu.call.Call` of a checked drop-in call (cached by the profile)."""
    return prof.call(a.shape[0], b.shape[1], a.shape[1], _FP8[a.dtype][1], _FP8[b.dtype][1], _OUT[out_dt],
                     "rowwise" if rowwise else "tensorwise", fast, None if bias is None else _OUT[bias.dtype])


_tc_signatures: dict = {}  # _tc_signature's decisions, per call signature


def _tc_signature(prof, backend, index, M, N, K, fa, fb, out_name, scaling, bias_name, fast):
    """The prepared cuBLASLt signature of a drop-in call on device ``index`` (current), or None
    when the backend ladder does not pick ``cublaslt-tc`` for ``prof`` or the path declines the
    call. Decided once per call signature: the ladder's choice, the profile's features, its plan
    and the prepared signature are fixed for a process. A call the profile refuses is not
    remembered and raises every time."""
    key = (id(prof), backend, index, M, N, K, fa, fb, out_name, scaling, bias_name, fast)
    hit = _tc_signatures.get(key)
    if hit is not None:  # (the profile itself, kept alive so that its id is not reused; the decision)
        return hit[1]
    from ..cuda import tensorcore as tc

    sig = None
    if backends.select(backend, prof) == _TENSOR_CORE:
        call = prof.call(M, N, K, fa, fb, out_name, scaling, fast, bias_name)
        try:
            sig = tc.signature(index, call)
        except tc.TensorCoreUnsupported:
            sig = None
    if len(_tc_signatures) > 4096:
        _tc_signatures.clear()
    _tc_signatures[key] = (prof, sig)
    return sig


def _tensor_core_call(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, rowwise: bool):
    """The drop-in's path to the device's tensor cores: pointers of the torch tensors go
    straight to ``cublasLtMatmul`` (:func:`cpemu.cuda.tensorcore.launch`) on torch's
    current stream, with the profile's plan, when the backend ladder picks ``cublaslt-tc``
    for this profile on this device (for the Ada profile after the zero-padding kernel). None
    when it does not apply (another backend, a call the path declines, operands not 256-byte
    aligned): the general path then computes the call. ``a`` and ``b`` are dense
    (:func:`_dense_operands`).

    Non-finite scales are refused as on the general path, but without waiting for the GPU
    before the GEMM is queued (:func:`_queue_then_check_scales`)."""
    cupy = _cupy()
    index = a.device.index
    if cupy.cuda.runtime.getDevice() == index:  # already current: no device switch
        return _tensor_core_call_on(cupy, index, a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum,
                                    backend, rowwise)
    with cupy.cuda.Device(index):
        return _tensor_core_call_on(cupy, index, a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum,
                                    backend, rowwise)


def _tensor_core_call_on(cupy, index, a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, rowwise):
    """:func:`_tensor_core_call` with device ``index`` current."""
    from ..cuda import tensorcore as tc

    M, K = a.shape
    N = b.shape[1]
    sig = _tc_signature(prof, backend, index, M, N, K, _FP8[a.dtype][1], _FP8[b.dtype][1], _OUT[out_dt],
                        "rowwise" if rowwise else "tensorwise",
                        None if bias is None else _OUT[bias.dtype], use_fast_accum)
    if sig is None:
        return None
    a_ptr, bt_ptr = a.data_ptr(), b.data_ptr()
    if a_ptr % 256 or bt_ptr % 256:  # the configured algorithms assume 256-byte aligned operands
        return None
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    stream = _current_stream_ptr(a.device)
    if sig.ada:  # 16 real and 16 zero products per Hopper step (tensorcore module docstring)
        a_pad = torch.empty((M, 2 * K), dtype=torch.uint8, device=a.device)
        b_pad = torch.empty((N, 2 * K), dtype=torch.uint8, device=a.device)
        with _cupy_stream(cupy, torch.cuda.current_stream(a.device), index):
            tc.pad_k16_pointers(index, a_ptr, a_pad.data_ptr(), M, K)
            tc.pad_k16_pointers(index, bt_ptr, b_pad.data_ptr(), N, K)
        a_ptr, bt_ptr = a_pad.data_ptr(), b_pad.data_ptr()
    out = a.new_empty((M, N), dtype=out_dt)
    _queue_then_check_scales(cupy, index, stream, scale_a, scale_b, rowwise, prof, lambda: tc.launch(
        sig, index, stream, a_ptr, bt_ptr, out.data_ptr(), scale_a.data_ptr(), scale_b.data_ptr(),
        None if bias is None else bias.data_ptr()))
    return out


# --------------------------------------------------------------------------- exact-kernel route

def _exact_kernel_call(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, rowwise: bool):
    """The drop-in's path to the exact CUDA kernels (``cuda-tiled``, ``cuda-simple``), when the
    backend ladder picks one for the call on this device; None otherwise (the general path
    then computes the call). The FP8 codes, the scales and the bias stay on the device, shared
    with cupy without a copy, and the kernel runs on torch's current stream; a bias is widened
    to float32 there (exact). Non-finite scales are refused after the GEMM is queued, as on the
    tensor-core path (:func:`_queue_then_check_scales`). ``a`` and ``b`` are dense
    (:func:`_dense_operands`)."""
    cupy = _cupy()
    index = a.device.index
    with cupy.cuda.Device(index):
        call = _call(prof, a, b, out_dt, rowwise, bias, use_fast_accum)
        chosen = backends.select(backend, prof, call)
        if chosen not in _EXACT_KERNELS:
            return None
        bias_f32 = None if bias is None else bias.detach().reshape(-1).float()  # on torch's stream
        with _cupy_stream(cupy, torch.cuda.current_stream(a.device), index):
            ops = Operands(*_device_codes(cupy, a, b), cupy.asarray(scale_a.detach()),
                           cupy.asarray(scale_b.detach()), None if bias_f32 is None else cupy.asarray(bias_f32))
            y = _queue_then_check_scales(cupy, index, _current_stream_ptr(a.device), scale_a, scale_b, rowwise,
                                         prof, lambda: backends.get(chosen).run(call, ops))
    return _as_torch(cupy, y, out_dt, a.device)


# --------------------------------------------------------------------------- general route

def _general_call(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, rowwise: bool,
                  on_device: bool):
    """The general route: the scales and the bias read on the host (non-finite scales refused
    there), then the backend the ladder picks for the call, on the operands where they are
    (``on_device``: CUDA tensors shared with cupy, :func:`_gemm_on_device`; else CPU tensors as
    numpy views)."""
    sa, sb = _host_scales(scale_a, scale_b, rowwise, prof)
    bias_f32 = None if bias is None else _host_bias(bias).astype(np.float32)
    call = _call(prof, a, b, out_dt, rowwise, bias, use_fast_accum)
    if on_device:
        return _gemm_on_device(a, b, sa, sb, bias_f32, prof, call, backend, out_dt)
    check_output(call.M, call.N, call.out_dtype, _copy_bytes(a, b))  # before any operand copy
    ops = Operands(np.ascontiguousarray(_fp8_numpy(a)).view(np.uint8),
                   np.ascontiguousarray(_fp8_numpy(b).T).view(np.uint8), sa, sb, bias_f32)
    y = backends.run(backends.select(backend, prof, call), call, ops, on_device=False)
    return _to_torch(y, out_dt, a.device)


def _copy_bytes(a, b) -> int:
    """Bytes of the host copies the general route makes: a (M, K) and b's transpose (N, K) as
    dense codes, each unless it is dense already (an expanded, zero-stride view is not)."""
    (M, K), N = a.shape, b.shape[1]
    dense_a, dense_b = _dense(a, b)
    return (0 if dense_a else M * K) + (0 if dense_b else N * K)


def _host_scales(scale_a, scale_b, rowwise: bool, prof):
    """The scales as numpy arrays on the host (0-d when tensorwise); non-finite ones are refused."""
    if not rowwise and scale_a.dtype == scale_b.dtype:  # both values in one transfer
        both = _host_numpy(torch.stack((scale_a.detach().reshape(()), scale_b.detach().reshape(()))))
        sa, sb = both[0:1], both[1:2]
    else:
        sa = _host_numpy(scale_a)
        sb = _host_numpy(scale_b)
    _refuse_non_finite(sa, sb, prof)
    if not rowwise:
        sa, sb = sa.reshape(()), sb.reshape(())
    return sa, sb


def _host_bias(bias) -> np.ndarray:
    """The bias on the host, as a numpy bfloat16 or float16 array of its bits."""
    bits = _host_numpy(bias.reshape(-1).view(torch.int16))
    return bits.view(ml_dtypes.bfloat16 if bias.dtype == torch.bfloat16 else np.float16)


def _gemm_on_device(a, b, sa, sb, bias_f32, prof, call, backend, out_dt):
    """The GEMM of CUDA tensors where they are: the FP8 codes and the result are shared with
    cupy through the CUDA array interface (no copy), on torch's current stream of the
    operands' device; ``a`` and ``b`` are dense already (:func:`_dense_operands`)."""
    cupy = _cupy()
    device = a.device
    stream = _cupy_stream(cupy, torch.cuda.current_stream(device), device.index)
    with cupy.cuda.Device(device.index), stream:
        ops = Operands(*_device_codes(cupy, a, b), sa, sb, bias_f32)
        y = backends.run(backends.select(backend, prof, call), call, ops, on_device=True)
    return _as_torch(cupy, y, out_dt, device)
