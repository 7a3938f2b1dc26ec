"""cpu-fp32 against the specification: its step (cpemu.backends.cpu_fp32.tfdpa) gives the bits of
cpemu.reference.tfdpa on boundary and random cases of every model, and whole GEMMs through the
backend give the reference's bits (tests/test_truth.py runs it on every GPU recording).

The reference is the independent model here: integer shifts and int64 sums, where cpu-fp32 uses
float products, trunc and float sums. Failures print both bit patterns."""

import numpy as np
import pytest

import cpemu
from cpemu import reference as ref
from cpemu.backends import cpu_fp32
from cpemu.formats import FP8_FORMATS
from cpemu.instruction import ADA_SM89, BLACKWELL_SM120, HOPPER_SM90A, InstructionModel

#: the shipped models, and two at the border of float32's exact sums (F = 16 sums in float32 at
#: L = 32, F = 17 in float64)
MODELS = [ADA_SM89, HOPPER_SM90A, BLACKWELL_SM120,
          InstructionModel("border-f32", "-", 32, 16, "RZ-E8M13", -133, "test"),
          InstructionModel("border-f64", "-", 32, 17, "RZ-FP32", -133, "test")]
PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]


def test_sum_dtype_border():
    assert [cpu_fp32.sum_dtype(m) for m in MODELS] == [np.float32, np.float32, np.float64, np.float32, np.float64]


def _finite(fmt):
    """Every finite code of the format."""
    c = np.arange(256, dtype=np.uint8)
    return c[(c & 0x7F) != 0x7F] if fmt == "e4m3" else c[(c & 0x7F) < 0x7C]


def _accumulators(rng, n):
    """FP32 accumulators at the boundaries: zeros, subnormals, binade edges, all significand bits
    set, the largest finite, NaN and Inf, then random values of every exponent."""
    special = np.array([0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x3F800000, 0x3F7FFFFF,
                        0xBF800001, 0x4B7FFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
                        0x3A000000, 0xC6FFFFFE], np.uint32)
    rand = (rng.integers(0, 1 << 31, n, dtype=np.uint32) & 0x807FFFFF) | (rng.integers(0, 255, n, dtype=np.uint32) << 23)
    return np.concatenate((special, rand)).view(np.float32)


def _codes(rng, rows, L, fmt, kind):
    fin = _finite(fmt)
    if kind == "all":  # every code, NaN and Inf included
        return rng.integers(0, 256, (rows, L), dtype=np.uint8)
    if kind == "finite":
        return rng.choice(fin, (rows, L)).astype(np.uint8)
    if kind == "spread":  # one large code per row, the rest tiny or zero: deep truncation
        c = rng.choice(fin[(fin & 0x7F) < 0x10], (rows, L)).astype(np.uint8)
        c[:, rng.integers(0, L)] = fin[np.argmax(fin & 0x7F)] | (rng.integers(0, 2) << 7)
        return c
    if kind == "cancel":  # pairs of opposite signs
        c = rng.choice(fin, (rows, L)).astype(np.uint8)
        c[:, 1::2] = c[:, 0::2][:, : c[:, 1::2].shape[1]] ^ 0x80
        return c
    raise ValueError(kind)


def _check(model, c, a, b):
    want = ref.tfdpa(c, a, b, model)
    got = cpu_fp32.tfdpa(c, a, b, model)
    w, g = want.view(np.uint32), got.view(np.uint32)
    if not np.array_equal(w, g):
        i = tuple(np.argwhere(w != g)[0])
        pytest.fail(f"{model.name}: output {i}: 0x{int(g[i]):08x} != reference 0x{int(w[i]):08x} "
                    f"(c = 0x{int(c.view(np.uint32)[i]):08x})")


@pytest.mark.parametrize("model", MODELS, ids=[m.name for m in MODELS])
@pytest.mark.parametrize("fa,fb", PAIRS)
@pytest.mark.parametrize("kind", ["all", "finite", "spread", "cancel"])
def test_step_equals_the_reference(model, fa, fb, kind):
    rng = np.random.default_rng(hash((model.name, fa, fb, kind)) % (1 << 32))
    Mb, Nb = 7, 40
    for Lk in (model.L, 1, 3, model.L - 1):  # whole and short steps
        a = ref.Operand(_codes(rng, Mb, Lk, fa, kind), FP8_FORMATS[fa])
        b = ref.Operand(_codes(rng, Nb, Lk, fb, kind), FP8_FORMATS[fb])
        c = rng.choice(_accumulators(rng, 200), (Mb, Nb))
        _check(model, c, a, b)


@pytest.mark.parametrize("model", MODELS, ids=[m.name for m in MODELS])
def test_step_every_code_against_every_code(model):
    """Each of the 256 codes of A against each of B's, alone in the step and beside a large
    product (so that it is truncated), with zero and boundary accumulators."""
    for fa, fb in PAIRS:
        codes = np.arange(256, dtype=np.uint8)
        big_a = _finite(fa)[np.argmax(_finite(fa) & 0x7F)]
        big_b = _finite(fb)[np.argmax(_finite(fb) & 0x7F)]
        a = np.zeros((256, 2), np.uint8)
        a[:, 0] = codes
        b = np.zeros((256, 2), np.uint8)
        b[:, 0] = codes
        A, B = ref.Operand(a, FP8_FORMATS[fa]), ref.Operand(b, FP8_FORMATS[fb])
        _check(model, np.zeros((256, 256), np.float32), A, B)
        a[:, 1], b[:, 1] = big_a, big_b
        A, B = ref.Operand(a, FP8_FORMATS[fa]), ref.Operand(b, FP8_FORMATS[fb])
        acc = _accumulators(np.random.default_rng(1), 256 * 256 - 16)
        _check(model, acc.reshape(256, 256), A, B)


@pytest.mark.parametrize("profile", ["hopper-h200-torch", "ada-rtx4060-torch", "blackwell-rtx5070ti-torch"])
@pytest.mark.parametrize("data,fast,out", [("gauss40", True, "bfloat16"), ("spread", False, "float32"),
                                           ("nan", True, "float16"), ("cancel", False, "bfloat16")])
def test_gemm_equals_the_reference(profile, data, fast, out):
    from cpemu.cases import Case, operands

    a, bt, *_ = operands(Case(24, 48, 1040, data=data, seed=3))
    e4m3 = FP8_FORMATS["e4m3"].np_dtype
    ys = [cpemu.gemm(a.view(e4m3), bt.view(e4m3).T, profile=profile, out_dtype=out, fast_accum=fast, backend=be)
          for be in ("reference", "cpu-fp32")]
    w, g = (y.view(np.uint32 if out == "float32" else np.uint16) for y in ys)
    assert np.array_equal(w, g), (profile, data, np.argwhere(w != g)[:3].tolist())


def test_auto_takes_it_on_the_cpu():
    """On a machine without a validated GPU backend, ``auto`` takes cpu-fp32 (validated against
    the reference on the hard cases) before the reference."""
    from cpemu import backends

    prof = cpemu.get_profile()
    assert backends.validate("cpu-fp32", prof)[0] is True
    if not any(backends.available(n)[0] for n in backends.LADDER[:backends.LADDER.index("cpu-fp32")]):
        assert backends.select("auto", prof) == "cpu-fp32"
