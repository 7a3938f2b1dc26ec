"""cuda-rzacc's step arithmetic (cpemu.rzacc_twin) against the reference, bit for bit, with its
claims asserted on every product: exhaustively over code pairs and grids, on random and
adversarial steps, and over whole GEMMs through the reference's schedule."""

import itertools
import zlib

import numpy as np
import pytest

import cpemu.reference as ref
from cpemu import rzacc_twin as tw
from cpemu.formats import FP8_FORMATS
from cpemu.instruction import ADA_SM89, BLACKWELL_SM120, HOPPER_SM90A, InstructionModel
from cpemu.schedule import Plan, slices_for

PAIRS = list(itertools.product(("e4m3", "e5m2"), repeat=2))
MODELS = {"ada": ADA_SM89, "hopper": HOPPER_SM90A}


def _seed(*key) -> int:
    """A seed fixed by the test's parameters (str hashes change from run to run: a failure must repeat)."""
    return zlib.crc32(repr(key).encode())



def _bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _assert_same(got, want, what):
    g, w = _bits(got), _bits(want)
    bad = np.argwhere(g != w)
    assert bad.size == 0, f"{what}: {len(bad)} differ, first at {tuple(bad[0])}: " \
                          f"got 0x{int(g[tuple(bad[0])]):08x}, want 0x{int(w[tuple(bad[0])]):08x}"


@pytest.mark.parametrize("fa,fb", PAIRS)
def test_count_flag_exhaustive(fa, fb):
    """Every pair of codes, at every grid a step can have: the byte sum's bit 7 and the sign
    XOR flag exactly the negative products with bits below the grid (the twin's claim)."""
    A, B = FP8_FORMATS[fa], FP8_FORMATS[fb]
    va, na, sa, _, _ = tw.code_tables(A)
    vb, nb, sb, _, _ = tw.code_tables(B)
    p = va[:, None] * vb[None, :]
    for g in range(-60, 60):
        T = tw.count_threshold(np.int64(g), A, B)
        x = na[:, None] + nb[None, :] + T
        assert x.min() >= 0 and x.max() <= 255, (g, int(x.min()), int(x.max()))
        flag = ((x >> 7) & 1 & (sa[:, None] ^ sb[None, :])).astype(bool)
        q = p / np.exp2(float(g))
        want = (p < 0) & (q != np.floor(q))
        bad = np.argwhere(flag != want)
        assert bad.size == 0, f"g={g}: codes 0x{bad[0][0]:02x} x 0x{bad[0][1]:02x} flag {flag[tuple(bad[0])]}"


def _codes(rng, shape, kind):
    if kind == "gauss":
        import ml_dtypes

        return (rng.standard_normal(shape) * 8).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    if kind == "spread":  # every finite code, uniformly
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if kind == "tiny":  # subnormals and the smallest normals, both signs
        return (rng.integers(0, 12, shape) | (rng.integers(0, 2, shape) << 7)).astype(np.uint8)
    raise ValueError(kind)


def _finite(codes, fmt):
    _, _, _, nan, inf = FP8_FORMATS[fmt].tables()
    bad = nan[codes] | inf[codes]
    return np.where(bad, np.uint8(0x38), codes).astype(np.uint8)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("fa,fb", PAIRS)
@pytest.mark.parametrize("kind", ["gauss", "spread", "tiny"])
def test_step_equals_reference(model, fa, fb, kind):
    """Random steps (every format pair, data kind and accumulator scale, short steps too)."""
    m = MODELS[model]
    rng = np.random.default_rng(_seed(model, fa, fb, kind))
    for trial in range(6):
        L = m.L if trial % 3 else 8 * int(rng.integers(1, m.L // 8 + 1))
        a = _finite(_codes(rng, (12, L), kind), fa)
        b = _finite(_codes(rng, (10, L), kind), fb)
        c = (rng.standard_normal((12, 10)) * np.exp2(rng.integers(-30, 40, (12, 10)))).astype(np.float32)
        c[rng.random((12, 10)) < 0.2] = 0.0
        want = ref.tfdpa(c, ref.decode(a, FP8_FORMATS[fa]), ref.decode(b, FP8_FORMATS[fb]), m)
        got = tw.step(c, a, b, FP8_FORMATS[fa], FP8_FORMATS[fb], m)
        _assert_same(got, want, f"{model} {fa}x{fb} {kind} trial {trial}")


@pytest.mark.parametrize("fa,fb", PAIRS)
def test_step_specials(fa, fb):
    """NaN and Inf codes and non-finite accumulators take the reference's rule."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, (16, 32), dtype=np.uint8)
    b = rng.integers(0, 256, (16, 32), dtype=np.uint8)
    c = rng.standard_normal((16, 16)).astype(np.float32)
    c[0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    want = ref.tfdpa(c, ref.decode(a, FP8_FORMATS[fa]), ref.decode(b, FP8_FORMATS[fb]), HOPPER_SM90A)
    got = tw.step(c, a, b, FP8_FORMATS[fa], FP8_FORMATS[fb], HOPPER_SM90A)
    _assert_same(got, want, f"specials {fa}x{fb}")


def test_step_extremes():
    """The largest products with a large opposite accumulator, and the smallest with c = 0."""
    E4, E5 = FP8_FORMATS["e4m3"], FP8_FORMATS["e5m2"]
    big4 = np.full((2, 32), 0x7E, np.uint8)
    big4[1] |= 0x80
    c = np.array([[-1e6, 3e9], [np.float32(2.0 ** -30), 0.0]], np.float32)
    for fmt, big in ((E4, big4), (E5, np.where(big4 & 0x80, 0xFB, 0x7B).astype(np.uint8))):
        want = ref.tfdpa(c, ref.decode(big, fmt), ref.decode(big, fmt), HOPPER_SM90A)
        _assert_same(tw.step(c, big, big, fmt, fmt, HOPPER_SM90A), want, f"big {fmt.name}")
        tiny = np.tile(np.array([1, 0x81], np.uint8), (2, 16))
        want = ref.tfdpa(c * 0, ref.decode(tiny[:, :16], fmt), ref.decode(tiny[:, :16], fmt), ADA_SM89)
        _assert_same(tw.step(c * 0, tiny[:, :16], tiny[:, :16], fmt, fmt, ADA_SM89), want, f"tiny {fmt.name}")


def test_twin_claims_can_fail():
    """The asserted claims are real: beyond F = 14 the twin refuses, and a wrong count
    threshold is caught by the flag check."""
    F16 = InstructionModel("f16", "-", 32, 16, "RZ-E8M13", -133, "test")
    a = np.full((1, 32), 0x38, np.uint8)
    with pytest.raises(AssertionError, match="F <= 14"):
        tw.step(np.zeros((1, 1), np.float32), a, a, FP8_FORMATS["e4m3"], FP8_FORMATS["e4m3"], F16)
    with pytest.raises(AssertionError):
        tw.step(np.zeros((1, 1), np.float32), a, a, FP8_FORMATS["e4m3"], FP8_FORMATS["e4m3"], BLACKWELL_SM120)
    orig = tw.count_threshold
    try:
        tw.count_threshold = lambda g, fa, fb: orig(g, fa, fb) + 1  # off by one
        a = np.array([[0xB9] * 32], np.uint8)  # -1.125: lambda = -3
        b = np.array([[0x31] * 32], np.uint8)  # 0.5625 (9 * 2**-4): lambda = -4
        c = np.array([[np.float32(2.0 ** 6)]], np.float32)  # e_max = 6: grid 2**-7, no bits lost
        with pytest.raises(AssertionError, match="flags the negative"):
            tw.step(c, a, b, FP8_FORMATS["e4m3"], FP8_FORMATS["e4m3"], HOPPER_SM90A)
    finally:
        tw.count_threshold = orig


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("fast", [True, False])
def test_gemm_through_twin(monkeypatch, model, fast):
    """Whole GEMMs with split-K and promotion: the reference's schedule with the twin's step
    in place of tfdpa gives the reference's bits."""
    m = MODELS[model]
    rng = np.random.default_rng(3)
    M, N, K = 9, 7, 512
    a = _finite(_codes(rng, (M, K), "gauss"), "e4m3")
    b = _finite(_codes(rng, (N, K), "spread"), "e5m2")
    plan = Plan(slices_for(K, 2, 128), None if fast else 4)
    fa, fb = FP8_FORMATS["e4m3"], FP8_FORMATS["e5m2"]
    ep = {"order": "acc*(sa*sb)"}
    args = (a, b, fa, fb, plan, m, ep, np.float32(0.5), np.float32(3.0), None, "float32")
    want = ref.gemm_codes(*args, threads=1)

    calls = []

    def twin_tfdpa(c, ao, bo, model_):
        calls.append(1)
        return tw.step(c, ao.codes, bo.codes, fa, fb, model_)

    monkeypatch.setattr(ref, "Operand", _WithCodes)  # what reference.Codes decodes a K range into
    got = ref.gemm_codes(*args, threads=1, arith=ref.Arithmetic(twin_tfdpa, ref.BLOCK_ELEMS, 48))
    assert len(calls) >= K // m.L, "the twin computed the steps"
    _assert_same(got, want, f"gemm {model} fast={fast}")


_BASE = ref.Operand


class _WithCodes(_BASE):
    """A decoded operand that keeps its codes (the twin reads codes)."""

    __slots__ = ("codes",)

    def __init__(self, codes, fmt):
        super().__init__(codes, fmt)
        self.codes = np.asarray(codes, np.uint8)

    def rows(self, sl):
        out = _WithCodes.__new__(_WithCodes)
        for name in _BASE.__slots__:
            setattr(out, name, getattr(self, name)[sl] if name not in ("frac_bits", "has_special") else
                    getattr(self, name))
        out.codes = self.codes[sl]
        return out


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("kind", ["gauss", "spread", "tiny"])
def test_step_split_over_parts(model, parts, kind):
    """A step's products split over 2 or 4 accumulators (threads sharing one output, for small
    M) give the reference's bits, every claim asserted per part."""
    m = MODELS[model]
    rng = np.random.default_rng(_seed(model, parts, kind))
    for fa, fb in PAIRS:
        for trial in range(3):
            L = m.L if trial else 8 * int(rng.integers(1, m.L // 8 + 1))
            a = _finite(_codes(rng, (8, L), kind), fa)
            b = _finite(_codes(rng, (6, L), kind), fb)
            c = (rng.standard_normal((8, 6)) * np.exp2(rng.integers(-30, 40, (8, 6)))).astype(np.float32)
            want = ref.tfdpa(c, ref.decode(a, FP8_FORMATS[fa]), ref.decode(b, FP8_FORMATS[fb]), m)
            got = tw.step(c, a, b, FP8_FORMATS[fa], FP8_FORMATS[fb], m, parts=parts)
            _assert_same(got, want, f"{model} {fa}x{fb} {kind} parts {parts} trial {trial}")


def test_pass1_mma_reading_is_exact_under_any_alignment():
    """CPT_PASS1_MMA's claim (cuda_src/cpemu_tiled_pass1.cuh, cpt_emax_mma): for up to 32 terms
    2**(8 (e_a - 1)) * 2**(8 (e_b - 1)) of e4m3 exponents, the FP32 sum read as
    ((biased exponent + 1) >> 3) - 14 is the largest e_a + e_b, whether the tensor core sums
    exactly, truncates every term to 24 bits below the largest one, or rounds to nearest term by
    term: all keep the largest term and stay below 2**5.1 times it."""
    rng = np.random.default_rng(7)
    e_vals = np.arange(-6, 9)  # e4m3 exponents (subnormals read as -6)

    def reading(x):
        u = int(np.float32(x).view(np.uint32))
        return ((u >> 23) + 1 >> 3) - 14 if u else None

    seen = 0
    for n in (1, 2, 16, 31, 32):
        for _ in range(300):
            ea, eb = rng.choice(e_vals, n), rng.choice(e_vals, n)
            if rng.random() < 0.3:  # many terms one binade below the largest, the worst case for the bound
                ea[:] = ea[0]
                eb[1:] = eb[0] - 1
            terms = [2.0 ** (8 * (int(a) + int(b) - 2)) for a, b in zip(ea, eb)]
            top = max(terms)
            ulp = top * 2.0 ** -23
            exact = sum(terms)
            truncated = sum(np.floor(t / ulp) * ulp for t in terms)
            rn = np.float32(0)
            for t in terms:
                rn = np.float32(rn + np.float32(t))
            want = int((ea + eb).max())
            for x in (exact, truncated, float(rn)):
                assert top <= x < top * 2.0 ** 5.1 and reading(x) == want, (n, list(ea), list(eb), x)
            seen += 1
    assert seen == 1500 and reading(0.0) is None


def _e4m3_steps(rng, n, L):
    """n steps of e4m3 codes (8 x L and 6 x L) with zeros, subnormals, all-zero rows and columns, NaN-free."""
    for t in range(n):
        kind = ("gauss", "spread", "tiny")[t % 3]
        a = _finite(_codes(rng, (8, L), kind), "e4m3")
        b = _finite(_codes(rng, (6, L), kind), "e4m3")
        a[rng.random((8, L)) < 0.2] = 0
        if t % 4 == 0:
            a[t % 8] = 0  # a row whose products are all zero
        sub = rng.random((6, L)) < 0.1
        b[sub] = rng.integers(1, 8, sub.sum()) | (rng.integers(0, 2, sub.sum()) << 7)  # subnormals of both signs
        c = (rng.standard_normal((8, 6)) * np.exp2(rng.integers(-30, 30, (8, 6)))).astype(np.float32)
        c[rng.random((8, 6)) < 0.3] = 0.0
        yield a, b, c


@pytest.mark.parametrize("L", [16, 32])
def test_lean_reading_is_e_max(L):
    """CPT_LEAN's reading (cpt_emax_bf16_bits): from the bf16 pass-1 sums with A's terms doubled, the FP32 bits
    of the larger of |c| and 2**E_max have the exponent field e_max + 127, e_max as the reference finds it
    (the largest exponent sum of the nonzero products, and c's exponent where c is nonzero), and are 0 where c
    and every product are zero. The shipped reading of the undoubled sums gives the same e_max."""
    rng = np.random.default_rng(11)
    seen_zero = 0
    for a, b, c in _e4m3_steps(rng, 60, L):
        A, B = ref.Operand(a, FP8_FORMATS["e4m3"]), ref.Operand(b, FP8_FORMATS["e4m3"])
        nz = (A.m[:, None, :] != 0) & (B.m[None, :, :] != 0)
        E = np.where(nz, A.e_nz[:, None, :].astype(np.int64) + B.e_nz[None, :, :], -10_000).max(axis=-1)
        ce = np.where(c != 0, (c.view(np.uint32).astype(np.int64) >> 23 & 0xFF) - 127, -10_000)
        want = np.maximum(E, ce)
        got = tw.emax_bits(tw.pass1_sums(a, b, lean=True), c).astype(np.int64)
        zero = want == -10_000
        assert (got[zero] == 0).all() and ((got[~zero] >> 23) - 127 == want[~zero]).all()
        shipped = tw.emax_read(tw.pass1_sums(a, b, lean=False), c)
        assert (shipped[~zero] == want[~zero]).all()
        seen_zero += zero.sum()
    assert seen_zero > 0


def test_lean_reading_needs_the_doubled_terms():
    """The lean reading of the shipped (undoubled) sums misses e_max: the doubling is what makes the
    exponent field / 8 exact (a test of the test)."""
    rng = np.random.default_rng(12)
    wrong = 0
    for a, b, c in _e4m3_steps(rng, 30, 32):
        c = np.zeros_like(c)
        A, B = ref.Operand(a, FP8_FORMATS["e4m3"]), ref.Operand(b, FP8_FORMATS["e4m3"])
        nz = (A.m[:, None, :] != 0) & (B.m[None, :, :] != 0)
        E = np.where(nz, A.e_nz[:, None, :].astype(np.int64) + B.e_nz[None, :, :], -10_000).max(axis=-1)
        got = tw.emax_bits(tw.pass1_sums(a, b, lean=False), c).astype(np.int64)
        wrong += ((got >> 23) - 127 != E)[E > -10_000].sum()
    assert wrong > 0


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("fa,fb", PAIRS)
@pytest.mark.parametrize("kind", ["gauss", "spread", "tiny"])
def test_chain_rounded_at_its_end_only(model, fa, fb, kind):
    """CPT_LEAN's deferred rounding: a chain of steps whose results stay unrounded until its end, then
    rounded once, equals the reference's chain (each step rounded) bit for bit, and the unrounded chain
    really differs from the rounded one in between (the test can fail)."""
    m = MODELS[model]
    rng = np.random.default_rng(_seed("chain", model, fa, fb, kind))
    differ = 0
    for trial in range(3):
        c_ref = np.zeros((8, 6), np.float32)
        c_tw = c_ref.copy()
        for s in range(12):
            a = _finite(_codes(rng, (8, m.L), kind), fa)
            b = _finite(_codes(rng, (6, m.L), kind), fb)
            c_ref = ref.tfdpa(c_ref, ref.decode(a, FP8_FORMATS[fa]), ref.decode(b, FP8_FORMATS[fb]), m)
            c_tw = tw.step(c_tw, a, b, FP8_FORMATS[fa], FP8_FORMATS[fb], m, rounded=False)
            differ += int((_bits(c_tw) != _bits(c_ref)).sum())
        _assert_same(tw.round_result(c_tw, m), c_ref, f"{model} {fa}x{fb} {kind} chain {trial}")
    assert differ > 0 or kind == "tiny"
