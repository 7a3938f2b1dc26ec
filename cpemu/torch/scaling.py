"""Which scaling a call's scales select, as ATen decides it (ScaledBlas.cpp), with its error message."""

from __future__ import annotations

import torch

from .dtypes import _E8M0, _FLOAT8_TYPES, _FP4X2, _st


def _arr(xs) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


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

