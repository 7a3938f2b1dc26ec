"""FP8 decoding and output encoding, bit for bit, against independent models.

Decoding is checked on every code of both formats against ml_dtypes' own conversion;
the FP32 -> bf16 / fp16 round-to-nearest-even used by the epilogue is checked against an
exact rational model (fractions.Fraction) on generated boundary inputs: every rounding
step's midpoint and its neighbours, both signs, subnormal and overflow edges.
"""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from cpemu.formats import E4M3, E5M2, encode_output
from cpemu.reference import Operand


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_decode_every_code(fmt):
    codes = np.arange(256, dtype=np.uint8)
    op = Operand(codes, fmt)
    want = codes.view(fmt.np_dtype).astype(np.float64)
    finite = ~(op.nan | op.inf)
    got = op.sign.astype(np.float64) * op.m * np.ldexp(1.0, op.e_nz.astype(np.int64) - fmt.frac_bits)
    got = np.where(op.m == 0, 0.0 * op.sign, got)
    assert np.array_equal(got[finite].view(np.uint64) & ~np.uint64(1 << 63), np.abs(want[finite]).view(np.uint64)), \
        [hex(c) for c in codes[finite][got[finite] != want[finite]]]
    assert np.array_equal(op.nan, np.isnan(want))
    assert np.array_equal(op.inf, np.isinf(want))
    nan_codes = {0x7F, 0xFF} if fmt is E4M3 else {c for c in range(256) if (c & 0x7C) == 0x7C and c & 3}
    assert set(np.nonzero(op.nan)[0]) == nan_codes


def _rne(x: Fraction, man_bits: int, emin: int, emax: int) -> Fraction:
    """Exact round-to-nearest-even of x to a binary format (independent model)."""
    if x == 0:
        return Fraction(0)
    s = -1 if x < 0 else 1
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = Fraction(2) ** (max(e, emin) - man_bits)  # quantum (subnormals keep emin's quantum)
    n, r = divmod(a, q)
    n = int(n)
    if r > q / 2 or (r == q / 2 and n % 2 == 1):
        n += 1
    v = n * q
    if v >= Fraction(2) ** (emax + 1):
        return s * Fraction(10) ** 400  # overflow marker -> inf
    return s * v


def _boundary_fp32(man_bits: int, emin: int, emax: int, rng) -> np.ndarray:
    """FP32 bit patterns at and around every rounding midpoint of a target format."""
    drop = 23 - man_bits
    pats = []
    for e in list(range(emin - man_bits - 2, emin + 3)) + list(range(emax - 2, emax + 2)) + [0, 1, -1, 5]:
        if not -126 <= e <= 127:
            continue
        for frac in rng.integers(0, 1 << man_bits, 24).tolist() + [0, (1 << man_bits) - 1]:
            base = ((e + 127) << 23) | (frac << drop)
            half = 1 << (drop - 1)
            for d in (-1, 0, 1):
                pats += [base + half + d, base + d % (1 << drop), base]
    pats = np.array([p for p in pats if 0 <= p < 0x7F800000], dtype=np.uint32)
    return np.concatenate([pats, pats | np.uint32(0x80000000), np.arange(0, 64, dtype=np.uint32)])


@pytest.mark.parametrize("out,man,emin,emax,dt", [
    ("bfloat16", 7, -126, 127, ml_dtypes.bfloat16),
    ("float16", 10, -14, 15, np.float16)])
def test_encode_rne_against_exact_model(out, man, emin, emax, dt):
    rng = np.random.default_rng(7)
    bits = _boundary_fp32(man, emin, emax, rng)
    x = bits.view(np.float32)
    got = encode_output(x, out).astype(np.float64)
    for xi, gi, b in zip(x.astype(np.float64), got, bits):
        want = _rne(Fraction(float(xi)), man, emin, emax)
        if abs(want) > 10 ** 300:
            assert np.isinf(gi) and np.sign(gi) == np.sign(xi), hex(b)
        else:
            assert Fraction(float(gi)) == want, f"fp32 0x{int(b):08x}: got {gi!r}, want {float(want)!r}"


def test_nan_canonical_bits():
    x = np.array([0x7FC00000, 0xFFFFFFFF, 0x7F800001], dtype=np.uint32).view(np.float32)
    assert (encode_output(x, "bfloat16").view(np.uint16) == 0x7FFF).all()
    assert (encode_output(x, "float16").view(np.uint16) == 0x7FFF).all()
    assert (encode_output(x, "float32").view(np.uint32) == 0x7FFFFFFF).all()
