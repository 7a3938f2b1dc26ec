"""Bit-for-bit cross-check of :mod:`cpemu.reference` against MMA-Sim.

MMA-Sim (PyPI ``mmasim`` 2.1.1, Xu et al., arXiv:2511.10909) is an independent
implementation of the same T-FDPA model, written in floating point on torch
tensors where cpemu works in integers. Every expected value here comes from
mmasim's *architecture-named* simulators, so that the step parameters are
mmasim's own, not ours:

* ``ADA_SM89``:        ``mmasim.nv_ptx.MMA("Ada Lovelace", "m16n8k32.f32.<a>.<b>.f32")``
* ``HOPPER_SM90A``:    ``mmasim.nv_ptx.WGMMA("Hopper", "m64n8k32.f32.<a>.<b>")``
* ``BLACKWELL_SM120``: ``mmasim.nv_ptx.MMA("RTX Blackwell", "m16n8k32.kind::f8f6f4.f32.<a>.<b>.f32")``

(``test_simulator_parameters`` checks that these carry the L, F, rounding and
e_zero our instruction models claim.) Outputs are compared as raw FP32 bit
patterns; a mismatch lists the FP8 codes, the accumulator and both results in hex.

Cases, for each of the three models and the four operand mixes:

1. the 256 x 256 table of single products (NaN, Inf, zeros, subnormals included)
   as one-product steps, with ``c`` = 0 and a set of nonzero ``c``;
2. generated full L-product steps around the boundaries of the model (both signs
   throughout): products aligned at every distance around the truncation point
   below ``e_max``, ``c`` above, at and below ``e_max`` and around its own
   truncation, sums that carry into a new binade or sit next to an RZ boundary of
   the result format, exact cancellation (including the sign-magnitude truncation
   of opposite products), all-zero steps with tiny and subnormal ``c`` (with FP8
   products of at least 2**-32, a subnormal result can only come from ``c``
   alone), NaN/Inf placement, and random steps (uniform codes; log-uniform
   magnitudes in windows of random width);
3. multi-step chains (``cpemu.reference.chain``) against the simulator's
   ``__call__`` over K = 4L (and a K with a short last step).

All generation is seeded and vectorised.
"""

from __future__ import annotations

import importlib.metadata
import zlib

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is needed by mmasim, the independent T-FDPA model (pip install torch)")
pytest.importorskip(
    "mmasim", reason="mmasim 2.1.1 (MMA-Sim) is the independent model cross-checked here (pip install mmasim==2.1.1)")
if importlib.metadata.version("mmasim") != "2.1.1":
    pytest.skip("the cross-check is pinned to mmasim 2.1.1", allow_module_level=True)

from mmasim.arithmetic.fdpa import MMA_T_FDPA  # noqa: E402
from mmasim.nv_ptx import MMA, WGMMA  # noqa: E402

from cpemu.formats import E4M3, E5M2  # noqa: E402
from cpemu.instruction import ADA_SM89, BLACKWELL_SM120, HOPPER_SM90A  # noqa: E402
from cpemu.reference import chain, decode, tfdpa  # noqa: E402

MODELS = {"ada": ADA_SM89, "hopper": HOPPER_SM90A, "blackwell": BLACKWELL_SM120}
MIXES = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]
CPEMU_FMT = {"e4m3": E4M3, "e5m2": E5M2}
TORCH_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

CASES = [pytest.param(m, ta, tb, id=f"{m}-{ta}x{tb}") for m in MODELS for ta, tb in MIXES]


def simulator(model_key: str, ta: str, tb: str):
    """mmasim's architecture-named simulator of the instruction a model describes."""
    if model_key == "ada":
        return MMA("Ada Lovelace", f"m16n8k32.f32.{ta}.{tb}.f32")
    if model_key == "hopper":
        return WGMMA("Hopper", f"m64n8k32.f32.{ta}.{tb}")
    return MMA("RTX Blackwell", f"m16n8k32.kind::f8f6f4.f32.{ta}.{tb}.f32")


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# --------------------------------------------------------------------------- running both sides

def _sim_bits(sim, a: np.ndarray, b: np.ndarray, c_bits: np.ndarray, ta: str, tb: str) -> np.ndarray:
    """mmasim ``dpa``: a, b uint8 codes (..., K); c_bits uint32 (...); FP32 bits out."""
    ta_t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8)).view(TORCH_DTYPE[ta])
    tb_t = torch.from_numpy(np.ascontiguousarray(b, dtype=np.uint8)).view(TORCH_DTYPE[tb])
    c_t = torch.from_numpy(np.ascontiguousarray(c_bits, dtype=np.uint32).view(np.int32).copy()).view(torch.float32)
    out = sim.dpa(ta_t, tb_t, c_t)
    assert out.dtype == torch.float32
    return out.view(torch.int32).numpy().view(np.uint32).copy()


def _ours_matrix(a, b, c_bits, ta, tb, model) -> np.ndarray:
    """cpemu step for all (row of a, row of b) pairs; FP32 bits (Mb, Nb)."""
    c = np.ascontiguousarray(c_bits, dtype=np.uint32).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf c are cast before _specials
        out = tfdpa(c, decode(a, CPEMU_FMT[ta]), decode(b, CPEMU_FMT[tb]), model)
    assert out.dtype == np.float32 and out.shape == c.shape
    return out.view(np.uint32)


def _ours_pairwise(a, b, c_bits, ta, tb, model, block=16) -> np.ndarray:
    """cpemu step for row i of a with row i of b (diagonals of small block products)."""
    n = a.shape[0]
    out = np.empty(n, dtype=np.uint32)
    for s in range(0, n, block):
        e = min(s + block, n)
        cb = np.broadcast_to(c_bits[s:e, None], (e - s, e - s))
        out[s:e] = np.diagonal(_ours_matrix(a[s:e], b[s:e], cb, ta, tb, model))
    return out


def _codes(row) -> str:
    row = np.atleast_1d(row)
    return "0x" + f"{int(row[0]):02x}" if row.size == 1 else "[" + " ".join(f"{int(x):02x}" for x in row) + "]"


def _assert_same(what, ours, theirs, a_of, b_of, c_of, limit=8, c_name="c"):
    """Compare FP32 bit arrays; a_of/b_of/c_of map a flat output index to its inputs."""
    ours, theirs = np.ravel(ours), np.ravel(theirs)
    bad = np.flatnonzero(ours != theirs)
    if bad.size:
        lines = [f"{what}: {bad.size} of {ours.size} results differ from mmasim"]
        for i in bad[:limit]:
            lines.append(f"  a={_codes(a_of(i))} b={_codes(b_of(i))} {c_name}=0x{int(c_of(i)):08x}: "
                         f"cpemu=0x{int(ours[i]):08x} mmasim=0x{int(theirs[i]):08x}")
        pytest.fail("\n".join(lines), pytrace=False)


def _check_pairwise(what, key, ta, tb, a, b, c_bits):
    model = MODELS[key]
    ours = _ours_pairwise(a, b, c_bits, ta, tb, model)
    theirs = _sim_bits(simulator(key, ta, tb), a, b, c_bits, ta, tb)
    _assert_same(what, ours, theirs, lambda i: a[i], lambda i: b[i], lambda i: c_bits[i])
    return a.shape[0]


def _check_matrix(what, key, ta, tb, a, b, c_bits):
    """One step for every (row of a, row of b) pair, c_bits (Mb, Nb)."""
    model = MODELS[key]
    Mb, Nb = c_bits.shape
    ours = _ours_matrix(a, b, c_bits, ta, tb, model)
    theirs = _sim_bits(simulator(key, ta, tb), np.broadcast_to(a[:, None, :], (Mb, Nb, a.shape[1])),
                       np.broadcast_to(b[None, :, :], (Mb, Nb, b.shape[1])), c_bits, ta, tb)
    _assert_same(what, ours, theirs, lambda i: a[i // Nb], lambda i: b[i % Nb], lambda i: c_bits.flat[i])
    return Mb * Nb


# --------------------------------------------------------------------------- FP8 tables for generation
# (decoded here from ml_dtypes values, independently of cpemu.formats)

_NP_DTYPE = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
_FRAC = {"e4m3": 3, "e5m2": 2}
_EMIN = {"e4m3": -6, "e5m2": -14}


def _fp8_positive(fmt):
    """Positive finite nonzero codes with (m, e): value = m * 2**(e - frac), subnormals at emin."""
    codes = np.arange(256, dtype=np.uint8)
    v = codes.view(_NP_DTYPE[fmt]).astype(np.float64)
    keep = (codes < 0x80) & np.isfinite(v) & (v > 0)
    codes, v = codes[keep], v[keep]
    e = np.maximum(np.floor(np.log2(v)).astype(np.int64), _EMIN[fmt])
    m = np.ldexp(v, _FRAC[fmt] - e).astype(np.int64)
    assert np.array_equal(np.ldexp(m.astype(np.float64), e - _FRAC[fmt]), v)
    return codes, m, e


def _special_codes(fmt):
    codes = np.arange(256, dtype=np.uint8)
    v = codes.view(_NP_DTYPE[fmt]).astype(np.float64)
    return codes[np.isnan(v)], codes[np.isinf(v)]


def _finite_codes(fmt):
    codes = np.arange(256, dtype=np.uint8)
    return codes[np.isfinite(codes.view(_NP_DTYPE[fmt]).astype(np.float64))]


class Products:
    """All positive finite nonzero products of a mix, sorted by (exponent E, significand P)."""

    def __init__(self, ta, tb):
        ca, ma, ea = _fp8_positive(ta)
        cb, mb, eb = _fp8_positive(tb)
        A, B = np.meshgrid(np.arange(ca.size), np.arange(cb.size), indexing="ij")
        A, B = A.ravel(), B.ravel()
        E, P = ea[A] + eb[B], ma[A] * mb[B]
        order = np.lexsort((P, E))
        self.a, self.b, self.E, self.P = ca[A][order], cb[B][order], E[order], P[order]
        self.fsum = _FRAC[ta] + _FRAC[tb]
        self.exps = np.unique(self.E)
        self.value = np.ldexp(self.P.astype(np.float64), self.E - self.fsum)  # exact
        # products that are exact powers of two, by log2 of the value
        p2 = (self.P & (self.P - 1)) == 0
        self.p2_idx = np.flatnonzero(p2)
        self.p2_log = np.log2(self.value[p2]).astype(np.int64)
        self.p2_exps = np.unique(self.p2_log)

    def has(self, E):
        return np.isin(E, self.exps)

    def pick(self, E, how, rng):
        """Index of a product with exponent E (array); how: 0 min P, 1 max P, 2 random."""
        E = np.asarray(E)
        lo = np.searchsorted(self.E, E, "left")
        hi = np.searchsorted(self.E, E, "right")
        assert (hi > lo).all()
        r = lo + (rng.random(E.shape) * (hi - lo)).astype(np.int64)
        how = np.broadcast_to(how, E.shape)
        return np.where(how == 0, lo, np.where(how == 1, hi - 1, r))

    def pick_pow2(self, log2v, rng):
        """Index of a product whose value is exactly 2**log2v."""
        out = np.empty(np.shape(log2v), dtype=np.int64)
        for i, x in np.ndenumerate(np.asarray(log2v)):
            cand = self.p2_idx[self.p2_log == x]
            out[i] = cand[rng.integers(cand.size)]
        return out

    def codes(self, idx, negative, rng):
        """FP8 codes (a, b) of product idx with the given sign (spread over a and b at random)."""
        idx = np.asarray(idx)
        flip = rng.integers(0, 2, idx.shape).astype(np.uint8)
        sa = flip
        sb = flip ^ np.asarray(negative, dtype=np.uint8)
        return self.a[idx] | (sa << 7), self.b[idx] | (sb << 7)


def _zero_products(shape, ta, tb, rng):
    """Codes (a, b) of zero products: a signed zero times a finite code (either side)."""
    za = rng.choice(np.array([0x00, 0x80], np.uint8), shape)
    fb = rng.choice(_finite_codes(tb), shape)
    zb = rng.choice(np.array([0x00, 0x80], np.uint8), shape)
    fa = rng.choice(_finite_codes(ta), shape)
    left = rng.random(shape) < 0.5
    return np.where(left, za, fa).astype(np.uint8), np.where(left, fb, zb).astype(np.uint8)


def _shuffle_rows(a, b, rng):
    perm = np.argsort(rng.random(a.shape), axis=1)
    return np.take_along_axis(a, perm, 1), np.take_along_axis(b, perm, 1)


def _f32_bits(sign_neg, exp, mant):
    """FP32 bits of (-1)**sign * 2**exp * (1 + mant/2**23), exp a normal exponent."""
    exp = np.asarray(exp, dtype=np.int64)
    assert ((exp >= -126) & (exp <= 127)).all()
    return ((np.asarray(sign_neg, np.uint32) << 31) | ((exp + 127).astype(np.uint32) << 23)
            | np.asarray(mant, np.uint32)).astype(np.uint32)


def _f32_from_float(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32).view(np.uint32)


# --------------------------------------------------------------------------- 0. parameters

@pytest.mark.parametrize("key,ta,tb", CASES)
def test_simulator_parameters(key, ta, tb):
    """mmasim's arch-named simulator carries exactly the parameters of our model."""
    model = MODELS[key]
    op = simulator(key, ta, tb).arithmetic_op
    assert type(op) is MMA_T_FDPA
    got = (op.L_max, op.F, op.rho, op.e_zero)
    want = (model.L, model.F, model.rounding, model.e_zero)
    assert got == want, f"{model.name}: mmasim (L, F, rho, e_zero) = {got}, cpemu = {want}"


# --------------------------------------------------------------------------- 1. single products

TABLE_C = [
    0x00000000, 0x80000000,  # +0, -0
    _f32_from_float(1.0), _f32_from_float(-2.0 ** -20), _f32_from_float(3.5e4),
    0x00000001, 0x80012345, 0x007FFFFF,  # subnormals
    0x00800000,  # 2**-126
    0x3FAAA000, 0xC2F6E000,  # E8M13 values (low 10 bits clear)
    0x3FFFFFFF, 0xC1C7FFFF,  # all mantissa bits set: truncated by the step
    0x4E6E6B28, 0xCF000001,  # ~1e9, -2**31 (e5m2 product range)
    0x7F7FFFFF, 0xFF7FFFFF,  # +-FP32 max
    0x7F800000, 0xFF800000, 0x7FC00000,  # +-Inf, NaN
]


@pytest.mark.parametrize("key,ta,tb", CASES)
def test_single_products(key, ta, tb):
    """All 256 x 256 code pairs as one-product steps, for each c in TABLE_C."""
    model, sim = MODELS[key], simulator(key, ta, tb)
    codes = np.arange(256, dtype=np.uint8)
    a_dec, b_dec = decode(codes[:, None], CPEMU_FMT[ta]), decode(codes[:, None], CPEMU_FMT[tb])
    A = np.broadcast_to(codes[:, None, None], (256, 256, 1))
    B = np.broadcast_to(codes[None, :, None], (256, 256, 1))
    for cb in TABLE_C:
        c_bits = np.full((256, 256), cb, dtype=np.uint32)
        with np.errstate(invalid="ignore", over="ignore"):
            ours = tfdpa(c_bits.view(np.float32), a_dec, b_dec, model).view(np.uint32)
        theirs = _sim_bits(sim, A, B, c_bits, ta, tb)
        _assert_same(f"{model.name} {ta}x{tb} single products, c=0x{int(cb):08x}", ours, theirs,
                     lambda i: i // 256, lambda i: i % 256, lambda i, cb=cb: cb)


# --------------------------------------------------------------------------- 2. generated boundary cases

def _gen_alignment(key, ta, tb):
    """Product 0 sets e_max; k products sit d binades below it, d around F (the cut).

    For every d in [F-8, F+3] (where the mix has such exponents), every sign pair,
    k in {1, L-1}, and significands min/max/random of both: the lower products'
    lowest bit lies below, at or above 2**(e_max - F), or the whole product is
    dropped. A second set mixes products at random d in the same range."""
    model, pr, rng = MODELS[key], Products(ta, tb), _rng("align", key, ta, tb)
    F, L = model.F, model.L
    rows = []
    for d in range(F - 8, F + 4):
        E0s = pr.exps[pr.has(pr.exps - d)]
        if E0s.size == 0:
            continue
        for E0 in {int(E0s[-1]), int(rng.choice(E0s))}:
            for k in (1, L - 1):
                for s0 in (0, 1):
                    for s1 in (0, 1):
                        for h0, h1 in ((2, 0), (2, 1), (0, 1), (1, 2), (2, 2)):
                            rows.append((E0, d, k, s0, s1, h0, h1))
    R = np.array(rows)
    n = len(R)
    E0, d, k, s0, s1, h0, h1 = R.T
    a, b = _zero_products((n, L), ta, tb, rng)
    i0 = pr.pick(E0, h0, rng)
    a[:, 0], b[:, 0] = pr.codes(i0, s0, rng)
    col = np.arange(1, L)[None, :]
    lower = col <= k[:, None]
    i1 = pr.pick(np.repeat((E0 - d)[:, None], L - 1, 1), np.repeat(h1[:, None], L - 1, 1), rng)
    # the k lower products share a significand choice but not always the codes
    la, lb = pr.codes(i1, np.repeat(s1[:, None], L - 1, 1), rng)
    a[:, 1:] = np.where(lower, la, a[:, 1:])
    b[:, 1:] = np.where(lower, lb, b[:, 1:])
    a, b = _shuffle_rows(a, b, rng)
    c = rng.choice(np.array([0x00000000, 0x80000000], np.uint32), n)

    # mixed: every product at its own random d in [F-8, F+3] below product 0
    m = 400
    E0 = rng.choice(pr.exps, m)
    dd = rng.integers(F - 8, F + 4, (m, L - 1))
    El = E0[:, None] - dd
    ok = pr.has(El)
    El = np.where(ok, El, E0[:, None])
    a2, b2 = pr.codes(pr.pick(El, 2, rng), rng.integers(0, 2, El.shape), rng)
    za, zb = _zero_products(El.shape, ta, tb, rng)
    a2, b2 = np.where(ok, a2, za), np.where(ok, b2, zb)
    h = rng.integers(0, 3, m)
    a0, b0 = pr.codes(pr.pick(E0, h, rng), rng.integers(0, 2, m), rng)
    a2 = np.concatenate([a0[:, None], a2], 1)
    b2 = np.concatenate([b0[:, None], b2], 1)
    a2, b2 = _shuffle_rows(a2, b2, rng)
    c2 = np.zeros(m, np.uint32)
    return np.concatenate([a, a2]), np.concatenate([b, b2]), np.concatenate([c, c2])


def _gen_c_alignment(key, ta, tb):
    """c at exponent e_max + off for off above, at and below e_max, and around
    -F (c itself truncated), -23..-26 (c's last bits), with significands 1.0,
    all ones, lowest bit, E8M13 all ones and random; products: one at E0 alone, or
    with L-1 random products within F+3 binades below E0; all sign pairs."""
    model, pr, rng = MODELS[key], Products(ta, tb), _rng("calign", key, ta, tb)
    F, L = model.F, model.L
    offs = sorted(set(range(-F - 4, -F + 3)) | set(range(-26, -21)) | {-14, -13, -12} | set(range(-3, F + 5)))
    mants = [0, 0x7FFFFF, 0x000001, 0x7FE000, -1]
    grid = np.array([(o, mi, sc, sp, cfg) for o in offs for mi in range(len(mants))
                     for sc in (0, 1) for sp in (0, 1) for cfg in (0, 1)])
    off, mi, sc, sp, cfg = grid.T
    n = len(grid)
    E0 = rng.choice(pr.exps, n)
    a, b = _zero_products((n, L), ta, tb, rng)
    a[:, 0], b[:, 0] = pr.codes(pr.pick(E0, rng.integers(0, 3, n), rng), sp, rng)
    El = E0[:, None] - rng.integers(0, F + 4, (n, L - 1))
    ok = pr.has(El) & (cfg[:, None] == 1)
    la, lb = pr.codes(pr.pick(np.where(ok, El, E0[:, None]), 2, rng), rng.integers(0, 2, El.shape), rng)
    a[:, 1:] = np.where(ok, la, a[:, 1:])
    b[:, 1:] = np.where(ok, lb, b[:, 1:])
    a, b = _shuffle_rows(a, b, rng)
    mant = np.array(mants)[mi]
    mant = np.where(mant < 0, rng.integers(0, 1 << 23, n), mant)
    c = _f32_bits(sc, np.clip(E0 + off, -126, 127), mant)
    return a, b, c


def _gen_carry_and_rz(key, ta, tb):
    """Sums that carry into a new binade, or land just beside a grid point of the
    result format (R = 13 or 23 fraction bits) so that RZ decides the last bit.

    c = +-2**k * (2 - 2**(1-j)) (j ones) or +-2**k; t = 1..3 products of exactly
    2**(k+1-j') for j' around j, R, 23 and F; both signs. Plus steps of L equal
    products (largest, or random at a common exponent) of one sign, which carry
    several binades, with and without c."""
    model, pr, rng = MODELS[key], Products(ta, tb), _rng("carry", key, ta, tb)
    F, L, R = model.F, model.L, model.result_fraction_bits
    js = sorted({R - 1, R, R + 1, 23, 24})
    rows = []
    for pattern in ("ones", "pow2"):
        for j in js:
            for jp in sorted({j - 1, j, j + 1, j + 2, F, F + 1, F + 2}):
                for t in (1, 2, 3):
                    for sc in (0, 1):
                        for sp in (0, 1):
                            rows.append((pattern == "ones", j, jp, t, sc, sp))
    G = np.array(rows)
    ones, j, jp, t, sc, sp = G.T
    n = len(G)
    x = rng.choice(pr.p2_exps, n)  # log2 of each product
    k = x + jp - 1
    k = np.clip(k, -126, 127)
    x = k + 1 - jp
    valid = np.isin(x, pr.p2_exps)
    mant = np.where(ones == 1, ((1 << 23) - (1 << np.maximum(24 - j, 0))) & 0x7FFFFF, 0)
    c = _f32_bits(sc, k, mant)
    a, b = _zero_products((n, L), ta, tb, rng)
    xi = np.where(valid, x, pr.p2_exps[-1])
    for col in range(3):
        use = valid & (t > col)
        pa, pb = pr.codes(pr.pick_pow2(xi, rng), sp, rng)
        a[:, col] = np.where(use, pa, a[:, col])
        b[:, col] = np.where(use, pb, b[:, col])
    a, b = _shuffle_rows(a[valid], b[valid], rng)
    c = c[valid]

    # L equal-sign products: the largest, or random ones at one exponent
    m = 64
    E0 = rng.choice(pr.exps, m)
    how = np.where(np.arange(m) < 8, 1, 2)
    E0 = np.where(np.arange(m) < 8, pr.exps[-1], E0)
    s = (np.arange(m) % 2).astype(np.uint8)
    idx = pr.pick(np.repeat(E0[:, None], L, 1), np.repeat(how[:, None], L, 1), rng)
    a2, b2 = pr.codes(idx, np.repeat(s[:, None], L, 1), rng)
    E0f = np.clip(E0 + rng.integers(-F - 2, 3, m), -126, 127)
    c2 = np.where(np.arange(m) % 4 < 2, 0,
                  _f32_bits(rng.integers(0, 2, m), E0f, rng.integers(0, 1 << 23, m))).astype(np.uint32)
    return np.concatenate([a, a2]), np.concatenate([b, b2]), np.concatenate([c, c2])


def _gen_cancellation(key, ta, tb):
    """Exact cancellation: x and -x (with and without a small product d ~ F below,
    truncated or not), c = -x, and L/2 pairs +-x_i (sign-magnitude truncation
    cancels exactly; a floor would not)."""
    model, pr, rng = MODELS[key], Products(ta, tb), _rng("cancel", key, ta, tb)
    F, L = model.F, model.L
    n = 96
    parts = []
    # x, -x, optionally a small product at d in [F-2, F+3]
    E0 = rng.choice(pr.exps, n)
    i0 = pr.pick(E0, rng.integers(0, 3, n), rng)
    s = rng.integers(0, 2, n)
    a, b = _zero_products((n, L), ta, tb, rng)
    a[:, 0], b[:, 0] = pr.codes(i0, s, rng)
    a[:, 1], b[:, 1] = pr.codes(i0, 1 - s, rng)
    El = E0 - rng.integers(F - 2, F + 4, n)
    ok = pr.has(El) & (np.arange(n) % 3 != 0)
    pa, pb = pr.codes(pr.pick(np.where(ok, El, E0), 2, rng), rng.integers(0, 2, n), rng)
    a[:, 2], b[:, 2] = np.where(ok, pa, a[:, 2]), np.where(ok, pb, b[:, 2])
    cz = rng.choice(np.array([0, 0x80000000], np.uint32), n)
    parts.append((a, b, cz))
    # c = -x (x exactly representable in FP32), plus an optional tiny product
    a, b = _zero_products((n, L), ta, tb, rng)
    a[:, 0], b[:, 0] = pr.codes(i0, s, rng)
    xv = pr.value[i0] * np.where(s == 1, -1.0, 1.0)
    a[:, 1], b[:, 1] = np.where(ok, pa, a[:, 1]), np.where(ok, pb, b[:, 1])
    parts.append((a, b, _f32_from_float(-xv)))
    # L/2 pairs +-x_i with x_i at random exponents within F+4 binades
    E0 = rng.choice(pr.exps, n)
    El = E0[:, None] - rng.integers(0, F + 4, (n, L // 2))
    El = np.where(pr.has(El), El, E0[:, None])
    idx = pr.pick(El, 2, rng)
    sg = rng.integers(0, 2, El.shape)
    pa, pb = pr.codes(idx, sg, rng)
    na, nb = pr.codes(idx, 1 - sg, rng)
    a, b = _shuffle_rows(np.concatenate([pa, na], 1), np.concatenate([pb, nb], 1), rng)
    parts.append((a, b, rng.choice(np.array([0, 0x80000000], np.uint32), n)))
    return tuple(np.concatenate(x) for x in zip(*parts))


def _gen_zero_steps(key, ta, tb):
    """All-zero product steps (signed zeros times finite codes) with c zero, tiny
    normal or subnormal (c alone sets e_max: its truncation to F bits below
    2**-126 and the result rounding act on it), and tiny products with such c."""
    model, pr, rng = MODELS[key], Products(ta, tb), _rng("zeros", key, ta, tb)
    L = model.L
    fixed = np.array([0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,
                      0x00400000, 0x00000400, 0x000003FF, 0x00000800, 0x00001FFF, 0x00002000,
                      0x00800000, 0x80800000, 0x00800001, 0x00FFFFFF, 0x80FFFFFF, 0x01000000,
                      0x3F800000, 0x3FFFFFFF, 0xC0400001, 0x7F7FFFFF, 0xFF800000, 0x7FC00000], np.uint32)
    sub = rng.integers(1, 1 << 23, 48).astype(np.uint32) | (rng.integers(0, 2, 48).astype(np.uint32) << 31)
    tiny = _f32_bits(rng.integers(0, 2, 32), rng.integers(-126, -100, 32), rng.integers(0, 1 << 23, 32))
    cs = np.concatenate([fixed, sub, tiny])
    a, b = _zero_products((cs.size, L), ta, tb, rng)
    # tiny nonzero products (the smallest exponents of the mix) with the same c
    a2, b2 = _zero_products((cs.size, L), ta, tb, rng)
    Es = pr.exps[: 3]
    a2[:, 0], b2[:, 0] = pr.codes(pr.pick(rng.choice(Es, cs.size), 2, rng), rng.integers(0, 2, cs.size), rng)
    a2, b2 = _shuffle_rows(a2, b2, rng)
    return np.concatenate([a, a2]), np.concatenate([b, b2]), np.concatenate([cs, cs])


def _gen_specials(key, ta, tb):
    """NaN and Inf codes in otherwise finite steps: NaN anywhere, Inf times zero,
    Inf of one or both signs, and c = +-Inf or NaN against finite or infinite terms."""
    model, rng = MODELS[key], _rng("specials", key, ta, tb)
    L, n = model.L, 384
    fa, fb = _finite_codes(ta), _finite_codes(tb)
    a, b = rng.choice(fa, (n, L)), rng.choice(fb, (n, L))
    for fmt, x in ((ta, a), (tb, b)):
        nans, infs = _special_codes(fmt)
        spec = np.concatenate([nans, infs, infs, infs]) if infs.size else nans
        for col in (0, 1):
            use = rng.random(n) < (0.8 if col == 0 else 0.3)
            x[:, col] = np.where(use, rng.choice(spec, n), x[:, col])
    zero = rng.random(n) < 0.25  # Inf/NaN times zero
    b[:, 0] = np.where(zero, rng.choice(np.array([0, 0x80], np.uint8), n), b[:, 0])
    a, b = _shuffle_rows(a, b, rng)
    c = rng.choice(np.array([0, 0x3F800000, 0xC47A0000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFF7FFFFF],
                            np.uint32), n)
    return a, b, c


GENERATORS = {
    "alignment": _gen_alignment,
    "c-alignment": _gen_c_alignment,
    "carry-and-rz": _gen_carry_and_rz,
    "cancellation": _gen_cancellation,
    "zero-steps": _gen_zero_steps,
    "specials": _gen_specials,
}


@pytest.mark.parametrize("key,ta,tb", CASES)
@pytest.mark.parametrize("family", list(GENERATORS))
def test_boundary_steps(family, key, ta, tb):
    a, b, c = GENERATORS[family](key, ta, tb)
    L = MODELS[key].L
    assert a.shape == b.shape and a.shape[1] == L and c.shape == (a.shape[0],) and a.shape[0] > 50
    _check_pairwise(f"{MODELS[key].name} {ta}x{tb} {family}", key, ta, tb, a, b, c)


def _log_uniform_codes(fmt, rows, L, rng, lo, hi):
    """FP8 codes of magnitude 2**u, u uniform in a per-row window of random width
    inside [lo, hi], random signs, ~10% zeros (RN cast by ml_dtypes)."""
    width = rng.choice(np.array([0, 1, 3, 6, 10, 14, 20, 40]), rows).astype(np.float64)
    width = np.minimum(width, hi - lo)
    start = lo + rng.random(rows) * (hi - lo - width)
    u = start[:, None] + rng.random((rows, L)) * width[:, None]
    dt = _NP_DTYPE[fmt]
    vmax = float(ml_dtypes.finfo(dt).max)
    v = np.minimum(np.exp2(u), vmax) * np.where(rng.random((rows, L)) < 0.5, -1.0, 1.0)
    v = np.where(rng.random((rows, L)) < 0.1, 0.0, v)
    return v.astype(dt).view(np.uint8), start + width / 2


@pytest.mark.parametrize("key,ta,tb", CASES)
def test_random_steps(key, ta, tb):
    """2 x 64 x 64 random full steps: uniform codes (NaN/Inf included) with random c,
    and log-uniform magnitudes with c log-uniform around the products."""
    model, rng = MODELS[key], _rng("random", key, ta, tb)
    L, M = model.L, 64
    a = rng.integers(0, 256, (M, L), dtype=np.uint8)
    b = rng.integers(0, 256, (M, L), dtype=np.uint8)
    kind = rng.integers(0, 3, (M, M))
    c = np.where(kind == 0, 0, np.where(
        kind == 1, rng.integers(0, 1 << 32, (M, M), dtype=np.uint64).astype(np.uint32),
        _f32_bits(rng.integers(0, 2, (M, M)), rng.integers(-40, 40, (M, M)),
                  rng.integers(0, 1 << 23, (M, M))))).astype(np.uint32)
    _check_matrix(f"{model.name} {ta}x{tb} uniform codes", key, ta, tb, a, b, c)

    lim = {"e4m3": (-9.5, 9.0), "e5m2": (-16.5, 16.0)}
    a, ua = _log_uniform_codes(ta, M, L, rng, *lim[ta])
    b, ub = _log_uniform_codes(tb, M, L, rng, *lim[tb])
    ce = np.clip(np.floor(ua[:, None] + ub[None, :] + rng.uniform(-30, 8, (M, M))), -126, 127)
    c = _f32_bits(rng.integers(0, 2, (M, M)), ce.astype(np.int64), rng.integers(0, 1 << 23, (M, M)))
    c = np.where(rng.random((M, M)) < 0.15, 0, c).astype(np.uint32)
    _check_matrix(f"{model.name} {ta}x{tb} log-uniform", key, ta, tb, a, b, c)


# --------------------------------------------------------------------------- 3. chains

@pytest.mark.parametrize("key,ta,tb", CASES)
def test_chain(key, ta, tb):
    """chain() over K = 4L (and K = 2L + 5, a short last step) against the
    simulator's __call__ (A (M, K) @ B (K, N) + C), from c = 0 and from random c."""
    model, rng = MODELS[key], _rng("chain", key, ta, tb)
    sim, M = simulator(key, ta, tb), 16
    lim = {"e4m3": (-9.5, 9.0), "e5m2": (-16.5, 16.0)}
    for K in (4 * model.L, 2 * model.L + 5):
        a, _ = _log_uniform_codes(ta, M, K, rng, *lim[ta])
        b, _ = _log_uniform_codes(tb, M, K, rng, *lim[tb])
        a[:2] = rng.integers(0, 256, (2, K), dtype=np.uint8)  # two rows of uniform codes
        for c_bits in (np.zeros((M, M), np.uint32),
                       _f32_bits(rng.integers(0, 2, (M, M)), rng.integers(-20, 20, (M, M)),
                                 rng.integers(0, 1 << 23, (M, M)))):
            c0 = c_bits.view(np.float32).copy()
            with np.errstate(invalid="ignore", over="ignore"):
                ours = chain(decode(a, CPEMU_FMT[ta]), decode(b, CPEMU_FMT[tb]), 0, K, model, c=c0)
            ours = ours.view(np.uint32)
            At = torch.from_numpy(a.copy()).view(TORCH_DTYPE[ta])
            Bt = torch.from_numpy(np.ascontiguousarray(b.T)).view(TORCH_DTYPE[tb])
            Ct = torch.from_numpy(c_bits.view(np.int32).copy()).view(torch.float32)
            theirs = sim(At, Bt, Ct).view(torch.int32).numpy().view(np.uint32)
            _assert_same(f"{model.name} {ta}x{tb} chain K={K}", ours, theirs,
                         lambda i: a[i // M], lambda i: b[i % M], lambda i: c_bits.flat[i], limit=4,
                         c_name="c_initial")
