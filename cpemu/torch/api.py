"""``scaled_mm``: torch's argument rules, then the first route that takes the call."""

from __future__ import annotations

import torch

from ..memory import check_output
from ..profile import DEFAULT_PROFILE, get_profile
from .dtypes import _OUT
from .routes import _route
from .rules import (_check_argument_types, _check_devices, _check_layout, _check_torch_rules,
                    _refuse_unemulated)


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
    _check_argument_types(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    prof = get_profile(profile)
    _check_devices(a, b, scale_a, scale_b, bias, scale_result)
    scaling, out_dt = _check_torch_rules(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    (M, K), N = a.shape, b.shape[1]
    device = a.device
    if M == 0 or K == 0 or N == 0:  # torch returns before any GEMM: empty, or zeros when K == 0
        if device.type == "cpu" and out_dt in _OUT:
            check_output(M, N, _OUT[out_dt])
        return torch.zeros((M, N), dtype=out_dt, device=device)
    _check_layout(a, b)
    _refuse_unemulated(out_dt, scaling, a, b)
    if device.type == "meta":  # shape propagation only
        return torch.empty((M, N), dtype=out_dt, device=device)
    return _route(a, b, scale_a, scale_b, bias, prof, out_dt, use_fast_accum, backend, scaling[0] == "RowWise")
