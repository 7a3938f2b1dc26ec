"""The arithmetic identities of the tiled CUDA kernel (cuda_src/cpemu_tiled.cuh), checked on the CPU.

The kernel computes each T-FDPA step with two tricks that are not the reference's arithmetic:

* ``cpt_emax_bf16``: ``e_max`` of the products of e4m3 codes, read off a bf16 sum of the powers
  of two ``2**(8 (e_a - 1)) * 2**(8 (e_b - 1))`` (16 terms per lane, round-to-nearest adds);
* ``cpt_sum_fast``: each product's magnitude truncated by ``RZ(|a| |b| + C)`` with
  ``C = 2**(e_max - F + 23)``, the encodings XORed with the product's sign mask and summed as
  wrapping 32-bit integers, corrected by a popcount of the operands' sign bits; ``c`` truncated
  by ``RZ(c + Cs) - Cs``; the result assembled by one exact fused multiply-add and a bit mask.

Here both are re-implemented in numpy exactly as the kernel states them (bf16 rounding by
ml_dtypes, FP32 encodings as uint32) and compared with the plain maximum and with
``cpemu.reference.tfdpa`` bit for bit, over every e4m3 exponent pair, the worst cases of the
bf16 bound, and random steps of several data kinds. On a GPU the kernel itself is compared with
the reference and the H200 recordings (tests/test_cuda_backends.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cpemu import reference as ref
from cpemu.cases import Case, operands
from cpemu.formats import FP8_FORMATS
from cpemu.instruction import ADA_SM89, HOPPER_SM90A

E4M3 = FP8_FORMATS["e4m3"]
SENT = -256  # CPT_SENT


# ---------------------------------------------------------------- cpt_emax_bf16


def _x_bits(e):
    """lut .y low half: bf16 bits of 2**(8 (e - 1)) (e4m3 exponents -6..8)."""
    return ((8 * (np.asarray(e) - 1) + 127) << 7).astype(np.uint32)


def _bf16(bits):
    return np.asarray(bits, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)


def emax_bf16(ea, eb):
    """The kernel's pass 1 for one output: ea, eb exponents (SENT for zero codes), even length."""
    lanes = []
    for lane in (0, 1):
        X = np.float64(0.0)
        for k in range(lane, len(ea), 2):
            if ea[k] == SENT or eb[k] == SENT:
                term = 0.0  # a zero code's table entry is 0
            else:
                term = _bf16(_x_bits(ea[k])) * _bf16(_x_bits(eb[k]))  # exact: powers of two
            # fma.rn.bf16x2: the exact a*b + X rounded once to bf16 (float64 holds it exactly here:
            # both are sums of at most 16 powers of two within 2**-112..2**117 and X has 8 bits)
            X = np.float64(np.array(X + term).astype(ml_dtypes.bfloat16))
        lanes.append(int(np.array(X).astype(ml_dtypes.bfloat16).view(np.uint16)))
    mx = max(lanes)
    return ((((mx >> 7) + 1) >> 3) - 14) if mx else SENT


def test_emax_bf16_every_exponent_pair():
    """A single product (the rest zero), for every pair of e4m3 exponents."""
    for ea in range(-6, 9):
        for eb in range(-6, 9):
            for pos in (0, 1, 31):
                a = [SENT] * 32
                b = [SENT] * 32
                a[pos], b[pos] = ea, eb
                assert emax_bf16(a, b) == ea + eb, (ea, eb, pos)


@pytest.mark.parametrize("E", [-12, -11, 0, 7, 15, 16])
def test_emax_bf16_bound_cases(E):
    """The largest lane sums: 16 terms at E_max per lane, and E_max beside 15 terms at E_max - 1."""
    ea = [E // 2] * 32
    eb = [E - E // 2] * 32
    assert emax_bf16(ea, eb) == E
    if E > -12:
        ea2 = [ea[0]] + [ea[0] - 1 if ea[0] > -6 else ea[0]] * 31
        eb2 = [eb[0]] + [eb[0] if ea[0] > -6 else eb[0] - 1] * 31
        assert emax_bf16(ea2, eb2) == E


def test_emax_bf16_random_steps():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        n = int(rng.choice([16, 32]))
        ea = rng.integers(-6, 9, n)
        eb = rng.integers(-6, 9, n)
        zero = rng.random(n) < rng.choice([0.0, 0.3, 0.9])
        ea = np.where(zero, SENT, ea)
        ea = ea.tolist()
        eb = eb.tolist()
        want = max((x + y for x, y in zip(ea, eb) if x != SENT), default=SENT)
        assert emax_bf16(ea, eb) == want, (ea, eb)


# ---------------------------------------------------------------- cpt_sum_fast


def _f32_bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def sum_fast(c, a_codes, b_codes, model):
    """The kernel's pass 2 for one output of one step (finite codes), as FP32 bits."""
    F, R = model.F, model.result_fraction_bits
    fa = fb = E4M3.frac_bits
    sign, m, e, nan, inf = E4M3.tables()
    ma, mb = m[a_codes].astype(np.int64), m[b_codes].astype(np.int64)
    ea = np.where(ma == 0, SENT, e[a_codes])
    eb = np.where(mb == 0, SENT, e[b_codes])
    # e_max: products and c (cpt_c_exp: max(exponent field, 1) - 127)
    cb = int(_f32_bits(c))
    ce = max((cb >> 23) & 0xFF, 1) - 127
    E = ea + eb
    e_max = max(int(E.max()), ce)
    Cb = max(e_max + 150 - F, 24) << 23
    g = e_max - F
    klen = len(a_codes)
    # T = RZ(|a| |b| + C): C + floor(|a b| / 2**g) * 2**g, whose encoding is Cb + t
    P = ma * mb
    shift = (E - fa - fb) - g  # |a b| = P * 2**(E - fa - fb)
    t = np.where(P == 0, 0, np.where(shift >= 0, P << np.clip(shift, 0, 62), P >> np.clip(-shift, 0, 62)))
    T = (Cb + t).astype(np.uint64) & 0xFFFFFFFF
    # sign masks: 0 or 0xFFFFFFFF per code (prmt sign replicate)
    sa = np.where(a_codes & 0x80, 0xFFFFFFFF, 0).astype(np.uint64)
    sbm = np.where(b_codes & 0x80, 0xFFFFFFFF, 0).astype(np.uint64)
    y = T ^ sa ^ sbm
    Y = (int(y.sum()) - Cb * klen) & 0xFFFFFFFF
    nneg = int(np.count_nonzero((a_codes ^ b_codes) & 0x80))
    S = (Y + nneg * (2 * Cb + 1)) & 0xFFFFFFFF
    S = S - (1 << 32) if S >= 1 << 31 else S
    # c truncated: RZ(c + Cs) - Cs, Cs = +-C of c's sign (exact: integer count of 2**g)
    cval = float(np.float32(c))
    ct = np.trunc(cval / 2.0 ** g) * 2.0 ** g
    # S * 2**g + ct: one exact RN FMA (the exact value has < 24 significant bits)
    val = np.float32(S * 2.0 ** g + ct)
    assert float(val) == S * 2.0 ** g + ct  # exactness, as the kernel's comment claims
    bits = int(_f32_bits(val)) & ((0xFFFFFFFF << (23 - R)) & 0xFFFFFFFF)
    assert bits != 0x80000000  # never -0
    return bits


@pytest.mark.parametrize("model", [HOPPER_SM90A, ADA_SM89], ids=lambda m: m.name)
@pytest.mark.parametrize("data", ["gauss40", "spread", "uniform", "loguniform", "cancel", "sparse"])
def test_sum_fast_matches_reference(model, data):
    a, bt, *_ = operands(Case(8, 8, 4 * model.L, data=data, seed=3))
    A, B = ref.decode(a, E4M3), ref.decode(bt, E4M3)
    finite = ~(A.nan.any() or B.nan.any())
    if not finite:
        pytest.skip("NaN codes go to cpt_specials")
    c = np.zeros((8, 8), dtype=np.float32)
    for k in range(0, a.shape[1], model.L):
        ks = slice(k, k + model.L)
        want = ref.tfdpa(c, A.rows((slice(None), ks)), B.rows((slice(None), ks)), model)
        for i in range(8):
            for j in range(8):
                got = sum_fast(c[i, j], a[i, ks], bt[j, ks], model)
                assert got == int(_f32_bits(want[i, j])), (data, k, i, j, hex(got), hex(int(_f32_bits(want[i, j]))))
        c = want


def test_sum_fast_signed_zeros_and_large_accumulator():
    """-0 codes (sign mask set, zero product), all-zero steps, and c far above the products."""
    codes = np.array([0x80, 0x00, 0x80, 0x38] * 8, dtype=np.uint8)  # -0, +0, -0, 1.0
    other = np.array([0x38, 0xB8, 0x80, 0xB8] * 8, dtype=np.uint8)  # 1, -1, -0, -1
    for c in (0.0, -0.0, 3.0e4, -7.5e5, 1.0e-30):
        A = ref.decode(codes[None, :], E4M3)
        B = ref.decode(other[None, :], E4M3)
        want = ref.tfdpa(np.array([[c]], np.float32), A, B, HOPPER_SM90A)
        assert sum_fast(np.float32(c), codes, other, HOPPER_SM90A) == int(_f32_bits(want[0, 0])), c
