"""``cpemu.gemm``: the semantic twin of ``torch._scaled_mm`` on numpy arrays."""

from __future__ import annotations

import numbers

import ml_dtypes
import numpy as np

from . import reference as ref
from .formats import OUT_DTYPES, encode_output, fp8_format
from .profile import DEFAULT_PROFILE, get_profile

__all__ = ["gemm", "BACKENDS"]

#: Backends of this build, best first; "auto" picks the first available one.
BACKENDS = ("reference",)


def _fail(arg: str, rule: str, got) -> None:
    raise ValueError(f"{arg}: {rule} (got {got})")


def _check_operand(x, name: str):
    if not isinstance(x, np.ndarray):
        _fail(name, "must be a numpy array of ml_dtypes float8_e4m3fn or float8_e5m2", type(x).__name__)
    fmt = fp8_format(x.dtype)
    if fmt is None:
        _fail(name, "dtype must be ml_dtypes float8_e4m3fn or float8_e5m2", x.dtype)
    if x.ndim != 2:
        _fail(name, "must be a 2-D matrix", f"shape {x.shape}")
    return fmt


def _check_scale(s, name: str, full_shape: tuple):
    """Returns (float32 array of shape () or full_shape, is_rowwise)."""
    if isinstance(s, numbers.Real) and not isinstance(s, bool):
        arr = np.array(s, dtype=np.float32)
        if float(arr) != float(s):
            _fail(name, "a Python scalar scale must be exactly representable in float32", s)
    elif isinstance(s, np.ndarray) or np.isscalar(s):
        arr = np.asarray(s)
        if arr.dtype != np.float32:
            _fail(name, "must be a float32 scalar or array (torch._scaled_mm takes float32 scales)", arr.dtype)
        if arr.size == 1 and arr.ndim <= 1:
            arr = arr.reshape(())
        elif arr.shape != full_shape:
            _fail(name, f"must be a scalar, a 1-element array, or a rowwise array of shape {full_shape}",
                  f"shape {arr.shape}")
    else:
        _fail(name, "must be a float or a float32 numpy array", type(s).__name__)
    if not np.isfinite(arr).all():
        _fail(name, "must be finite", arr.ravel()[~np.isfinite(arr.ravel())][:4])
    return arr.astype(np.float32), arr.ndim == 2


def gemm(a, b, *, profile=DEFAULT_PROFILE, scale_a=1.0, scale_b=1.0, bias=None, out_dtype="bfloat16",
         fast_accum=True, backend="auto"):
    """``out = (a @ b) * scale_a * scale_b (+ bias)`` with the bits of the profile's GPU.

    ``a``: (M, K) and ``b``: (K, N) numpy arrays of ml_dtypes ``float8_e4m3fn`` /
    ``float8_e5m2`` (``b`` may be a transposed view, like torch's column-major operand;
    any strides are accepted). K and N must be multiples of 16 (torch._scaled_mm's rule).
    ``scale_a``/``scale_b``: float scalars, or float32 arrays of shape (M, 1) and (1, N)
    for rowwise scaling. ``bias``: (N,) ml_dtypes bfloat16 (float16 for float16 output).
    ``out_dtype``: "bfloat16", "float16" or "float32". ``fast_accum``: torch's
    ``use_fast_accum``. Returns a C-contiguous numpy array of ``out_dtype`` whose bytes
    equal torch._scaled_mm's output on the profile's GPU.
    """
    prof = get_profile(profile)
    fa = _check_operand(a, "a")
    fb = _check_operand(b, "b")
    M, K = a.shape
    K2, N = b.shape
    if K != K2:
        _fail("b", f"must have shape (K, N) with K = a.shape[1] = {K}", f"shape {b.shape}")
    if M == 0:
        _fail("a", "must have at least one row", f"shape {a.shape}")
    if K % 16 or K == 0:
        _fail("a", "K (a.shape[1]) must be a positive multiple of 16, as torch._scaled_mm requires", K)
    if N % 16 or N == 0:
        _fail("b", "N (b.shape[1]) must be a positive multiple of 16, as torch._scaled_mm requires", N)
    if out_dtype not in OUT_DTYPES:
        _fail("out_dtype", f"must be one of {sorted(OUT_DTYPES)}", repr(out_dtype))
    if not isinstance(fast_accum, (bool, np.bool_)):
        _fail("fast_accum", "must be a bool", type(fast_accum).__name__)
    sa, row_a = _check_scale(scale_a, "scale_a", (M, 1))
    sb, row_b = _check_scale(scale_b, "scale_b", (1, N))
    if row_a != row_b:
        _fail("scale_b" if row_a else "scale_a",
              "rowwise scaling needs both scale_a of shape (M, 1) and scale_b of shape (1, N)",
              f"shapes {sa.shape} and {sb.shape}")
    scaling = "rowwise" if row_a else "tensorwise"
    bias_f32, bias_dtype = None, None
    if bias is not None:
        if not isinstance(bias, np.ndarray) or bias.dtype not in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)):
            _fail("bias", "must be a numpy array of ml_dtypes bfloat16 or float16",
                  getattr(bias, "dtype", type(bias).__name__))
        if bias.shape != (N,):
            _fail("bias", f"must have shape (N,) = ({N},)", f"shape {bias.shape}")
        bias_dtype = "bfloat16" if bias.dtype == np.dtype(ml_dtypes.bfloat16) else "float16"
        bias_f32 = bias.astype(np.float32)
    prof.check_features(fa.name, fb.name, out_dtype, scaling, bias_dtype)
    if backend not in ("auto",) + BACKENDS:
        _fail("backend", f"must be 'auto' or one of {BACKENDS}", repr(backend))

    plan = prof.plan(M, N, K, bool(fast_accum), scaling, fa.name, fb.name, out_dtype)
    mode = prof.mode(scaling)
    model = prof.instruction
    a_ops = ref.decode(np.ascontiguousarray(a).view(np.uint8), fa)
    b_ops = ref.decode(np.ascontiguousarray(b.T).view(np.uint8), fb)
    out = np.empty((M, N), dtype=OUT_DTYPES[out_dtype])
    nan_bits = mode.get("nan_bits", {}).get(out_dtype)
    for rb, cb in ref.blocks(M, N, model.L):
        acc = ref.accumulate(a_ops.rows(rb), b_ops.rows(cb), plan, model)
        y = ref.epilogue(acc, sa if sa.ndim == 0 else sa[rb], sb if sb.ndim == 0 else sb[:, cb],
                         None if bias_f32 is None else bias_f32[cb], mode["epilogue"])
        out[rb, cb] = encode_output(y, out_dtype, nan_bits)
    return out
