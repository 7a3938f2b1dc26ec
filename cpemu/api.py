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


def _check_scale(s, name: str):
    """A float32 array of the scale (torch takes float32 scale tensors)."""
    if isinstance(s, numbers.Real) and not isinstance(s, (bool, np.bool_)) and np.ndim(s) == 0 \
            and not isinstance(s, np.ndarray):
        with np.errstate(over="ignore"):
            arr = np.array(s, dtype=np.float32)
        if not np.isfinite(float(s)):
            _fail(name, "must be finite", s)
        if float(arr) != float(s):
            _fail(name, "a Python scalar scale must be exactly representable in float32 "
                        "(pass np.float32(x) to round it as torch.tensor(x) does)", s)
    elif isinstance(s, np.ndarray):
        arr = s
        if arr.dtype != np.float32:
            _fail(name, "must be a float32 scalar or array (torch._scaled_mm takes float32 scales)", arr.dtype)
    else:
        _fail(name, "must be a float or a float32 numpy array", type(s).__name__)
    if not np.isfinite(arr).all():
        _fail(name, "must be finite", arr.ravel()[~np.isfinite(arr.ravel())][:4])
    return arr


def _scaling(sa, sb, M: int, N: int):
    """Tensorwise when both scales have one element (torch: numel() == 1), rowwise for (M, 1) and (1, N)."""
    if sa.size == 1 and sb.size == 1:
        return sa.reshape(()), sb.reshape(()), "tensorwise"
    if sa.shape == (M, 1) and sb.shape == (1, N):
        return sa, sb, "rowwise"
    if sa.shape == (M, 1):
        bad = "scale_b"
    elif sb.shape == (1, N):
        bad = "scale_a"
    else:
        bad = "scale_b" if sa.size == 1 else "scale_a"
    _fail(bad, f"scales must both have one element (tensorwise), or be scale_a of shape (M, 1) = ({M}, 1) and "
               f"scale_b of shape (1, N) = (1, {N}) (rowwise)", f"scale_a shape {sa.shape}, scale_b shape {sb.shape}")


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
    if K % 16 or K == 0:
        _fail("a", "K (a.shape[1]) must be a positive multiple of 16, as torch._scaled_mm requires", K)
    if N % 16 or N == 0:
        _fail("b", "N (b.shape[1]) must be a positive multiple of 16, as torch._scaled_mm requires", N)
    if out_dtype not in OUT_DTYPES:
        _fail("out_dtype", f"must be one of {sorted(OUT_DTYPES)}", repr(out_dtype))
    if not isinstance(fast_accum, (bool, np.bool_)):
        _fail("fast_accum", "must be a bool", type(fast_accum).__name__)
    sa, sb, scaling = _scaling(_check_scale(scale_a, "scale_a"), _check_scale(scale_b, "scale_b"), M, N)
    sa, sb = sa.astype(np.float32), sb.astype(np.float32)
    bias_f32, bias_dtype = None, None
    if bias is not None:
        if not isinstance(bias, np.ndarray) or bias.dtype not in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)):
            _fail("bias", "must be a numpy array of ml_dtypes bfloat16 or float16",
                  getattr(bias, "dtype", type(bias).__name__))
        if bias.shape != (N,):
            _fail("bias", f"must have shape (N,) = ({N},)", f"shape {bias.shape}")
        bias_dtype = "bfloat16" if bias.dtype == np.dtype(ml_dtypes.bfloat16) else "float16"
        bias_f32 = bias.astype(np.float32)
    if backend not in ("auto",) + BACKENDS:
        _fail("backend", f"must be 'auto' or one of {BACKENDS}", repr(backend))
    prof.check_features(fa.name, fb.name, out_dtype, scaling, bias_dtype)
    if M == 0:  # torch returns an empty (0, N) result
        return np.empty((0, N), dtype=OUT_DTYPES[out_dtype])

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
