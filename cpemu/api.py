"""``cpemu.gemm``: the semantic twin of ``torch._scaled_mm`` on numpy arrays."""

from __future__ import annotations

import math
import numbers

import ml_dtypes
import numpy as np

from . import backends
from .call import Operands
from .formats import OUT_DTYPES, fp8_format
from .profile import DEFAULT_PROFILE, get_profile
from .progress import Progress

BACKENDS = backends.LADDER  # best first; "auto" picks the first available, validated one

__all__ = ["gemm", "bits_to_float32", "BACKENDS"]


def _fail(arg: str, rule: str, got) -> None:
    raise ValueError(f"{arg}: {rule} (got {got})")


def _check_operand(x, name: str):
    if isinstance(x, np.ma.MaskedArray):
        _fail(name, "must be a plain numpy array (a masked array's mask has no meaning for FP8 codes)", "MaskedArray")
    if not isinstance(x, np.ndarray):
        _fail(name, "must be a numpy array of ml_dtypes float8_e4m3fn or float8_e5m2", type(x).__name__)
    fmt = fp8_format(x.dtype)
    if fmt is None:
        _fail(name, "dtype must be ml_dtypes float8_e4m3fn or float8_e5m2", x.dtype)
    if x.ndim != 2:
        _fail(name, "must be a 2-D matrix", f"shape {x.shape}")
    return fmt


_F32_MAX = float(np.finfo(np.float32).max)


def _check_scale(s, name: str):
    """A float32 array of the scale (torch takes float32 scale tensors)."""
    if isinstance(s, numbers.Real) and not isinstance(s, (bool, np.bool_, np.ndarray)) and np.ndim(s) == 0:
        try:
            f = float(s)
        except OverflowError:
            _fail(name, "must be finite and representable in float32", s)
        if not math.isfinite(f):
            _fail(name, "must be finite", s)
        if abs(f) > _F32_MAX or float(np.float32(f)) != f:
            _fail(name, "a Python scalar scale must be exactly representable in float32 "
                        "(pass np.float32(x) to round it as torch.tensor(x) does)", s)
        return np.array(f, dtype=np.float32)
    if not isinstance(s, np.ndarray):
        _fail(name, "must be a float or a float32 numpy array", type(s).__name__)
    if s.dtype != np.float32:
        _fail(name, "must be a float32 scalar or array (torch._scaled_mm takes float32 scales)", s.dtype)
    if not (math.isfinite(s.item()) if s.size == 1 else np.isfinite(s).all()):
        _fail(name, "must be finite", s.ravel()[~np.isfinite(s.ravel())][:4])
    return s


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


def _is_cupy(x) -> bool:
    return type(x).__module__.split(".")[0] == "cupy"


def _check_device_operand(x, name: str, fmt_name, k_major: bool):
    """A cupy operand: uint8 codes with the format named, K contiguous."""
    if x.dtype != np.uint8:
        _fail(name, "a cupy operand must hold uint8 FP8 codes, with the format given by a_format/b_format", x.dtype)
    fmt = fp8_format(fmt_name) if fmt_name is not None else None
    if fmt is None:
        _fail(f"{name}_format", "must name the FP8 format of a cupy operand: 'e4m3' or 'e5m2'", repr(fmt_name))
    if x.ndim != 2:
        _fail(name, "must be a 2-D matrix", f"shape {x.shape}")
    # K contiguous: the strides of a dense uint8 (M, K) / column-major (K, N) matrix, else the flags
    contiguous = x.strides == ((x.shape[1], 1) if k_major else (1, x.shape[0])) or \
        (x.flags.c_contiguous if k_major else x.T.flags.c_contiguous)
    if not contiguous and x.size:
        _fail(name, "a cupy operand must be " + ("C-contiguous (M, K)" if k_major else
                                                  "a column-major (K, N) matrix, e.g. bt.T of a C-contiguous (N, K)"),
              f"strides {x.strides}")
    return fmt


def gemm(a, b, *, profile=DEFAULT_PROFILE, scale_a=1.0, scale_b=1.0, bias=None, out_dtype="bfloat16",
         fast_accum=True, backend="auto", a_format=None, b_format=None, progress=False, split_k=None):
    """``out = (a @ b) * scale_a * scale_b (+ bias)`` with the bits of the profile's GPU.

    ``a``: (M, K) and ``b``: (K, N) numpy arrays of ml_dtypes ``float8_e4m3fn`` /
    ``float8_e5m2`` (``b`` may be a transposed view, like torch's column-major operand;
    any strides are accepted), or cupy uint8 arrays of FP8 codes with ``a_format`` /
    ``b_format`` ("e4m3" or "e5m2"; ``a`` C-contiguous, ``b`` column-major, i.e. ``bt.T``).
    K and N must be multiples of 16 (torch._scaled_mm's rule).
    ``scale_a``/``scale_b``: float scalars, or float32 arrays of shape (M, 1) and (1, N)
    for rowwise scaling. ``bias``: (N,) ml_dtypes bfloat16 (float16 for float16 output).
    ``out_dtype``: "bfloat16", "float16" or "float32". ``fast_accum``: torch's
    ``use_fast_accum``. ``backend``: "auto" (the fastest validated one, see
    :mod:`cpemu.backends`) or a name. ``progress``: True draws a line with the share done and
    an estimate of the time left on stderr, for work that runs over a second on the CPU and
    only when stderr is a terminal (:class:`cpemu.progress.Progress`). ``split_k``: None (the
    profile decides) or the number of split-K slices the library uses, as cuBLASLt's
    ``CUBLASLT_ALGO_CONFIG_SPLITK_NUM``: the caller's statement, in place of the profile's split-K
    tables (for a kernel author's chosen schedule, or a shape the profile does not record);
    1 <= split_k <= ceil(K / 128) (the profile's K tile). What the tables say about the library's
    heuristic is then not consulted: the split-K domain, and the shapes where cuBLASLt has no
    algorithm (torch raises there); the output's memory is still checked.

    Returns, for numpy inputs, a C-contiguous numpy array of ``out_dtype`` whose bytes equal
    torch._scaled_mm's output on the profile's GPU; for cupy inputs a cupy array on the
    same device, float32, or uint16 bit patterns for bfloat16 / float16 (view them with
    :func:`cpemu.bits_to_float32`), computed on the current cupy stream.
    """
    prof = get_profile(profile)
    on_gpu = _is_cupy(a) or _is_cupy(b)
    fa, fb = _check_operands(a, b, a_format, b_format, on_gpu)
    M, K = a.shape
    N = b.shape[1]
    if not isinstance(out_dtype, str) or out_dtype not in OUT_DTYPES:
        _fail("out_dtype", f"must be one of {sorted(OUT_DTYPES)}", repr(out_dtype))
    if not isinstance(fast_accum, (bool, np.bool_)):
        _fail("fast_accum", "must be a bool", type(fast_accum).__name__)
    if not isinstance(progress, (bool, np.bool_)):
        _fail("progress", "must be a bool", type(progress).__name__)

    scale_a, scale_b, bias = _host_arguments(scale_a, scale_b, bias)
    sa, sb, scaling = _scaling(_check_scale(scale_a, "scale_a"), _check_scale(scale_b, "scale_b"), M, N)
    sa, sb = np.asarray(sa, dtype=np.float32), np.asarray(sb, dtype=np.float32)
    bias_f32, bias_dtype = _check_bias(bias, N)
    if split_k is not None:
        g = prof.split_rule(scaling).granularity
        top = max(1, -(-K // g))
        if isinstance(split_k, (bool, np.bool_)) or not isinstance(split_k, (int, np.integer)) or not 1 <= split_k <= top:
            _fail("split_k", f"must be None or an integer from 1 to ceil(K / {g}) = {top}", repr(split_k))
    if backend != "auto" and backend not in backends.LADDER:
        _fail("backend", f"must be 'auto' or one of {backends.LADDER}", repr(backend))
    if M == 0:  # torch returns an empty (0, N) result
        prof.check_features(fa.name, fb.name, out_dtype, scaling, bias_dtype)
        if backend != "auto":
            backends.select(backend, prof)  # a backend asked for by name must be able to run here
        y = np.empty((0, N), dtype=OUT_DTYPES[out_dtype])
        return __import__("cupy").asarray(y.view(np.float32 if out_dtype == "float32" else np.uint16)) \
            if on_gpu else y
    call = prof.call(M, N, K, fa.name, fb.name, out_dtype, scaling, bool(fast_accum), bias_dtype,
                     None if split_k is None else int(split_k))
    if not on_gpu:
        # views, never copies: the reference reads any strides, a device backend gets contiguous copies
        ops = Operands(a.view(np.uint8), b.T.view(np.uint8), sa, sb, bias_f32)
        name = backends.select(backend, prof, call)
        with Progress(M * N * K if progress else 0, f"cpemu.gemm {M}x{N}x{K}") as line:
            return backends.run(name, call, ops, on_device=False, progress=line if progress else None)
    import cupy

    ops = Operands(a, b.T, sa, sb, bias_f32)
    if cupy.cuda.runtime.getDevice() == a.device.id:
        return backends.run(backends.select(backend, prof, call), call, ops, on_device=True)
    with cupy.cuda.Device(a.device.id):  # select and run where the operands are
        return backends.run(backends.select(backend, prof, call), call, ops, on_device=True)


def _check_operands(a, b, a_format, b_format, on_gpu: bool):
    """The operands' formats, after the rules of numpy (ml_dtypes FP8) or cupy (uint8 codes) operands."""
    if on_gpu:
        if not (_is_cupy(a) and _is_cupy(b)):
            _fail("b" if _is_cupy(a) else "a", "a and b must both be numpy or both be cupy arrays",
                  f"{type(a).__module__}.{type(a).__name__} and {type(b).__module__}.{type(b).__name__}")
        if a.device != b.device:
            _fail("b", "must be on the same device as a", f"devices {a.device} and {b.device}")
        fa = _check_device_operand(a, "a", a_format, True)
        fb = _check_device_operand(b, "b", b_format, False)
    else:
        fa = _check_operand(a, "a")
        fb = _check_operand(b, "b")
        for name, fmt, given in (("a", fa, a_format), ("b", fb, b_format)):
            if given is not None and fp8_format(given) is not fmt:
                _fail(f"{name}_format", f"must name the dtype of the numpy operand {name} ({fmt.name}) or be None",
                      repr(given))
    M, K = a.shape
    K2, N = b.shape
    if K != K2:
        _fail("b", f"must have shape (K, N) with K = a.shape[1] = {K}", f"shape {b.shape}")
    if K % 16 or K == 0:
        _fail("a", "K (a.shape[1]) must be a positive multiple of 16, as torch._scaled_mm requires", K)
    if N % 16 or N == 0:
        _fail("b", "N (b.shape[1]) must be a positive multiple of 16, as torch._scaled_mm requires", N)
    return fa, fb


def _host_arguments(scale_a, scale_b, bias):
    """Scales and bias given as cupy arrays, copied to the host (bf16 bias bits viewed as bfloat16)."""
    if not (_is_cupy(scale_a) or _is_cupy(scale_b) or _is_cupy(bias)):
        return scale_a, scale_b, bias
    import cupy

    scale_a, scale_b = (cupy.asnumpy(x) if _is_cupy(x) else x for x in (scale_a, scale_b))
    bias = cupy.asnumpy(bias) if _is_cupy(bias) else bias
    if bias is not None and bias.dtype == np.uint16:  # bf16 bits from the device
        bias = bias.view(ml_dtypes.bfloat16)
    return scale_a, scale_b, bias


def _check_bias(bias, N: int):
    """(bias widened to float32, its dtype name), or (None, None)."""
    if bias is None:
        return None, None
    if not isinstance(bias, np.ndarray) or bias.dtype not in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)):
        _fail("bias", "must be a numpy array of ml_dtypes bfloat16 or float16",
              getattr(bias, "dtype", type(bias).__name__))
    if bias.shape != (N,):
        _fail("bias", f"must have shape (N,) = ({N},)", f"shape {bias.shape}")
    return bias.astype(np.float32), "bfloat16" if bias.dtype == np.dtype(ml_dtypes.bfloat16) else "float16"


def bits_to_float32(bits, out_dtype: str = "bfloat16"):
    """View uint16 bf16/fp16 bit patterns (numpy or cupy) as float32 values (exact)."""
    if not (isinstance(bits, np.ndarray) or _is_cupy(bits)):
        _fail("bits", "must be a numpy or cupy array of uint16 bit patterns", type(bits).__name__)
    if bits.dtype != np.uint16:
        _fail("bits", "must have dtype uint16 (the bit patterns cpemu.gemm returns for bfloat16 and float16)",
              bits.dtype)
    xp = __import__("cupy") if _is_cupy(bits) else np
    if out_dtype == "bfloat16":
        return (bits.astype(xp.uint32) << 16).view(xp.float32)
    if out_dtype == "float16":
        return bits.view(xp.float16).astype(xp.float32)
    raise ValueError(f"out_dtype: must be 'bfloat16' or 'float16' for bit patterns (got {out_dtype!r})")
