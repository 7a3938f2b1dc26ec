"""The argument rules of ``torch._scaled_mm`` (torch's checks, order and messages on the H200),
and what cpemu refuses among the calls torch accepts."""

from __future__ import annotations

import numpy as np
import torch

from ..profile import ProfileFeatureError
from .dtypes import _FLOAT8_TYPES, _FP4X2, _FP8, _OUT, _st
from .layout import _cublas_transposed
from .scaling import _joint_scaling


def _require_tensor(x, name: str, pos: int):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"_scaled_mm(): argument '{name}' (position {pos}) must be Tensor, not {type(x).__name__}")


def _check_argument_types(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum) -> None:
    """The Python binding's argument types."""
    tensor = torch.Tensor
    if not (isinstance(a, tensor) and isinstance(b, tensor) and isinstance(scale_a, tensor)
            and isinstance(scale_b, tensor)):  # (one test on the per-call path; the loop names the first)
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


def _check_devices(a, b, scale_a, scale_b, bias, scale_result) -> None:
    """The dispatcher's device check (generated CUDA wrapper): every tensor on the first one's device."""
    device = a.device  # a ("self") is the reference
    for x, name in ((b, "mat2"), (scale_a, "scale_a"), (scale_b, "scale_b"), (bias, "bias"),
                    (scale_result, "scale_result")):
        if x is not None and x.device != device:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but got {name} is on {x.device}, different from "
                f"other tensors on {device} (when checking argument in method wrapper_CUDA___scaled_mm)")


def _check_torch_rules(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum):
    """The checks of ``_scaled_mm_out_cuda`` before its empty-shape return, in torch's order.
    Returns the scaling pair (:func:`_joint_scaling`) and the output dtype."""
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
        _check_bias_dtype(bias, out_dt)
    return scaling, out_dt


def _check_bias_dtype(bias, out_dt) -> None:
    if out_dt == torch.float32:
        raise RuntimeError("Bias is not supported when out_dtype is set to Float32")
    if bias.dtype not in (torch.bfloat16, torch.float16):
        raise RuntimeError(f"Bias must be BFloat16 or Half, but got {_st(bias.dtype)}")
    if out_dt == torch.bfloat16 and bias.dtype != torch.bfloat16:
        raise RuntimeError(f"Bias must be BFloat16 to compute {_st(out_dt)} output, but got {_st(bias.dtype)}")
    if out_dt == torch.float16 and bias.dtype != torch.float16:
        raise RuntimeError(f"Bias must be Float16 to compute {_st(out_dt)} output, but got {_st(bias.dtype)}")


def _check_layout(a, b) -> None:
    """cuBLASLt's operand layouts (checked by torch after its empty-shape return)."""
    if not (_cublas_transposed(a) and not _cublas_transposed(b)):
        raise RuntimeError("Only multiplication of row-major and column-major matrices is supported by cuBLASLt")


def _refuse_unemulated(out_dt, scaling, a=None, b=None) -> None:
    """Accepted by torch. What cpemu does not emulate is refused here, never approximated."""
    for x, name in ((a, "mat1"), (b, "mat2")):
        if x is not None and x.dtype not in _FP8:
            raise ProfileFeatureError(
                f"{name} dtype {x.dtype}: torch accepts it, but cpemu emulates only float8_e4m3fn and "
                f"float8_e5m2 operands (the formats of NVIDIA's FP8 tensor cores)")
    if out_dt not in _OUT:
        raise ProfileFeatureError(
            f"out_dtype {out_dt}: torch._scaled_mm accepts it (out_dtype=None means a's dtype, an FP8 output), "
            f"but cpemu emulates only bfloat16, float16 and float32 outputs; pass out_dtype=torch.bfloat16 "
            f"(or float16 / float32)")
    if scaling not in (("TensorWise", "TensorWise"), ("RowWise", "RowWise")):
        raise ProfileFeatureError(f"{scaling[0]} x {scaling[1]} scaling: torch accepts it, but cpemu emulates "
                                  f"only tensorwise and rowwise scaling")


def _refuse_non_finite(sa: np.ndarray, sb: np.ndarray, prof) -> None:
    if not (np.isfinite(sa).all() and np.isfinite(sb).all()):
        raise _non_finite_error(prof)


def _non_finite_error(prof) -> ProfileFeatureError:
    return ProfileFeatureError(
        f"non-finite scale: torch accepts it, but profile {prof.name!r} does not record what the GPU "
        f"computes with an infinite or NaN scale, so cpemu refuses it")
