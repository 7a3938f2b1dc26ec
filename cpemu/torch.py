"""``cpemu.torch``: ``torch._scaled_mm`` with the numerics of a profile's GPU, on torch tensors.

Needs torch (``pip install "cpemu[torch]"``); ``import cpemu`` alone never imports torch.

* :func:`scaled_mm` -- ``torch._scaled_mm``'s signature and argument checks (the same
  exception types and messages as torch on the H200), computed by :func:`cpemu.gemm`:
  the output bits are those the profile's GPU returns.
* :class:`patch` -- a context manager / decorator that replaces ``torch._scaled_mm``
  for a block, so unmodified code (torchao, hand-written FP8 layers) runs with the
  profile's numerics on any machine; the original is restored on exit, also when the
  block raises.
* :class:`FP8Linear` -- the forward FP8 GEMM of a Transformer Engine linear layer under
  delayed scaling (Evo 2's FP8 projections): E4M3 weight with a per-tensor
  ``scale_inv``, input quantised with a given scale, fast accumulation, bf16 output.

Tensors may live on the CPU or on a CUDA device. CPU operands reach :func:`cpemu.gemm`
as numpy views, without copies (DLPack, or ``Tensor.numpy()``); the result comes back
as a tensor sharing the numpy buffer. CUDA operands stay on their device, on torch's
current stream: where the backend ladder picks the tensor-core path (``cublaslt-tc``, a
Hopper GPU), the call goes straight from the tensors' pointers to ``cublasLtMatmul``
(:func:`_tensor_core_call`); otherwise the FP8 codes are shared with cupy without a copy
and computed by :func:`cpemu.gemm`'s CUDA backends. CUDA tensors need cupy; without it
they are copied to the host and computed by the numpy reference.

What this does not cover: callers that hold their own reference to the original
function (``from torch import _scaled_mm`` before the block, ``torch.ops.aten._scaled_mm``,
graphs already compiled by ``torch.compile``) and libraries that call cuBLASLt from
C++ (Transformer Engine's ``te.Linear``); for the latter use :class:`FP8Linear`.
Gradients do not flow through the emulated product (FP8 GEMMs here are for inference
and for checking numerics).
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings

import ml_dtypes
import numpy as np
import torch

from .api import gemm
from .profile import DEFAULT_PROFILE, ProfileFeatureError, get_profile

__all__ = ["scaled_mm", "patch", "FP8Linear", "quantize_e4m3", "delayed_scaling_scale", "E4M3_MAX"]

#: Largest finite float8_e4m3fn value (Transformer Engine's ``fp8_max`` for E4M3).
E4M3_MAX = 448.0

# torch float8 dtype -> (ml_dtypes dtype, cpemu format name)
_FP8 = {
    torch.float8_e4m3fn: (ml_dtypes.float8_e4m3fn, "e4m3"),
    torch.float8_e5m2: (ml_dtypes.float8_e5m2, "e5m2"),
}
_OUT = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

# c10::ScalarType names, as torch's C++ error messages print them.
_SCALAR_TYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int", torch.int64: "Long",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
    torch.float8_e4m3fn: "Float8_e4m3fn", torch.float8_e5m2: "Float8_e5m2",
}
for _name, _c10 in (("float8_e4m3fnuz", "Float8_e4m3fnuz"), ("float8_e5m2fnuz", "Float8_e5m2fnuz"),
                    ("float8_e8m0fnu", "Float8_e8m0fnu"), ("float4_e2m1fn_x2", "Float4_e2m1fn_x2")):
    if hasattr(torch, _name):
        _SCALAR_TYPE_NAMES[getattr(torch, _name)] = _c10
_FLOAT8_TYPES = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                 if hasattr(torch, n)}
_E8M0 = getattr(torch, "float8_e8m0fnu", None)
_FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)


def _st(dtype) -> str:
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _arr(xs) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


# --------------------------------------------------------------------------- layout (as torch/c10 decide it)

def _non_overlapping_and_dense(t) -> bool:
    """c10's ``compute_non_overlapping_and_dense`` for a tensor of any rank."""
    sizes, strides = t.shape, t.stride()
    if len(sizes) == 2:
        return _dense_2d(sizes[0], sizes[1], strides[0], strides[1])
    return _dense_any(list(sizes), list(strides))


def _dense_2d(s0: int, s1: int, t0: int, t1: int) -> bool:
    """:func:`_dense_any` for rank 2, without the sort (the drop-in's per-call path)."""
    if s0 < 2:
        return s1 < 2 or t1 == 1
    if s1 < 2:
        return t0 == 1
    if t1 < t0:  # dims sorted by stride (stable): the inner one must have stride 1, the outer its size
        return t1 == 1 and t0 == s1
    return t0 == 1 and t1 == s0


def _dense_any(sizes: list, strides: list) -> bool:
    if len(sizes) == 1:
        return sizes[0] < 2 or strides[0] == 1
    perm = sorted(range(len(sizes)), key=lambda d: (sizes[d] < 2, strides[d] if sizes[d] >= 2 else 0))
    require = 1
    for d in perm:
        if sizes[d] < 2:
            return True
        if strides[d] != require:
            return False
        require *= sizes[d]
    return True


def _cublas_transposed(t) -> bool:
    """``transpose_tensor`` of ATen's ``prepare_matrix_for_cublas`` (True: row-major-like)."""
    if _non_overlapping_and_dense(t):
        return t.is_contiguous()
    (s0, _), (t0, t1) = t.shape, t.stride()
    # column-major-like -> False; row-major-like, or cloned to contiguous by ATen -> True
    return not (t0 == 1 and t1 >= max(1, s0))


# --------------------------------------------------------------------------- scaling detection (ATen ScaledBlas.cpp)

def _is_tensorwise(t, s) -> bool:
    return t.dtype in _FLOAT8_TYPES and s.dtype == torch.float32 and s.numel() == 1


def _is_rowwise(t, s) -> bool:
    return (t.dtype in _FLOAT8_TYPES and s.dtype == torch.float32 and s.dim() == 2
            and s.shape[0] == t.shape[0] and s.shape[1] == 1 and s.is_contiguous())


def _size_stride(s, dim, size, stride) -> bool:
    return s.shape[dim] == size and (size <= 1 or s.stride(dim) == stride)


def _is_1x128(t, s) -> bool:
    return (t.dtype in _FLOAT8_TYPES and s.dtype == torch.float32 and s.dim() == 2
            and _size_stride(s, 0, t.shape[0], 1) and _size_stride(s, 1, _cdiv(t.shape[1], 128), t.shape[0]))


def _is_128x128(t, s) -> bool:
    return (t.dtype in _FLOAT8_TYPES and s.dtype == torch.float32 and s.dim() == 2
            and _size_stride(s, 0, _cdiv(t.shape[0], 128), _cdiv(t.shape[1], 128))
            and _size_stride(s, 1, _cdiv(t.shape[1], 128), 1))


def _is_1x32(t, s) -> bool:
    if _E8M0 is None or s.dtype != _E8M0 or not s.is_contiguous():
        return False
    if t.dtype in _FLOAT8_TYPES:
        return s.numel() == _round_up(t.shape[0], 128) * _round_up(_cdiv(t.shape[1], 32), 4)
    if _FP4X2 is not None and t.dtype == _FP4X2:
        return s.numel() == _round_up(t.shape[0], 128) * _round_up(_cdiv(t.shape[1] * 2, 32), 4)
    return False


def _is_1x16(t, s) -> bool:
    return (_FP4X2 is not None and t.dtype == _FP4X2 and s.dtype == torch.float8_e4m3fn and s.is_contiguous()
            and s.numel() == _round_up(t.shape[0], 128) * _round_up(_cdiv(t.shape[1] * 2, 16), 4))


_SCALINGS = {"TensorWise": _is_tensorwise, "RowWise": _is_rowwise, "BlockWise1x128": _is_1x128,
             "BlockWise128x128": _is_128x128, "BlockWise1x32": _is_1x32, "BlockWise1x16": _is_1x16}
_JOINT = (("TensorWise", "TensorWise"), ("RowWise", "RowWise"), ("BlockWise128x128", "BlockWise1x128"),
          ("BlockWise1x128", "BlockWise128x128"), ("BlockWise1x128", "BlockWise1x128"),
          ("BlockWise1x32", "BlockWise1x32"), ("BlockWise1x16", "BlockWise1x16"))


def _joint_scaling(a, b, sa, sb):
    # TensorWise x TensorWise first, as in ATen's loop (_joint_scaling_by_pairs), without its
    # transposes (dtype and numel do not change under .t(), which never raises for at most 2
    # dimensions)
    if sb.dim() <= 2 and _is_tensorwise(a, sa) and _is_tensorwise(b, sb):
        return "TensorWise", "TensorWise"
    return _joint_scaling_by_pairs(a, b, sa, sb)


def _joint_scaling_by_pairs(a, b, sa, sb):
    """ATen's loop over the scaling pairs, in its order: the first pair both operands satisfy."""
    for lhs, rhs in _JOINT:
        sb_check = sb if rhs in ("BlockWise1x16", "BlockWise1x32") else sb.t()
        if _SCALINGS[lhs](a, sa) and _SCALINGS[rhs](b.t(), sb_check):
            return lhs, rhs
    M, K = a.shape
    K2, N = b.shape
    raise RuntimeError(
        "Invalid scaling configuration.\n"
        "- For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n"
        f"- For RowWise scaling, a and b should be float8, scales should be float, scale_a should be ({M}, 1) "
        f"and scale_b should be (1, {N}), and both should be contiguous.\n"
        f"- For BlockWise 1x128 scaling, a and b should be float8, scales should be float, scale_a should be "
        f"({M}, {_cdiv(K, 128)}) and scale_b should be ({_cdiv(K2, 128)}, {N}), and both should be "
        "outer-dim-major.\n"
        f"- For BlockWise 128x128 scaling, a and b should be float8, scales should be float, scale_a should be "
        f"({_cdiv(M, 128)}, {_cdiv(K, 128)}) and scale_b should be ({_cdiv(K2, 128)}, {_cdiv(N, 128)}), and both "
        "should be near-inner-dim-major (with 16-byte aligned strides).\n"
        "- For Blockwise 1x32 scaling, a and b should be float8, scales should be float8_e8m0fnu, scale_a should "
        f"have {_round_up(M, 128) * _round_up(_cdiv(K, 32), 4)} elements and scale_b should have "
        f"{_round_up(N, 128) * _round_up(_cdiv(K2, 32), 4)} elements, and both should be contiguous.\n"
        "- For Blockwise 1x16 scaling, a and b should be float4 (packed 2x), scales should be float8_e4m3fn, "
        f"scale_a should have {_round_up(M, 128) * _round_up(_cdiv(K * 2, 16), 4)} elements and scale_b should "
        f"have {_round_up(N, 128) * _round_up(_cdiv(K2 * 2, 16), 4)} elements, and both should be contiguous.\n"
        f"Got a.dtype()={_st(a.dtype)}, scale_a.dtype()={_st(sa.dtype)}, scale_a.size()={_arr(sa.shape)}, "
        f"scale_a.stride()={_arr(sa.stride())}, b.dtype()={_st(b.dtype)}, scale_b.dtype()={_st(sb.dtype)}, "
        f"scale_b.size()={_arr(sb.shape)} and scale_b.stride()={_arr(sb.stride())}")


# --------------------------------------------------------------------------- torch <-> numpy without copies

def _host_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (DLPack, else ``Tensor.numpy()``); CUDA tensors are copied to the host.

    The dtype must be one numpy knows (callers reinterpret FP8/bf16 as uint8/int16 first).
    """
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()  # scales and bias (small); CUDA operands stay on the device (_gemm_on_device)
    try:
        return np.from_dlpack(t)
    except (TypeError, RuntimeError, BufferError, AttributeError):
        return t.numpy()


def _fp8_numpy(t) -> np.ndarray:
    np_dtype = _FP8[t.dtype][0]
    return _host_numpy(t.view(torch.uint8)).view(np_dtype)


def _to_torch(y: np.ndarray, out_dtype, device) -> torch.Tensor:
    if out_dtype == torch.bfloat16:
        out = torch.from_numpy(y.view(np.int16)).view(torch.bfloat16)
    else:
        out = torch.from_numpy(y)
    return out if device.type == "cpu" else out.to(device)


# --------------------------------------------------------------------------- scaled_mm

def _require_tensor(x, name: str, pos: int):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"_scaled_mm(): argument '{name}' (position {pos}) must be Tensor, not {type(x).__name__}")


def scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False, *,
              profile=DEFAULT_PROFILE, backend="auto"):
    """``torch._scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)``
    with the output bits of ``profile``'s GPU (default: the H200, torch 2.11, cuBLASLt 13.1).

    Arguments and checks are torch's (CUDA implementation): ``a`` (M, K) row-major and
    ``b`` (K, N) column-major (``w.t()`` of a contiguous (N, K) weight), float8_e4m3fn /
    float8_e5m2 (not both e5m2), K and N multiples of 16; float32 scales, one element
    each (tensorwise) or ``(M, 1)`` and ``(1, N)`` (rowwise); ``bias`` (N,) bf16 for bf16
    output, fp16 for fp16 output, none for fp32 output; ``scale_result`` is ignored for
    non-FP8 outputs, as in torch. A call torch rejects raises the exception torch raises
    on the H200 (same type, same message).

    Calls torch accepts but cpemu does not emulate raise :class:`cpemu.ProfileFeatureError`:
    FP8 output (``out_dtype`` None or float8: a's dtype), blockwise scaling, non-finite
    scales, and features the profile does not record. Shapes whose GPU schedule the
    profile does not know raise :class:`cpemu.UnsupportedShape`.

    Returns a contiguous (M, N) tensor of ``out_dtype`` on the operands' device.
    """
    for x, name, pos in ((a, "input", 1), (b, "mat2", 2), (scale_a, "scale_a", 3), (scale_b, "scale_b", 4)):
        _require_tensor(x, name, pos)
    if bias is not None:
        _require_tensor(bias, "bias", 5)
    if scale_result is not None:
        _require_tensor(scale_result, "scale_result", 6)
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"_scaled_mm(): argument 'out_dtype' (position 7) must be torch.dtype, "
                        f"not {type(out_dtype).__name__}")
    if not isinstance(use_fast_accum, bool):
        raise TypeError(f"_scaled_mm(): argument 'use_fast_accum' (position 8) must be bool, "
                        f"not {type(use_fast_accum).__name__}")
    prof = get_profile(profile)

    # The dispatcher's device check (generated CUDA wrapper): every tensor on the first one's device.
    device = a.device
    for x, name in ((a, "self"), (b, "mat2"), (scale_a, "scale_a"), (scale_b, "scale_b"), (bias, "bias"),
                    (scale_result, "scale_result")):
        if x is not None and x.device != device:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but got {name} is on {x.device}, different from "
                f"other tensors on {device} (when checking argument in method wrapper_CUDA___scaled_mm)")

    # _scaled_mm_out_cuda, in torch's order.
    if a.dim() != 2:
        raise RuntimeError("mat1 must be a matrix")
    if b.dim() != 2:
        raise RuntimeError("mat2 must be a matrix")
    M, K = a.shape
    K2, N = b.shape
    if K != K2:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({M}x{K} and {K2}x{N})")
    scaling = _joint_scaling(a, b, scale_a, scale_b)
    if scale_result is not None and not (scale_result.numel() == 1 and scale_result.dtype == torch.float32):
        raise RuntimeError("scale_result must be a float scalar")
    if bias is not None and bias.numel() != N:
        raise RuntimeError(f"Bias must be size {N} but got {bias.numel()}")
    if K % 16:
        raise RuntimeError(f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: ({M}x{K}).")
    if K2 % 16 or N % 16:
        raise RuntimeError(f"mat2 shape ({K2}x{N}) must be divisible by 16")
    out_dt = a.dtype if out_dtype is None else out_dtype
    for x, name in ((a, "mat1"), (b, "mat2")):
        if x.dtype not in _FLOAT8_TYPES and x.dtype != _FP4X2:
            raise RuntimeError(f"Expected {name} to be Float8 or Float4_x2 matrix got {_st(x.dtype)}")
    if a.dtype == torch.float8_e5m2 and b.dtype == torch.float8_e5m2:
        raise ValueError("Multiplication of two Float8_e5m2 matrices is not supported")
    if use_fast_accum and _FP4X2 is not None and _FP4X2 in (a.dtype, b.dtype):
        raise RuntimeError("`use_fast_accum` is not supported when `mat1` or `mat2` tensors have the "
                           "`Float4_e2m1fn_x2` dtype.")
    if bias is not None:
        if out_dt == torch.float32:
            raise RuntimeError("Bias is not supported when out_dtype is set to Float32")
        if bias.dtype not in (torch.bfloat16, torch.float16):
            raise RuntimeError(f"Bias must be BFloat16 or Half, but got {_st(bias.dtype)}")
        if out_dt == torch.bfloat16 and bias.dtype != torch.bfloat16:
            raise RuntimeError(f"Bias must be BFloat16 to compute {_st(out_dt)} output, but got {_st(bias.dtype)}")
        if out_dt == torch.float16 and bias.dtype != torch.float16:
            raise RuntimeError(f"Bias must be Float16 to compute {_st(out_dt)} output, but got {_st(bias.dtype)}")
    if M == 0 or K == 0 or N == 0:  # torch returns before any GEMM: empty, or zeros when K == 0
        return torch.zeros((M, N), dtype=out_dt, device=device)
    if not (_cublas_transposed(a) and not _cublas_transposed(b)):
        raise RuntimeError("Only multiplication of row-major and column-major matrices is supported by cuBLASLt")

    # Accepted by torch. What cpemu does not emulate is refused here, never approximated.
    if out_dt not in _OUT:
        raise ProfileFeatureError(
            f"out_dtype {out_dt}: torch._scaled_mm accepts it (out_dtype=None means a's dtype, an FP8 output), "
            f"but cpemu emulates only bfloat16, float16 and float32 outputs; pass out_dtype=torch.bfloat16 "
            f"(or float16 / float32)")
    if scaling not in (("TensorWise", "TensorWise"), ("RowWise", "RowWise")):
        raise ProfileFeatureError(f"{scaling[0]} x {scaling[1]} scaling: torch accepts it, but cpemu emulates "
                                  f"only tensorwise and rowwise scaling")
    if device.type == "meta":  # shape propagation only
        return torch.empty((M, N), dtype=out_dt, device=device)
    on_device = device.type == "cuda" and _cupy() is not None
    if on_device:  # both device paths take dense operands: made so once (a copy only if padded)
        a, b = _dense_operands(a, b)
    if on_device and backend in ("auto", _TENSOR_CORE):
        y = _tensor_core_call(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend,
                              scaling[0] == "RowWise")
        if y is not None:
            return y
    if on_device:
        y = _exact_kernel_call(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend,
                               scaling[0] == "RowWise")
        if y is not None:
            return y
    if scaling[0] == "TensorWise" and scale_a.dtype == scale_b.dtype:  # both values in one transfer
        both = _host_numpy(torch.stack((scale_a.detach().reshape(()), scale_b.detach().reshape(()))))
        sa, sb = both[0:1], both[1:2]
    else:
        sa = _host_numpy(scale_a)
        sb = _host_numpy(scale_b)
    _refuse_non_finite(sa, sb, prof)
    if scaling[0] == "TensorWise":
        sa, sb = sa.reshape(()), sb.reshape(())
    np_bias = None
    if bias is not None:
        bits = _host_numpy(bias.reshape(-1).view(torch.int16))
        np_bias = bits.view(ml_dtypes.bfloat16 if bias.dtype == torch.bfloat16 else np.float16)
    if on_device:
        return _gemm_on_device(a, b, sa, sb, np_bias, prof, out_dt, use_fast_accum, backend)
    y = gemm(_fp8_numpy(a), _fp8_numpy(b), profile=prof, scale_a=sa, scale_b=sb, bias=np_bias,
             out_dtype=_OUT[out_dt], fast_accum=use_fast_accum, backend=backend)
    return _to_torch(y, out_dt, device)


def _refuse_non_finite(sa: np.ndarray, sb: np.ndarray, prof) -> None:
    if not (np.isfinite(sa).all() and np.isfinite(sb).all()):
        raise _non_finite_error(prof)


def _non_finite_error(prof) -> ProfileFeatureError:
    return ProfileFeatureError(
        f"non-finite scale: torch accepts it, but profile {prof.name!r} does not record what the GPU "
        f"computes with an infinite or NaN scale, so cpemu refuses it")


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


_TENSOR_CORE = "cublaslt-tc"
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
    from . import backends
    from .cuda import tensorcore as tc

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
    from .cuda import tensorcore as tc

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


def _dense_operands(a, b):
    """``a`` row-major and ``b`` column-major with padded leading dimensions (which torch
    accepts), made dense on the device: a (M, K) C-contiguous, b the transpose of a
    C-contiguous (N, K)."""
    if a.stride(1) != 1 or a.stride(0) != a.shape[1]:
        a = a.contiguous()
    if b.stride(0) != 1 or b.stride(1) != b.shape[0]:
        b = b.t().contiguous().t()
    return a, b


_EXACT_KERNELS = ("cuda-tiled", "cuda-simple")


def _exact_kernel_call(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, rowwise: bool):
    """The drop-in's path to the exact CUDA kernels (``cuda-tiled``, ``cuda-simple``), when the
    backend ladder picks one for ``prof`` on this device; None otherwise (the general path
    then computes the call). The FP8 codes, the scales and the bias stay on the device, shared
    with cupy without a copy, and the kernel runs on torch's current stream; a bias is widened
    to float32 there (exact). Non-finite scales are refused after the GEMM is queued, as on the
    tensor-core path (:func:`_queue_then_check_scales`). ``a`` and ``b`` are dense
    (:func:`_dense_operands`)."""
    from . import backends
    from .cuda.kernels import gemm_cuda

    cupy = _cupy()
    index = a.device.index
    with cupy.cuda.Device(index):
        chosen = backends.select(backend, prof)
        if chosen not in _EXACT_KERNELS:
            return None
        M, K = a.shape
        N = b.shape[1]
        fa, fb, out_name = _FP8[a.dtype][1], _FP8[b.dtype][1], _OUT[out_dt]
        scaling = "rowwise" if rowwise else "tensorwise"
        prof.check_features(fa, fb, out_name, scaling, None if bias is None else _OUT[bias.dtype])
        plan = prof.plan(M, N, K, use_fast_accum, scaling, fa, fb, out_name)
        bias_f32 = None if bias is None else bias.detach().reshape(-1).float()  # on torch's stream
        with _cupy_stream(cupy, torch.cuda.current_stream(a.device), index):
            a_codes = cupy.asarray(a.detach().view(torch.uint8))
            bt_codes = cupy.asarray(b.detach().view(torch.uint8)).T  # (N, K), C-contiguous
            sa, sb = cupy.asarray(scale_a.detach()), cupy.asarray(scale_b.detach())
            y = _queue_then_check_scales(
                cupy, index, _current_stream_ptr(a.device), scale_a, scale_b, rowwise, prof,
                lambda: gemm_cuda(chosen, a_codes, bt_codes, fa, fb, plan, prof.instruction, prof.mode(scaling), sa, sb,
                                  None if bias_f32 is None else cupy.asarray(bias_f32), out_name))
    return _as_torch(cupy, y, out_dt, a.device)


def _as_torch(cupy, y, out_dt, device):
    """A result of the CUDA kernels (cupy float32, or uint16 bf16/fp16 bits) as a tensor of
    ``out_dt`` on ``device``, without a copy."""
    out = torch.as_tensor(y if out_dt == torch.float32 else y.view(cupy.int16), device=device)
    return out if out_dt == torch.float32 else out.view(out_dt)


def _gemm_on_device(a, b, sa, sb, np_bias, prof, out_dt, use_fast_accum, backend):
    """The GEMM of CUDA tensors where they are: the FP8 codes and the result are shared with
    cupy through the CUDA array interface (no copy), on torch's current stream of the
    operands' device; ``a`` and ``b`` are dense already (:func:`_dense_operands`)."""
    cupy = _cupy()
    device = a.device
    stream = _cupy_stream(cupy, torch.cuda.current_stream(device), device.index)
    with cupy.cuda.Device(device.index), stream:
        a_codes = cupy.asarray(a.detach().view(torch.uint8))
        b_codes = cupy.asarray(b.detach().view(torch.uint8))
        y = gemm(a_codes, b_codes, profile=prof, scale_a=sa, scale_b=sb, bias=np_bias, out_dtype=_OUT[out_dt],
                 fast_accum=use_fast_accum, backend=backend, a_format=_FP8[a.dtype][1], b_format=_FP8[b.dtype][1])
    return _as_torch(cupy, y, out_dt, device)


# --------------------------------------------------------------------------- patch

def _replacement(profile, backend):
    def _scaled_mm(input, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                   use_fast_accum=False):
        return scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum,
                         profile=profile, backend=backend)

    _scaled_mm.__doc__ = (f"torch._scaled_mm emulated by cpemu with profile {getattr(profile, 'name', profile)!r} "
                          f"(installed by cpemu.torch.patch)")
    _scaled_mm.cpemu_profile = getattr(profile, "name", profile)
    return _scaled_mm


class patch(contextlib.ContextDecorator):
    """Replace ``torch._scaled_mm`` by :func:`scaled_mm` with ``profile``, for a block or a function.

    ::

        with cpemu.torch.patch():                 # H200 numerics, on any machine
            y = model(x)                          # every torch._scaled_mm call is emulated

        @cpemu.torch.patch(profile="hopper-h200-torch")
        def evaluate(model, batch): ...

    The previous ``torch._scaled_mm`` is restored on exit, also when the block raises;
    blocks nest (the innermost profile applies; each exit restores what its entry
    replaced), and one ``patch`` object may be re-entered. The replacement is
    process-wide (it is a module attribute), so do not patch from several threads at
    once. Code that looked the function up before the block (``from torch import
    _scaled_mm``), ``torch.ops.aten._scaled_mm`` and compiled graphs are not affected.
    """

    def __init__(self, profile=DEFAULT_PROFILE, backend="auto"):
        get_profile(profile)  # an unknown profile fails here, not inside the block
        self.profile = profile
        self.backend = backend
        self._saved = []

    def __enter__(self):
        self._saved.append(torch._scaled_mm)
        torch._scaled_mm = _replacement(self.profile, self.backend)
        return self

    def __exit__(self, *exc):
        torch._scaled_mm = self._saved.pop()
        return False


# --------------------------------------------------------------------------- Transformer Engine FP8 linear

def delayed_scaling_scale(amax, margin: int = 0, fp8_max: float = E4M3_MAX) -> torch.Tensor:
    """Transformer Engine's delayed-scaling scale from an amax: ``(fp8_max / amax) / 2**margin``
    in float32; 1 when amax is 0 or not finite, the largest float32 when the quotient overflows.
    Returns a 0-d float32 tensor."""
    amax = torch.as_tensor(amax, dtype=torch.float32).detach().reshape(())
    one = torch.ones((), dtype=torch.float32, device=amax.device)
    sf = (torch.tensor(fp8_max, dtype=torch.float32, device=amax.device) / amax) / (2.0 ** margin)
    sf = torch.where(amax > 0.0, sf, one)
    sf = torch.where(torch.isfinite(amax), sf, one)
    return torch.where(torch.isinf(sf), torch.full_like(sf, torch.finfo(torch.float32).max), sf)


def quantize_e4m3(x: torch.Tensor, scale) -> torch.Tensor:
    """``x * scale`` in float32, saturated to +-448 and rounded to nearest even float8_e4m3fn,
    as Transformer Engine's cast kernel does (``__nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..)``);
    NaN stays NaN."""
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    y = x.to(torch.float32) * scale
    return torch.clamp(y, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


class FP8Linear(torch.nn.Module):
    """The forward GEMM of a Transformer Engine FP8 linear layer (delayed scaling), emulated.

    This is what ``te.Linear`` (no bias) computes under ``fp8_autocast`` with delayed
    scaling, as in Evo 2's FP8 projections, with the bits of ``profile``'s GPU:

    1. the input is quantised to E4M3 with the given ``input_scale``:
       ``q = e4m3(clamp(x * input_scale, -448, 448))`` (round to nearest even);
    2. rows are padded with zeros to a multiple of 16 tokens (cuBLASLt FP8 needs it);
    3. ``y = scaled_mm(q, weight.t(), input_scale_inv, weight_scale_inv,
       out_dtype=torch.bfloat16, use_fast_accum=True)`` (TE's forward GEMM does not use
       the split accumulator), no bias;
    4. the padding rows are removed; leading dimensions of ``x`` are kept.

    Buffers: ``weight`` (out_features, in_features) float8_e4m3fn, ``weight_scale_inv``,
    ``input_scale``, ``input_scale_inv`` (0-d float32). ``.to(device)`` moves them; the
    scales are "given values" (TE's amax history is not updated here).

    Build it from a high-precision weight with :meth:`from_weight` (scales derived from
    amaxes as TE's delayed scaling does), or from an already quantised weight with
    :meth:`from_fp8` (e.g. an FP8 checkpoint: weight bytes plus ``scale_inv``).

    Caveat: the numerics are those of ``torch._scaled_mm`` on the profile's GPU (the
    instruction, its accumulation and torch's cuBLASLt configuration). TE calls
    cuBLASLt itself, with its own workspace, so for shapes where cuBLASLt's heuristic
    would split K the two may differ (not recorded). With tokens padded to 16 rows,
    the H200 profile splits none of Evo 2's projection shapes (1B, 7B, 40B): each
    output is one fast-accumulation chain over K.
    """

    def __init__(self, weight_fp8, weight_scale_inv, input_scale, *, input_scale_inv=None,
                 profile=DEFAULT_PROFILE, backend="auto"):
        super().__init__()
        if not isinstance(weight_fp8, torch.Tensor) or weight_fp8.dtype != torch.float8_e4m3fn \
                or weight_fp8.dim() != 2:
            raise ValueError("weight_fp8: must be a 2-D (out_features, in_features) torch.float8_e4m3fn tensor")
        dev = weight_fp8.device
        wsi = torch.as_tensor(weight_scale_inv, dtype=torch.float32, device=dev).detach().reshape(())
        isc = torch.as_tensor(input_scale, dtype=torch.float32, device=dev).detach().reshape(())
        isi = (torch.reciprocal(isc) if input_scale_inv is None
               else torch.as_tensor(input_scale_inv, dtype=torch.float32, device=dev).detach().reshape(()))
        get_profile(profile)
        self.profile = profile
        self.backend = backend
        self.register_buffer("weight", weight_fp8.detach().contiguous())
        self.register_buffer("weight_scale_inv", wsi.clone())
        self.register_buffer("input_scale", isc.clone())
        self.register_buffer("input_scale_inv", isi.clone())

    @classmethod
    def from_weight(cls, weight, *, input_amax=None, input_scale=None, weight_amax=None, margin: int = 0,
                    profile=DEFAULT_PROFILE, backend="auto"):
        """From a bf16/fp32 (out_features, in_features) weight, with TE delayed-scaling scales.

        ``weight_amax`` (default: the weight's own max |w|) and ``input_amax`` (the amax
        history's value for the input; or pass ``input_scale`` directly) give
        ``scale = (448 / amax) / 2**margin``; ``scale_inv = 1 / scale`` in float32.
        """
        if (input_amax is None) == (input_scale is None):
            raise ValueError("from_weight: pass exactly one of input_amax and input_scale")
        weight = weight.detach()
        w_amax = weight.abs().max().float() if weight_amax is None else weight_amax
        w_scale = delayed_scaling_scale(w_amax, margin).to(weight.device)
        if input_scale is None:
            input_scale = delayed_scaling_scale(input_amax, margin)
        return cls(quantize_e4m3(weight, w_scale), torch.reciprocal(w_scale), input_scale,
                   profile=profile, backend=backend)

    @classmethod
    def from_fp8(cls, weight_fp8, weight_scale_inv, *, input_scale, input_scale_inv=None,
                 profile=DEFAULT_PROFILE, backend="auto"):
        """From a quantised E4M3 weight and its ``scale_inv`` (an FP8 checkpoint)."""
        return cls(weight_fp8, weight_scale_inv, input_scale, input_scale_inv=input_scale_inv,
                   profile=profile, backend=backend)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def extra_repr(self) -> str:
        name = getattr(self.profile, "name", self.profile)
        return f"in_features={self.in_features}, out_features={self.out_features}, profile={name!r}"

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """The E4M3 codes TE feeds the GEMM for ``x`` (same shape)."""
        return quantize_e4m3(x, self.input_scale)

    def forward_fp8(self, x_fp8: torch.Tensor) -> torch.Tensor:
        """The GEMM on an already quantised (tokens, in_features) E4M3 input; bf16 (tokens, out_features)."""
        M, K = x_fp8.shape
        if K != self.in_features:
            raise ValueError(f"input: last dimension must be in_features = {self.in_features} (got {K})")
        pad = -M % 16
        if pad:
            buf = torch.zeros((M + pad, K), dtype=torch.uint8, device=x_fp8.device)
            buf[:M] = x_fp8.view(torch.uint8)
            x_fp8 = buf.view(torch.float8_e4m3fn)
        else:
            x_fp8 = x_fp8.contiguous()
        y = scaled_mm(x_fp8, self.weight.t(), self.input_scale_inv, self.weight_scale_inv,
                      out_dtype=torch.bfloat16, use_fast_accum=True, profile=self.profile, backend=self.backend)
        return y[:M] if pad else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input: last dimension must be in_features = {self.in_features} "
                             f"(got shape {tuple(x.shape)})")
        lead = x.shape[:-1]
        q = self.quantize_input(x.reshape(-1, self.in_features))
        y = self.forward_fp8(q)
        return y.reshape(*lead, self.out_features)


def _check_torch_version():  # pragma: no cover - import-time guard
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 4):
        raise ImportError(f"cpemu.torch needs torch >= 2.4 (found {torch.__version__})")


_check_torch_version()
