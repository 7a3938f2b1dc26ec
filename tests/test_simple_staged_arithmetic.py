"""The arithmetic of cuda-simple's staged kernel (cuda_src/gemm_simple.cu, cps_tfdpa_staged), on the CPU.

The kernel computes a T-FDPA step in FP32 arithmetic, not the reference's integers: operands
staged as ``value * 2**-58`` with an exponent byte ``e + 112`` (0 for a zero code); ``e_max``
from byte sums packed four to a word and maximised as u16 lanes, floored at -64; every product
``RZ((a' b') * s)`` with ``s = 2**(F - 33 - e_max)`` -- a round-toward-zero multiply whose
result lies in FP32's subnormal range, so that it truncates the product to the step's grid for
either sign --; ``c`` as ``RZ(RN(c * 2**-e_max) * 2**(F - 149))``; the terms summed with
round-to-nearest adds in four interleaved partial sums; the result ``RN(RN(sum * 2**100) *
2**(49 + e_max - F))`` with the low ``23 - R`` bits cleared.

Here each FP32 operation is carried out as IEEE specifies it -- the exact result (float64 holds
every one here) rounded once to FP32, to nearest (numpy float32) or toward zero (``_f32_rz``) --
and each integer operation on the same words, in the kernel's order, and compared bit for bit
with ``cpemu.reference.tfdpa`` over every pair of codes of each format, boundary accumulators
(zero, the smallest and largest a chain can reach), and random steps and chains of several
data kinds. The claims of the kernel's comment are asserted as it goes: the byte sums never
carry, the lanes' maximum is the largest byte sum, every power of two used is a normal number,
every product and partial sum is exact, the sum is never -0, the accumulator a chain reaches is
0 or in [2**-44, 2**63). On a GPU the kernel itself is compared with the reference and the H200
recordings (tests/test_cuda_backends.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from cpemu import reference as ref
from cpemu.cases import Case, operands
from cpemu.formats import FP8_FORMATS
from cpemu.instruction import ADA_SM89, HOPPER_SM90A

SHIFT = 58  # CPS_SHIFT
EBIAS = 112  # CPS_EBIAS
EMAX_FLOOR = -64  # CPS_EMAX_FLOOR


def _pow2(t: np.ndarray) -> np.ndarray:
    """cps_pow2: 2**t as FP32 from its encoding, -149 <= t <= 127."""
    t = np.asarray(t, dtype=np.int64)
    assert ((t >= -149) & (t <= 127)).all(), t
    bits = np.where(t >= -126, (t + 127) << 23, np.left_shift(1, np.clip(t + 149, 0, 31)))
    return bits.astype(np.uint32).view(np.float32)


def _pow2_normal(t: np.ndarray) -> np.ndarray:
    """cps_pow2_normal: 2**t from the exponent field alone, which needs -126 <= t <= 127."""
    t = np.asarray(t, dtype=np.int64)
    assert ((t >= -126) & (t <= 127)).all(), (t.min(), t.max())
    return ((t + 127) << 23).astype(np.uint32).view(np.float32)


def _f32_rz(x: np.ndarray) -> np.ndarray:
    """An exact real (float64) rounded toward zero to FP32, subnormals kept."""
    x = np.asarray(x, dtype=np.float64)
    ax = np.abs(x)
    e = np.floor(np.log2(np.where(ax > 0, ax, 1.0)))
    ulp = np.exp2(np.maximum(e, -126) - 23)  # FP32's spacing at |x| (2**-149 below 2**-126)
    return (np.trunc(x / ulp) * ulp).astype(np.float32)


def _bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _reachable(c: np.ndarray) -> bool:
    """The accumulators a chain can hand a step: 0, or 2**-44 <= |c| < 2**63."""
    a = np.abs(np.asarray(c, np.float64))
    return bool(((a == 0) | ((a >= 2.0 ** -44) & (a < 2.0 ** 63))).all())


def _byte_e_max(ba: np.ndarray, bb: np.ndarray) -> np.ndarray:
    """The largest byte sum ba + bb over k, as the kernel finds it: (M, kl) and (N, kl) bytes,
    four k to a little-endian word, words added as u32, the maxima taken over u16 lanes of the
    sums (odd bytes on top) and of the sums masked to their even bytes."""
    wa = ba.astype(np.uint32).reshape(ba.shape[0], -1, 4) << np.array([0, 8, 16, 24], np.uint32)
    wb = bb.astype(np.uint32).reshape(bb.shape[0], -1, 4) << np.array([0, 8, 16, 24], np.uint32)
    wa, wb = wa.sum(axis=2, dtype=np.uint32), wb.sum(axis=2, dtype=np.uint32)
    s = wa[:, None, :].astype(np.uint64) + wb[None, :, :]
    assert (s < 1 << 32).all()
    s = s.astype(np.uint32)

    def lanes_max(x):  # max over words of each u16 lane
        return np.stack([(x & 0xFFFF).max(axis=-1), (x >> 16).max(axis=-1)], axis=-1)

    mo = lanes_max(s)
    me = lanes_max(s & 0x00FF00FF)
    mb = np.maximum(mo >> 8, me).max(axis=-1).astype(np.int64)
    byte_sums = ba[:, None, :].astype(np.int64) + bb[None, :, :]
    assert (byte_sums <= 255).all()  # no byte carries into the next
    assert (mb == byte_sums.max(axis=2)).all()
    return mb


def staged_tfdpa(c: np.ndarray, a_codes: np.ndarray, b_codes: np.ndarray, fa: str, fb: str, model,
                 kl: int) -> np.ndarray:
    """cps_tfdpa_staged for a block of outputs, as reference.tfdpa takes it: c (M, N) float32
    (an accumulator a chain can reach), a_codes (M, k) and b_codes (N, k) finite codes, k <= kl
    (the stage's zero codes fill the rest). Returns (M, N) float32."""
    F, R = model.F, model.result_fraction_bits
    assert _reachable(c)
    k = a_codes.shape[1]
    staged = []
    for codes, name in ((a_codes, fa), (b_codes, fb)):
        codes = np.pad(codes, ((0, 0), (0, kl - k)))  # zero codes
        fmt = FP8_FORMATS[name]
        sign, m, e, nan, inf = fmt.tables()
        assert not (nan[codes].any() or inf[codes].any())  # NaN/Inf go to cps_specials
        # cps_build_lut: RN(sign * m * 2**(e - fb - 58)) -- exact, m < 16 and a normal power of two
        v = (sign[codes] * m[codes]).astype(np.float32) * _pow2(e[codes] - fmt.frac_bits - SHIFT)
        assert (v.astype(np.float64) == sign[codes] * m[codes] * np.exp2(e[codes] - fmt.frac_bits - SHIFT)).all()
        byte = np.where(m[codes] == 0, 0, e[codes] + EBIAS)
        assert ((byte == 0) | ((byte >= 98) & (byte <= 127))).all()
        staged.append((v, byte.astype(np.uint8)))
    (va, ba), (vb, bb) = staged
    ce = ((_bits(c).astype(np.int64) >> 23) & 0xFF) - 127
    e_max = np.maximum(np.maximum(_byte_e_max(ba, bb) - 2 * EBIAS, ce), EMAX_FLOOR)
    s = _pow2_normal(F - 33 - e_max).astype(np.float64)
    cs = c.astype(np.float32) * _pow2_normal(-e_max)
    assert (cs.astype(np.float64) == c.astype(np.float64) * np.exp2(-e_max.astype(np.float64))).all()
    c_term = _f32_rz(cs.astype(np.float64) * _pow2(F - 149).astype(np.float64))
    shape = c.shape
    t = [c_term, np.zeros(shape, np.float32), np.zeros(shape, np.float32), np.zeros(shape, np.float32)]
    for kk in range(kl):
        x = va[:, None, kk] * vb[None, :, kk]  # RN multiply of the staged values
        assert (x.astype(np.float64) == va[:, None, kk].astype(np.float64) * vb[None, :, kk]).all()  # exact
        y = _f32_rz(x.astype(np.float64) * s)  # the RZ multiply: lands below 2**-125
        h = kk % 4
        exact = t[h].astype(np.float64) + y
        t[h] = t[h] + y  # RN add
        assert (t[h].astype(np.float64) == exact).all() and (np.abs(exact) < 2.0 ** -125).all()
    total = (t[0] + t[1]) + (t[2] + t[3])
    assert (np.abs(total.astype(np.float64)) < 2.0 ** -125).all()
    assert (_bits(total) != 0x80000000).all()  # never -0
    u = _bits(total).astype(np.int64)
    S = np.where(u >> 31, -(u & 0x7FFFFFFF), u)  # the sum in units of 2**-149
    assert (np.abs(S) < 1 << 23).all()
    up = total * _pow2_normal(np.full(shape, 100))  # RN; exact
    val = up * _pow2_normal(49 + e_max - F)  # RN; exact
    exact = S.astype(np.float64) * np.exp2((e_max - F).astype(np.float64))
    assert (up.astype(np.float64) == total.astype(np.float64) * 2.0 ** 100).all()
    assert (val.astype(np.float64) == exact).all()
    r = _bits(val) & np.uint32((0xFFFFFFFF << (23 - R)) & 0xFFFFFFFF)
    return r.view(np.float32)


def _reference(c, a_codes, b_codes, fa, fb, model):
    return ref.tfdpa(c, ref.decode(a_codes, FP8_FORMATS[fa]), ref.decode(b_codes, FP8_FORMATS[fb]), model)


def _assert_same(got, want, what):
    g, w = _bits(got), _bits(want)
    bad = np.argwhere(g != w)
    assert not len(bad), f"{what}: {len(bad)} differ, e.g. " + "; ".join(
        f"[{i},{j}] staged=0x{int(g[i, j]):08x} reference=0x{int(w[i, j]):08x}" for i, j in bad[:4])


FORMATS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]
# the accumulators a chain can reach: 0 (and -0, which a chain never hands on), 2**-44 (the
# least nonzero), below 2**63 (the largest: 2**32 per product times K < 2**31)
BIG = (2.0 ** 24 - 1) * 2.0 ** 39
ACCUMULATORS = np.array([0.0, -0.0, 1.0, -3.0, 2.0 ** -44, -(2.0 ** -43) * 3, 6.5e4, -1.0e9, BIG, -BIG], np.float32)


def _finite_codes(fmt: str) -> np.ndarray:
    _, _, _, nan, inf = FP8_FORMATS[fmt].tables()
    return np.flatnonzero(~(nan | inf)).astype(np.uint8)


@pytest.mark.parametrize("formats", FORMATS, ids="x".join)
def test_every_code_pair_beside_a_full_step(formats):
    """Every pair of finite codes as product 0 of a step whose other 31 products are fixed, from
    several accumulators (the product, the accumulator or the other terms set e_max)."""
    fa, fb = formats
    ca, cb = _finite_codes(fa), _finite_codes(fb)
    rng = np.random.default_rng(1)
    for spread in (0, 1):
        rest_a = rng.choice(ca, 31)
        rest_b = rng.choice(cb, 31) if spread else np.zeros(31, np.uint8)  # zero rest: the pair alone
        a = np.concatenate([ca[:, None], np.tile(rest_a, (len(ca), 1))], axis=1)
        b = np.concatenate([cb[:, None], np.tile(rest_b, (len(cb), 1))], axis=1)
        for c0 in ACCUMULATORS[[0, 2, 6, 9]]:
            c = np.full((len(ca), len(cb)), c0, np.float32)
            _assert_same(staged_tfdpa(c, a, b, fa, fb, HOPPER_SM90A, 32), _reference(c, a, b, fa, fb, HOPPER_SM90A),
                         f"{formats} c={c0} spread={spread}")


@pytest.mark.parametrize("model,kl", [(HOPPER_SM90A, 32), (ADA_SM89, 16)], ids=["hopper", "ada"])
@pytest.mark.parametrize("data", ["gauss40", "spread", "uniform", "loguniform", "cancel", "sparse", "gauss-tiny"])
def test_random_steps_and_chains(model, kl, data):
    """Chains of steps (each step's result is the next one's accumulator), and a short last step."""
    for fa, fb in FORMATS:
        K = 5 * model.L - 8
        a, *_ = operands(Case(16, 16, K, data=data, seed=11, a_format=fa))
        b, *_ = operands(Case(16, 16, K, data=data, seed=12, a_format=fb))
        for x, name in ((a, fa), (b, fb)):
            _, _, _, nan, inf = FP8_FORMATS[name].tables()
            x[nan[x] | inf[x]] = 0
        c = np.zeros((16, 16), np.float32)
        for k in range(0, K, model.L):
            ks = slice(k, min(k + model.L, K))
            want = _reference(c, a[:, ks], b[:, ks], fa, fb, model)
            _assert_same(staged_tfdpa(c, a[:, ks], b[:, ks], fa, fb, model, kl), want, f"{data} {fa}x{fb} k={k}")
            assert _reachable(want)
            c = want


def test_boundary_accumulators():
    """Zero and signed-zero steps, the least and the largest accumulators, cancellation."""
    rng = np.random.default_rng(5)
    ca = _finite_codes("e4m3")
    c = np.tile(ACCUMULATORS, (8, 1))
    for trial in range(40):
        a = rng.choice(ca, (8, 32))
        b = rng.choice(ca, (len(ACCUMULATORS), 32))
        if trial % 4 == 0:
            a = np.where(rng.random(a.shape) < 0.8, np.uint8(0x80 * (trial % 8 == 0)), a)  # mostly (-)0 codes
        if trial % 4 == 2:  # every product zero: c alone; with negative codes of b every product is -0
            a = np.full(a.shape, np.uint8(0x80 * (trial % 8 == 6)))  # a zero code's staged value is +0
            b = b | np.uint8(0x80) if trial % 8 == 2 else b
        if trial % 4 == 1:  # pairs of products that cancel exactly
            a = np.concatenate([a[:, :16], a[:, :16]], axis=1)
            b = np.concatenate([b[:, :16], b[:, :16] ^ np.uint8(0x80)], axis=1)
        _assert_same(staged_tfdpa(c, a, b, "e4m3", "e4m3", HOPPER_SM90A, 32),
                     _reference(c, a, b, "e4m3", "e4m3", HOPPER_SM90A), f"trial {trial}")


def test_round_toward_zero_helper():
    """_f32_rz against numpy's own rounding: the nearest FP32 (round to nearest), stepped one
    FP32 toward zero when that lies farther from zero than the exact value; normal and
    subnormal ranges, both signs."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-1, 1, 20000) * np.exp2(rng.integers(-160, 120, 20000)),
                        rng.uniform(-(2.0 ** -125), 2.0 ** -125, 20000)])
    rn = x.astype(np.float32)
    want = np.where(np.abs(rn.astype(np.float64)) > np.abs(x), np.nextafter(rn, np.float32(0)), rn)
    assert (_bits(_f32_rz(x)) == _bits(want.astype(np.float32))).all()
