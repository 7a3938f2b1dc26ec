"""Validation of a backend on this device: hard cases compared bit for bit with the reference.

The cases exercise every path: long chains, cancellation, exponent spread, subnormal-heavy
data, NaN, promotion, split slices, odd shapes, rowwise scales and bias; the tensor-core
backend, whose algorithm changes with the shape, gets a split-K shape of the H200 table and
mid-size GEMMs too. A case the profile does not record, or the backend does not support, is
skipped; a backend that runs none of them is not validated.
"""

from __future__ import annotations

import numpy as np

from ..cases import Case, operands
from ..call import Operands
from ..profile import ProfileFeatureError
from ..schedule import UnsupportedShape

__all__ = ["hard_cases", "tensor_core_cases", "validate_backend"]


def hard_cases() -> list:
    return [Case(17, 48, 80, data="spread", seed=1), Case(3, 16, 272, data="cancel", seed=2, fast_accum=False),
            Case(8, 32, 160, data="gauss-tiny", seed=3, out_dtype="float32"),
            Case(5, 16, 96, data="nan", seed=4, out_dtype="float16"),
            Case(4, 64, 512, data="loguniform", seed=5, out_dtype="float32", scale="tensor"),
            Case(9, 32, 64, data="gauss40", seed=6, scale="rowwise", bias=True)]


def tensor_core_cases() -> list:
    """A split-K shape of the H200 table (16 x 64 x 16384: 6 slices) and mid-size GEMMs."""
    return [Case(16, 64, 16384, data="gauss40", seed=7, out_dtype="float32"),
            Case(16, 64, 16384, data="spread", seed=8, fast_accum=False),
            Case(128, 256, 1920, data="gauss40", seed=9),
            Case(40, 96, 4096, data="loguniform", seed=10, out_dtype="float16", bias=True, scale="tensor")]


def case_call(case: Case, profile):
    """The Call and host Operands of a designed case (the profile may refuse the call)."""
    a, bt, sa, sb, bias = operands(case)
    scaling = "rowwise" if case.scale == "rowwise" else "tensorwise"
    bias_dtype = None
    if bias is not None:
        bias_dtype = "float16" if case.out_dtype == "float16" else "bfloat16"
        bias = (bias.view(np.float16).astype(np.float32) if bias_dtype == "float16"
                else (bias.astype(np.uint32) << 16).view(np.float32))
    call = profile.call(case.M, case.N, case.K, case.a_format, case.b_format, case.out_dtype, scaling,
                        case.fast_accum, bias_dtype)
    if scaling == "tensorwise":
        sa, sb = sa.reshape(()), sb.reshape(())
    return call, Operands(a, bt, sa, sb, bias)


def validate_backend(backend, profile) -> tuple[bool, str]:
    from . import TENSOR_CORE, get, run

    cases = hard_cases() + (tensor_core_cases() if backend.name == TENSOR_CORE else [])
    ran, declined = 0, []
    for case in cases:
        try:
            call, ops = case_call(case, profile)
        except (ProfileFeatureError, UnsupportedShape):
            continue  # the profile lacks this feature or shape: nothing to validate
        if backend.supports(call) is not None:
            declined.append(case.id)
            continue
        try:
            want = get("reference").run(call, ops)
            got = run(backend.name, call, ops, on_device=False)
        except Exception as e:  # noqa: BLE001 - a failing backend is reported, not raised
            return False, f"{type(e).__name__} on {case.id}: {e}"
        ran += 1
        w = want.view(np.uint32 if want.dtype == np.float32 else np.uint16)
        g = np.asarray(got).view(w.dtype)
        if not np.array_equal(w, g):
            i = tuple(np.argwhere(w != g)[0])
            return False, (f"bits differ from the reference on {case.id} at {i}: "
                           f"0x{int(g[i]):x} != 0x{int(w[i]):x}")
    if not ran:
        return False, "no validation case is within this backend's reach for this profile"
    return True, f"validated on {ran} hard cases" + (f" ({len(declined)} outside this backend)" if declined else "")
