"""``cpu-fp32``: the reference's schedule on the CPU, each step summed as exact floating-point integers.

The step is :func:`cpemu.reference.tfdpa` computed another way, with the same bits:

* a product of two FP8 values is exact in float32 (at most 8 significant bits, exponents
  from -32 to 32);
* scaled by ``2**(F - e_max)`` (a power of two) it is the product in units of the step's
  grid, and ``trunc`` of that is the reference's ``(P << S0) >> (e_max - E)`` times the sign;
  where the scaled product falls below float32's normal range it is below 1 and truncates
  to 0 either way;
* each truncated term is an integer below ``2**(F + 2)``, so the ``L`` terms sum exactly
  in float32 while ``(L + 1) * 2**(F + 2) <= 2**24`` (the Ada and Hopper models), else in
  float64 (Blackwell's F = 25);
* the accumulator's term, c truncated to the grid, is computed in float64 (exact); the sum
  is then rounded as the reference rounds it (:func:`cpemu.reference._round_sum`), and
  NaN / Inf follow the reference's rule (:func:`cpemu.reference._specials`).

So no rounding takes part except where a value is below 1 grid unit, and every bit equals
the reference's. It replaces the integer shifts, the sign products and the int64 sums of
the specification by float multiplies, ``trunc`` and float sums, which numpy computes faster
(``benchmarks/cpu/``). The reference stays the specification; this backend is validated
against it like every other (:mod:`cpemu.backends.validation`), and
``tests/test_cpu_fp32.py`` compares the two on boundary and random cases of every model.
"""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from .reference import Reference

__all__ = ["BACKENDS", "tfdpa", "sum_dtype", "ARITHMETIC"]

#: the largest scale exponent applied to a product (float32's range): a nonzero product has
#: E >= -32, so F - e_max <= F + 32 wherever one is; above that the products are all 0 and stay 0
_SCALE_EXP_MAX = 120


def sum_dtype(model) -> type:
    """float32 where the step's terms sum exactly in it, else float64."""
    return np.float32 if (model.L + 1) * 2 ** (model.F + 2) <= 2 ** 24 else np.float64


def _values(x: ref.Operand, dt) -> np.ndarray:
    """The operand's values (sign * m * 2**(e - frac_bits)), exact in ``dt``; 0 for zeros, NaN
    and Inf codes (an output that meets NaN or Inf is set by the specials rule)."""
    e = np.where(x.m == 0, 0, x.e_nz).astype(np.int32) - x.frac_bits
    v = np.ldexp((x.sign * x.m).astype(dt), e).astype(dt, copy=False)
    if x.has_special:
        v[x.nan | x.inf] = 0
    return v


def tfdpa(c: np.ndarray, a: ref.Operand, b: ref.Operand, model) -> np.ndarray:
    """One T-FDPA step for every output of a block: :func:`cpemu.reference.tfdpa`'s arguments
    and bits."""
    F = model.F
    dt = sum_dtype(model)
    # K first: (Lk, Mb, Nb), so that the reductions over K are elementwise operations on whole planes
    kf = np.ascontiguousarray  # a transposed view would make numpy lay the products out K last again
    E = kf(a.e_nz.T)[:, :, None] + kf(b.e_nz.T)[:, None, :]  # int16; ZERO_EXP + ZERO_EXP for a zero product
    c64 = c.astype(np.float64)
    c64 = np.where(np.isfinite(c64), c64, 0.0)  # NaN / Inf accumulators: the specials rule
    _, ex = np.frexp(c64)
    ce = np.where(c64 == 0, model.e_zero, np.maximum(ex.astype(np.int32) - 1, -126))
    e_max = np.maximum(E.max(axis=0).astype(np.int32), ce)
    P = kf(_values(a, dt).T)[:, :, None] * kf(_values(b, dt).T)[:, None, :]  # exact products
    P *= np.ldexp(dt(1), np.minimum(F - e_max, _SCALE_EXP_MAX)).astype(dt)
    np.trunc(P, out=P)
    S = P.sum(axis=0, dtype=dt).astype(np.int64)  # exact: integers below 2**24 (float32) or 2**53
    S += np.trunc(np.ldexp(c64, F - e_max)).astype(np.int64)
    out = ref._round_sum(S, e_max - F, model.result_fraction_bits)
    if a.has_special or b.has_special or not np.isfinite(c).all():
        out = ref._specials(out, c, a, b)
    return out


#: blocks of 2**20 (output, product) pairs, 8 times the reference's: numpy's per-call cost is
#: then small beside each call's work, so that worker threads run in parallel (the calls on
#: one block's outputs hold the GIL); temporaries: P (float32 or float64), E (int16), the
#: operands' K-first copies and the specials' masks
ARITHMETIC = ref.Arithmetic(tfdpa, 1 << 20, 24)


class CpuFp32(Reference):
    name = "cpu-fp32"
    arith = ARITHMETIC

    def detail(self) -> str:
        return "numpy on the CPU, steps summed as exact float32 (float64 where float32 cannot hold the sum)"


BACKENDS = {"cpu-fp32": CpuFp32()}
