"""The arithmetic of ``cuda-rzacc``'s T-FDPA step in numpy, with its claims asserted.

``cuda_src/cpemu_tiled.cuh`` built with ``CPT_RZACC=1`` (``cpt_sum_rzacc`` in ``cpemu_tiled_pass2.cuh``) computes a step of
:func:`cpemu.reference.tfdpa` for F <= 14 without shifting any product:

1. ``g = e_max - F`` is the step's truncation grid (e_max as the reference finds it, with a
   zero accumulator's exponent taken as -126, which changes nothing: every term is then zero);
2. the accumulator ``X`` starts at ``B + trunc(c)`` with ``B = 1.5 * 2**(g + 23)``, so it lies in
   the binade ``[2**(g+23), 2**(g+24))`` whose ulp is ``2**g``;
3. each product is one FP32 round-toward-zero fused multiply-add of the signed operands into
   ``X``; ``X`` stays positive and in its binade, so this adds ``floor(a*b / 2**g) * 2**g``;
4. floor and the reference's truncation toward zero differ by one unit exactly for a negative
   product with bits below ``2**g``: with lambda the exponent of an operand's lowest set bit,
   that is ``lambda_a + lambda_b < g``. The kernel counts them from one byte per code,
   ``n = 63 - (lambda - lambda_min)`` (0 for zero, NaN and Inf codes): bit 7 of
   ``n_a + n_b + T``, ``T = clamp(g - 1 - lambda_min_a - lambda_min_b, -1, 62) + 2``, ANDed
   with the XOR of the sign bits;
5. the count is added to X's bit pattern, ``X - B`` is exact, and clearing the low ``23 - R``
   bits of its encoding rounds it toward zero to R fraction bits.

:func:`step` does exactly that, on exact integers in units of ``2**g``, and asserts each claim
(the binade after every product, the byte range of the count's sums, the count's flag against
the definition of truncation). NaN and Inf terms are finished by the reference's own rule.

``step(..., parts=P)`` is the same step with its products split over P accumulators, as P
threads of a warp would share one output (a design for small M, where the outputs alone give
too few threads): part t takes the products k = t, t + P, ...; part 0 starts at ``B + trunc(c)``,
the others at ``B``; each adds its products and its own count, and ``S = sum_t (X_t - B)``.
Every ``X_t - B`` is an integer below 2**22 units, so the FP32 sum of the parts (in any order) is
exact and equals the one-accumulator S. The twin asserts both claims.
"""

from __future__ import annotations

import numpy as np

from .formats import FP8_FORMATS, FP8Format
from .instruction import InstructionModel
from .reference import Operand, _specials

__all__ = ["MAX_F", "lambda_min", "code_tables", "count_threshold", "step", "round_result", "pass1_sums", "emax_read",
           "emax_bits"]

#: the largest F whose step sum the biased accumulator's binade holds (kernels.RZACC_MAX_F)
MAX_F = 14


def lambda_min(fmt: FP8Format) -> int:
    """The exponent of the smallest subnormal of ``fmt``: 2**(1 - bias - frac_bits)."""
    return 1 - fmt.bias - fmt.frac_bits


def code_tables(fmt: FP8Format):
    """Per code: (exact value as float64, 0 for NaN / Inf; the count's byte n; the sign bit)."""
    sign, m, e, nan, inf = fmt.tables()
    m = m.astype(np.int64)
    e = e.astype(np.int64)
    value = sign.astype(np.float64) * m * np.exp2((e - fmt.frac_bits).astype(np.float64))
    value[nan | inf] = 0.0
    nz = (m != 0) & ~nan & ~inf
    tz = np.zeros(256, dtype=np.int64)
    for t in range(1, 4):
        tz[nz & ((m >> t) << t == m)] = t
    lam = e - fmt.frac_bits + tz
    n = np.where(nz, 63 - (lam - lambda_min(fmt)), 0)
    assert ((n >= 32) & (n <= 63))[nz].all() and (n[~nz] == 0).all(), "lambda range: 32 values at most"
    sbit = (np.arange(256) >> 7) & 1
    return value, n.astype(np.int64), sbit.astype(np.int64), lam, nz


def count_threshold(g: np.ndarray, fa: FP8Format, fb: FP8Format) -> np.ndarray:
    """T of every output: clamp(g - 1 - lambda_min_a - lambda_min_b, -1, 62) + 2."""
    return np.clip(g - 1 - lambda_min(fa) - lambda_min(fb), -1, 62) + 2


def _c_exp(c: np.ndarray) -> np.ndarray:
    """The kernel's exponent of c: the exponent field (at least 1) minus 127."""
    bits = c.view(np.uint32).astype(np.int64)
    return np.maximum((bits >> 23) & 0xFF, 1) - 127


def round_result(x: np.ndarray, model: InstructionModel) -> np.ndarray:
    """A step's result rounded toward zero to the model's R fraction bits (clearing the low bits)."""
    bits = x.astype(np.float32).view(np.uint32) & np.uint32((0xFFFFFFFF << (23 - model.result_fraction_bits)) & 0xFFFFFFFF)
    return bits.view(np.float32) + np.float32(0.0)


def _bf16_rn(x: np.ndarray) -> np.ndarray:
    """Nonnegative float64 values to the nearest bf16 (7 fraction bits, ties to even), as float64."""
    u = x.astype(np.float64).view(np.uint64)
    u = (u + np.uint64((1 << 44) - 1) + ((u >> np.uint64(45)) & np.uint64(1))) >> np.uint64(45) << np.uint64(45)
    return u.view(np.float64)


def pass1_sums(a_codes: np.ndarray, b_codes: np.ndarray, lean: bool = False) -> np.ndarray:
    """``cpt_emax_bf16``'s sums (e4m3 x e4m3): for each output, lane h (0: the low half) sums the
    terms ``2**(8 (e_a - 1) + d) * 2**(8 (e_b - 1))`` of the products k = h, h + 2, ... in k order,
    each ``fma.rn.bf16x2`` rounded to bf16 (d = 1 under ``CPT_LEAN``, which doubles A's terms, else
    0; a zero code's term is 0). Returns the (Mb, Nb) uint32 words of the two lanes."""
    sign, m, e, nan, inf = FP8_FORMATS["e4m3"].tables()
    e = e.astype(np.int64)
    ta = np.where(m != 0, np.exp2((8 * (e - 1) + int(lean)).astype(np.float64)), 0.0)[a_codes]
    tb = np.where(m != 0, np.exp2((8 * (e - 1)).astype(np.float64)), 0.0)[b_codes]
    lanes = np.zeros((2, a_codes.shape[0], b_codes.shape[0]))
    for k in range(a_codes.shape[1]):
        h = k % 2
        t = ta[:, None, k] * tb[None, :, k]  # a power of two (or 0), exact
        # the float64 sum is exact, or t is below 2**-53 of the lane and far from a bf16 tie
        lanes[h] = _bf16_rn(lanes[h] + t)
        assert (lanes[h] < 2.0 ** 127).all() and ((lanes[h] == 0) | (lanes[h] >= 2.0 ** -126)).all(), "normal bf16"
    bits = [l.astype(np.float32).view(np.uint32).astype(np.uint64) >> 16 for l in lanes]
    return (bits[0] | (bits[1] << 16)).astype(np.uint32)


def emax_read(X: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The shipped reading (``cpt_emax_bf16_read``): e_max of each output from its sums X and c."""
    X = X.astype(np.int64)
    mx = np.maximum(X & 0xFFFF, X >> 16)
    e = np.where(mx != 0, (((mx >> 7) + 1) >> 3) - 14, -256)
    return np.maximum(_c_exp(c), e)


def emax_bits(X: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``CPT_LEAN``'s reading (``cpt_emax_bf16_bits``, sums of :func:`pass1_sums` with ``lean``): the
    FP32 bits of the larger of |c| and the products' 2**E_max, whose exponent field is e_max + 127
    (0 bits only where c and every product are zero)."""
    X = X.astype(np.uint32)
    sw = ((X >> 16) | (X << 16)).astype(np.uint32)
    W = np.maximum(X, sw)
    y = ((W.astype(np.int64) - (1 << 27)) >> 3) & 0xFFFFFFFF  # arithmetic shift, as 32-bit bits
    p = ((y & 0x9F800000) + (115 << 23)) & 0xFFFFFFFF
    nz = W != 0
    assert (W[nz] >= 1 << 27).all(), "a nonzero sum's larger lane has a biased exponent >= 16"
    assert ((p[~nz] >> 31) == 1).all(), "every product zero: p is negative"
    assert (p[nz] == ((W[nz].astype(np.int64) >> 26) + 113) << 23).all(), "p is 2**E_max, E_max = (W >> 26) - 14"
    pf = p.astype(np.uint32).view(np.float32)
    return np.fmax(np.abs(c.astype(np.float32)), pf).view(np.uint32)


def step(c: np.ndarray, a_codes: np.ndarray, b_codes: np.ndarray, fa: FP8Format, fb: FP8Format,
         model: InstructionModel, parts: int = 1, rounded: bool = True) -> np.ndarray:
    """One step: ``c`` (Mb, Nb) float32, ``a_codes`` (Mb, Lk), ``b_codes`` (Nb, Lk) uint8,
    ``Lk <= model.L``. Returns the (Mb, Nb) float32 result, bit for bit ``reference.tfdpa``'s.
    ``parts``: the products split over that many accumulators (module docstring). ``rounded=False``:
    the result before its rounding to R fraction bits (``CPT_LEAN`` rounds at a chain's end only; then
    ``c`` may be such an unrounded result)."""
    F, R = model.F, model.result_fraction_bits
    assert F <= MAX_F and model.L <= 32, "the binade holds the step's sum for F <= 14, L <= 32"
    va, na, sa, la, nza = (t[a_codes] for t in code_tables(fa))
    vb, nb, sb, lb, nzb = (t[b_codes] for t in code_tables(fb))
    A, Bop = Operand(a_codes, fa), Operand(b_codes, fb)
    E = A.e_nz[:, None, :].astype(np.int64) + Bop.e_nz[None, :, :]
    finite = np.isfinite(c)
    c_ok = np.where(finite, c, np.float32(0))
    e_max = np.maximum(E.max(axis=-1), _c_exp(c_ok))
    g = e_max - F
    unit = np.exp2(g.astype(np.float64))
    base = 3 << 22  # B = 1.5 * 2**(g + 23) in units of 2**g
    # the kernel truncates c as RZ(c + Cs) - Cs, Cs = +-2**(g + 23) of c's sign: exact (one binade, ulp 2**g)
    # because |c| < 2**(e_max + 1) <= 2**(g + 23)
    assert (np.abs(c_ok.astype(np.float64)) < np.exp2((g + 23).astype(np.float64))).all(), "c's truncation is exact"
    # CPT_LEAN truncates c as RZ(Cs * 2**(23 - F) + c) - Cs * 2**(23 - F) with Cs = +-1.5 * 2**e_max of c's
    # sign: 1.5 * 2**(g + 23) + |c| stays below 2**(g + 24)
    assert (np.abs(c_ok.astype(np.float64)) < np.exp2((g + 22).astype(np.float64))).all(), "CPT_LEAN's c frame"
    X0 = base + np.trunc(c_ok.astype(np.float64) / unit).astype(np.int64)
    assert ((X0 >= 1 << 23) & (X0 < 1 << 24)).all(), "X + trunc(c) in the binade"
    Xs = [X0] + [np.full_like(X0, base) for _ in range(parts - 1)]  # part t's accumulator
    T = count_threshold(g, fa, fb)
    cnts = [np.zeros_like(X0) for _ in range(parts)]
    for k in range(a_codes.shape[1]):
        t = k % parts
        p = va[:, None, k] * vb[None, :, k]  # exact: two 4-bit significands
        q = p / unit
        Xs[t] = Xs[t] + np.floor(q).astype(np.int64)
        assert ((Xs[t] >= 1 << 23) & (Xs[t] < 1 << 24)).all(), "X stays in its binade"
        x = na[:, None, k] + nb[None, :, k] + T
        assert ((x >= 0) & (x <= 255)).all(), "no carry between the count's bytes"
        flag = ((x >> 7) & 1) & (sa[:, None, k] ^ sb[None, :, k])
        want = (p < 0) & (q != np.floor(q))
        lossy = nza[:, None, k] & nzb[None, :, k] & (la[:, None, k] + lb[None, :, k] < g)
        assert (flag.astype(bool) == want).all(), "the count flags the negative products that lose bits"
        assert (lossy & (p < 0) == want).all(), "losing bits is lambda_a + lambda_b < g"
        cnts[t] += flag
    S = np.zeros_like(X0)
    for X, cnt in zip(Xs, cnts):
        X = X + cnt  # added to X's bit pattern: one ulp (2**g) each, inside the binade, so X - B is exact
        assert ((X >= 1 << 23) & (X < 1 << 24)).all(), "X plus the count stays in its binade"
        assert (np.abs(X - base) < 1 << 22).all(), "each part's X - B is exact in FP32, and so is their sum"
        S = S + (X - base)
    assert (np.abs(S) < 1 << 22).all(), "the parts' FP32 sum is exact (any order)"
    out = (S.astype(np.float64) * unit).astype(np.float32)  # exact: |S| < 2**22
    if rounded:
        out = round_result(out, model)
    if A.has_special or Bop.has_special or not finite.all():
        out = _specials(out, c, A, Bop)
    return out
