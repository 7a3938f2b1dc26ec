"""Number formats: FP8 operand decoding and FP32-accumulator output encoding.

FP8 formats follow the OCP 8-bit floating point specification (v1.0, 2023):

* ``e4m3`` (ml_dtypes ``float8_e4m3fn``): bias 7, 3 fraction bits, no infinity,
  NaN = 0x7F / 0xFF, largest finite 448, smallest subnormal 2**-9.
* ``e5m2`` (ml_dtypes ``float8_e5m2``): bias 15, 2 fraction bits, IEEE-like
  infinities (0x7C / 0xFC) and NaNs (exponent field 31, fraction != 0).

Every code is decoded to ``(sign, m, e)`` with value ``sign * m * 2**(e - f)``,
``f`` the fraction bits, ``m`` the integer significand including the hidden bit
(``2**f <= m < 2**(f+1)`` for normals) and ``e`` the unbiased exponent; a
subnormal keeps the minimum exponent and ``m < 2**f``. This is the
``frexp_and_normalize`` convention of MMA-Sim (arXiv:2511.10909,
``mmasim/arithmetic/fdpa.py``): significand in [1, 2), subnormals not
renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "FP8Format",
    "E4M3",
    "E5M2",
    "FP8_FORMATS",
    "fp8_format",
    "OUT_DTYPES",
    "encode_output",
]


@dataclass(frozen=True)
class FP8Format:
    """An 8-bit float format and its decode tables (indexed by the uint8 code)."""

    name: str  # "e4m3" or "e5m2"
    np_dtype: type
    exp_bits: int
    frac_bits: int
    bias: int

    @property
    def emin(self) -> int:
        return 1 - self.bias

    def tables(self):
        """(sign, m, e, is_nan, is_inf) arrays of length 256, cached."""
        return _TABLES[self.name]


def _build_tables(fmt: FP8Format):
    codes = np.arange(256, dtype=np.int32)
    sign = np.where(codes & 0x80, -1, 1).astype(np.int8)
    efield = (codes >> fmt.frac_bits) & ((1 << fmt.exp_bits) - 1)
    frac = codes & ((1 << fmt.frac_bits) - 1)
    m = np.where(efield == 0, frac, frac | (1 << fmt.frac_bits)).astype(np.int32)
    e = np.where(efield == 0, fmt.emin, efield - fmt.bias).astype(np.int32)
    emax_field = (1 << fmt.exp_bits) - 1
    if fmt.name == "e4m3":  # fn: only S.1111.111 is NaN, no infinity
        is_nan = (efield == emax_field) & (frac == (1 << fmt.frac_bits) - 1)
        is_inf = np.zeros(256, dtype=bool)
    else:  # IEEE-like
        is_nan = (efield == emax_field) & (frac != 0)
        is_inf = (efield == emax_field) & (frac == 0)
    m = np.where(is_nan | is_inf, 0, m).astype(np.int32)
    # Cross-check the decode against ml_dtypes' own conversion (exact for FP8).
    ref = codes.astype(np.uint8).view(fmt.np_dtype).astype(np.float64)
    mine = sign * m * np.ldexp(1.0, e - fmt.frac_bits)
    ok = ~(is_nan | is_inf)
    assert np.array_equal(ref[ok], mine[ok]), fmt.name
    assert np.array_equal(np.isnan(ref), is_nan) and np.array_equal(np.isinf(ref), is_inf)
    return sign, m, e, is_nan, is_inf


E4M3 = FP8Format("e4m3", ml_dtypes.float8_e4m3fn, 4, 3, 7)
E5M2 = FP8Format("e5m2", ml_dtypes.float8_e5m2, 5, 2, 15)
FP8_FORMATS = {"e4m3": E4M3, "e5m2": E5M2}
_TABLES = {f.name: _build_tables(f) for f in FP8_FORMATS.values()}

_DTYPE_TO_FORMAT = {np.dtype(E4M3.np_dtype): E4M3, np.dtype(E5M2.np_dtype): E5M2}
_NAME_ALIASES = {
    "e4m3": E4M3, "e4m3fn": E4M3, "float8_e4m3fn": E4M3,
    "e5m2": E5M2, "float8_e5m2": E5M2,
}


def fp8_format(spec) -> FP8Format | None:
    """The FP8Format for a numpy dtype or a name (e4m3, e4m3fn, float8_e4m3fn, e5m2, ...)."""
    if isinstance(spec, FP8Format):
        return spec
    if isinstance(spec, str):
        return _NAME_ALIASES.get(spec.lower())
    try:
        return _DTYPE_TO_FORMAT.get(np.dtype(spec))
    except TypeError:
        return None


# Output formats of torch._scaled_mm that cpemu emulates, with their numpy dtypes.
OUT_DTYPES = {
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
}

# Canonical NaN bit patterns written by NVIDIA conversions (PTX ISA, cvt: "NaN
# inputs produce a canonical NaN"; observed 0x7FFF for bf16/fp16 and 0x7FFFFFFF
# for fp32 on the tensor-core accumulator). The profile may override them.
CANONICAL_NAN = {"bfloat16": 0x7FFF, "float16": 0x7FFF, "float32": 0x7FFFFFFF}


def encode_output(x: np.ndarray, out_dtype: str, nan_bits: int | None = None) -> np.ndarray:
    """Round an FP32 array to ``out_dtype`` as the GPU epilogue does.

    bf16 and fp16: IEEE round-to-nearest-even from FP32 (``cvt.rn.bf16.f32`` /
    ``cvt.rn.f16.f32``, PTX ISA), overflow to infinity, subnormals kept. numpy's
    float32 -> float16 cast and ml_dtypes' float32 -> bfloat16 cast implement
    exactly this rounding; only NaN payloads differ, so NaNs are rewritten to the
    canonical pattern ``nan_bits``.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    dt = OUT_DTYPES[out_dtype]
    if out_dtype == "float32":
        out = x.copy()
        bits = out.view(np.uint32)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            out = x.astype(dt)
        bits = out.view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        bits[nan] = CANONICAL_NAN[out_dtype] if nan_bits is None else nan_bits
    return out
