"""The CUDA backends (cpemu/cuda/kernels.py) compute the reference's bits exactly.

Every test is marked ``gpu`` and is skipped, with the reason, on a machine without cupy or
without a CUDA GPU. With ``CPEMU_CUDA_FROM_SOURCE=1`` the kernels are compiled from
``cuda_src/`` instead of loaded from the prebuilt fatbins.

* every committed truth recording (tests/data/h200), for both kernel families: the output
  sha256 equals the recorded one (the reference reproduces all of them, tests/test_truth.py);
* every profile (hopper, ada, blackwell) against ``cpemu.gemm(..., backend="reference")``;
* hypothesis-driven shapes, data, formats, plans (split-K, promotion), scales, bias and out
  dtypes against the reference functions, and designed adversarial cases: M = 1, odd tile
  remainders, the profile's split-K shapes, NaN/Inf, cancellation, extreme scales that
  overflow and underflow every output format, output rounding ties;
* argument errors and the current stream.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import cpemu
from cpemu import reference as ref
from cpemu.cases import Case, operands, sha256_arrays
from cpemu.formats import FP8_FORMATS
from cpemu.instruction import ADA_SM89, BLACKWELL_SM120, HOPPER_SM90A, InstructionModel
from cpemu.profile import get_profile
from cpemu.schedule import Plan, slices_for
from cpemu.truth import load_manifest


def _gpu_state():
    try:
        import cupy
    except Exception as e:  # ImportError, or a cupy that cannot find CUDA
        return None, f"cupy is not importable: {type(e).__name__}: {e}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return None, f"no CUDA GPU: {type(e).__name__}: {e}"
    if n < 1:
        return None, "no CUDA GPU"
    return cupy, ""


cp, _REASON = _gpu_state()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cp is None, reason=_REASON or "no GPU")]

if cp is not None:
    from cpemu.cuda.kernels import as_numpy
    from cpemu.cuda.kernels import RZACC_MAX_F
    from cpemu.cuda.kernels import gemm_cuda as _gemm_cuda
#: a tuning build of the tiled kernel under test: ``CPEMU_TEST_TILED_DEFINES="NAME=VALUE ..."``
#: compiles cuda-tiled from cuda_src with those -D options (kernels.gemm_cuda's ``defines``)
TILED_DEFINES = tuple(os.environ.get("CPEMU_TEST_TILED_DEFINES", "").split())
#: likewise for cuda-rzacc (``CPEMU_TEST_RZACC_DEFINES``, e.g. a step's products over four threads at small M:
#: ``CPT_KPARTS=4 CPT_MINBLOCKS=2``)
RZACC_DEFINES = tuple(os.environ.get("CPEMU_TEST_RZACC_DEFINES", "").split())
#: likewise for cuda-simple (``CPEMU_TEST_SIMPLE_DEFINES``, e.g. the staged kernel's one-output-per-thread
#: build: ``CPS_TN=1``)
SIMPLE_DEFINES = tuple(os.environ.get("CPEMU_TEST_SIMPLE_DEFINES", "").split())
#: the kernel families, the simple family forced onto its per-output kernel, and the tiled
#: kernel forced onto each of its geometries ("family:variant"; plain "cuda-simple" picks its
#: kernel by the model -- the staged one for Ada and Hopper -- and plain "cuda-tiled" its
#: geometry by M)
FAMILIES = ("cuda-simple", "cuda-simple:per-output", "cuda-tiled", "cuda-tiled:gemm_tiled",
            "cuda-tiled:gemm_tiled_small_m", "cuda-rzacc", "cuda-rzacc:gemm_rzacc", "cuda-rzacc:gemm_rzacc_small_m",
            "cuda-rzacc:gemm_rzacc_pre")


def gemm_cuda(*args, **kw):
    """kernels.gemm_cuda, with a ``family:variant`` kernel family forcing a simple kernel or a
    tiled geometry."""
    by_name = "kernel_family" in kw
    family = kw.pop("kernel_family") if by_name else args[0]
    name, _, variant = family.partition(":")
    if name == "cuda-rzacc":
        model = next((x for x in list(args) + list(kw.values()) if isinstance(x, InstructionModel)), None)
        if model is not None and model.F > RZACC_MAX_F:
            pytest.skip(f"cuda-rzacc computes F <= {RZACC_MAX_F}; {model.name} has F = {model.F} (cuda-tiled runs it)")
    if variant:
        kw.setdefault("simple_kernel" if name == "cuda-simple" else "tiled_module", variant)
    if name == "cuda-tiled" and TILED_DEFINES:
        kw.setdefault("defines", TILED_DEFINES)
    if name == "cuda-simple" and SIMPLE_DEFINES:
        kw.setdefault("defines", SIMPLE_DEFINES)
    if name == "cuda-rzacc" and RZACC_DEFINES:
        kw.setdefault("defines", RZACC_DEFINES)
    try:
        return _gemm_cuda(name, *(args if by_name else args[1:]), **kw)
    except ValueError as e:  # the stage-image geometry runs only plans whose steps lie in 32-element K chunks
        if variant == "gemm_rzacc_pre" and "gemm_rzacc_pre cannot run this call" in str(e):
            pytest.skip(str(e)[:200])
        raise

TRUTH = os.path.join(os.path.dirname(__file__), "data", "h200")
HOPPER = "hopper-h200-torch"
PROFILES = ("hopper-h200-torch", "ada-rtx4060-torch", "blackwell-rtx5070ti-torch")
MODELS = {"hopper": HOPPER_SM90A, "ada": ADA_SM89, "blackwell": BLACKWELL_SM120}


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


def _mode(order="acc*(sa*sb)"):
    return {"epilogue": {"order": order}, "nan_bits": {"bfloat16": 0x7FFF, "float16": 0x7FFF, "float32": 0x7FFFFFFF}}


def reference_bits(a_codes, bt_codes, fa, fb, plan, model, mode, sa, sb, bias, out_dtype):
    """The reference's output bits for explicit plan/model/mode (cpemu.reference.gemm_codes)."""
    sa = sa.reshape(()) if sa.size == 1 else sa
    sb = sb.reshape(()) if sb.size == 1 else sb
    out = ref.gemm_codes(a_codes, bt_codes, FP8_FORMATS[fa], FP8_FORMATS[fb], plan, model, mode["epilogue"], sa, sb,
                         bias, out_dtype, mode.get("nan_bits", {}).get(out_dtype))
    return _bits(out)


def cuda_bits(family, a_codes, bt_codes, fa, fb, plan, model, mode, sa, sb, bias, out_dtype):
    y = gemm_cuda(family, cp.asarray(a_codes), cp.asarray(bt_codes), fa, fb, plan, model, mode, sa, sb, bias,
                  out_dtype)
    return _bits(y.get())


def assert_same(got: np.ndarray, want: np.ndarray, what: str):
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    bad = np.argwhere(got != want)
    if len(bad):
        w = 2 * got.dtype.itemsize
        lines = [f"[{i},{j}] cuda=0x{int(got[i, j]):0{w}x} reference=0x{int(want[i, j]):0{w}x}" for i, j in bad[:6]]
        pytest.fail(f"{what}: {len(bad)} of {got.size} outputs differ: " + "; ".join(lines))


def check(family, a_codes, bt_codes, fa="e4m3", fb="e4m3", plan=None, model=HOPPER_SM90A, mode=None,
          sa=None, sb=None, bias=None, out_dtype="float32", what=""):
    K = a_codes.shape[1]
    plan = plan or Plan(slices=((0, K),), promotion=None)
    mode = mode or _mode()
    sa = np.array(1.0, np.float32) if sa is None else sa
    sb = np.array(1.0, np.float32) if sb is None else sb
    want = reference_bits(a_codes, bt_codes, fa, fb, plan, model, mode, sa, sb, bias, out_dtype)
    got = cuda_bits(family, a_codes, bt_codes, fa, fb, plan, model, mode, sa, sb, bias, out_dtype)
    assert_same(got, want, what or f"{family} {a_codes.shape[0]}x{bt_codes.shape[0]}x{K}")


# --------------------------------------------------------------------------- truth recordings

_MAN = load_manifest(TRUTH)
_NPZ: dict = {}
TRUTH_CASES = [rec for rec in _MAN["cases"] if "error" not in rec]


def _stored(rec):
    if rec.get("stored") != "bits":
        return None
    path = os.path.join(TRUTH, rec["file"])
    if path not in _NPZ:
        _NPZ[path] = np.load(path)
    return _NPZ[path][rec["id"]]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rec", TRUTH_CASES, ids=[r["id"] for r in TRUTH_CASES])
def test_truth_recording(family, rec):
    """The GPU kernel reproduces the recorded H200 output (= the reference's) bit for bit."""
    case = Case.from_json(rec)
    a, bt, sa, sb, bias = operands(case)
    assert sha256_arrays(a, bt, sa, sb, bias) == rec["inputs_sha256"]
    prof = get_profile(_MAN["profile"])
    scaling = "rowwise" if case.scale == "rowwise" else "tensorwise"
    plan = prof.plan(case.M, case.N, case.K, case.fast_accum, scaling, case.a_format, case.b_format, case.out_dtype)
    mode = prof.mode(scaling)
    bias_f32 = None
    if bias is not None:
        bias_f32 = bias.view(np.float16 if case.out_dtype == "float16" else ml_dtypes.bfloat16).astype(np.float32)
    got = cuda_bits(family, a, bt, case.a_format, case.b_format, plan, prof.instruction, mode, sa, sb, bias_f32,
                    case.out_dtype)
    assert list(got.shape) == rec["output_shape"]
    if sha256_arrays(got) != rec["output_sha256"]:
        bits = _stored(rec)
        detail = ""
        if bits is not None:
            bad = np.argwhere(got[: bits.shape[0]] != bits)
            detail = "; ".join(f"[{i},{j}] gpu=0x{int(bits[i, j]):x} cuda=0x{int(got[i, j]):x}" for i, j in bad[:4])
        pytest.fail(f"{rec['id']}: output sha256 differs from the H200 recording. {detail}")


# --------------------------------------------------------------------------- profiles via cpemu.gemm


def _fp8(rng, shape, fmt, kind="gauss40"):
    c = Case(shape[0], 16, shape[1], data=kind, seed=int(rng.integers(1 << 30)), a_format=fmt)
    a = operands(c)[0]
    return a


PROFILE_CALLS = [
    # (M, N, K, a_format, b_format, fast_accum, out_dtype, scaling, bias)
    (1, 16, 16, "e4m3", "e4m3", True, "bfloat16", "tensor", False),
    (17, 48, 80, "e4m3", "e4m3", False, "float32", "tensor", False),
    (64, 80, 512, "e4m3", "e5m2", True, "float16", "tensor", True),
    (33, 128, 1024, "e5m2", "e4m3", False, "bfloat16", "rowwise", True),
    (70, 144, 640, "e4m3", "e4m3", False, "float32", "rowwise", False),
    (16, 64, 16384, "e4m3", "e4m3", False, "float32", "tensor", False),  # split-K on the H200
    (16, 64, 16384, "e4m3", "e4m3", True, "bfloat16", "tensor", True),
    (1, 256, 12304, "e4m3", "e4m3", True, "float32", "tensor", False),  # K not a multiple of 128
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("call", PROFILE_CALLS, ids=lambda c: "x".join(map(str, c[:3])) + "-" + "-".join(
    str(x) for x in c[3:]))
def test_profile_matches_reference(family, profile, call):
    """Each profile's plan, model and epilogue through cpemu.gemm's reference backend."""
    M, N, K, fa, fb, fast, out_dtype, scaling, use_bias = call
    prof = get_profile(profile)
    sc = "rowwise" if scaling == "rowwise" else "tensorwise"
    if sc not in prof.data["modes"] or [fa, fb] not in prof.data["formats"]:
        pytest.skip(f"{profile} does not record {sc} scaling with {fa} x {fb}")
    if out_dtype == "float32" and use_bias:
        use_bias = False
    rng = np.random.default_rng(M * 7919 + N * 31 + K)
    a = _fp8(rng, (M, K), fa)
    bt = _fp8(rng, (N, K), fb, kind="loguniform")
    if sc == "rowwise":
        sa = np.exp2(rng.uniform(-6, 3, (M, 1))).astype(np.float32)
        sb = np.exp2(rng.uniform(-6, 3, (1, N))).astype(np.float32)
    else:
        sa, sb = np.float32(rng.uniform(0.1, 3)), np.float32(rng.uniform(0.1, 3))
    bias = None
    if use_bias:
        bias = (rng.standard_normal(N) * 8).astype(np.float32).astype(
            np.float16 if out_dtype == "float16" else ml_dtypes.bfloat16)
    A = a.view(FP8_FORMATS[fa].np_dtype)
    B = bt.view(FP8_FORMATS[fb].np_dtype).T
    try:
        want = cpemu.gemm(A, B, profile=profile, scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype,
                          fast_accum=fast, backend="reference")
    except cpemu.UnsupportedShape as e:
        pytest.skip(str(e))
    plan = prof.plan(M, N, K, fast, sc, fa, fb, out_dtype)
    got = cuda_bits(family, a, bt, fa, fb, plan, prof.instruction, prof.mode(sc), np.asarray(sa), np.asarray(sb),
                    None if bias is None else bias.astype(np.float32), out_dtype)
    assert_same(got, _bits(want), f"{family} {profile} {call}")


# --------------------------------------------------------------------------- random (hypothesis)

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None

DATA_KINDS = ("uniform", "gauss1", "gauss40", "gauss-tiny", "sparse", "loguniform", "cancel", "spread", "nan")

if given is not None:
    @st.composite
    def gemm_cases(draw):
        model = draw(st.sampled_from(sorted(MODELS)))
        M = draw(st.one_of(st.just(1), st.integers(1, 80)))
        N = 16 * draw(st.integers(1, 9))
        K = 16 * draw(st.integers(1, 40))
        fa, fb = draw(st.sampled_from([("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]))
        data = draw(st.sampled_from(DATA_KINDS))
        promotion = draw(st.sampled_from([None, None, 1, 2, 4, 8]))
        splits = draw(st.sampled_from([1, 1, 2, 3, 5]))
        gran = draw(st.sampled_from([32, 64, 128]))
        out_dtype = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
        order = draw(st.sampled_from(["acc*(sa*sb)", "(acc*sa)*sb", "(acc*sb)*sa"]))
        rowwise = draw(st.booleans())
        bias = draw(st.booleans())
        seed = draw(st.integers(0, 2 ** 30))
        return model, M, N, K, fa, fb, data, promotion, splits, gran, out_dtype, order, rowwise, bias, seed

    @pytest.mark.parametrize("family", FAMILIES)
    @settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=gemm_cases())
    def test_random_against_reference(family, case):
        model_key, M, N, K, fa, fb, data, promotion, splits, gran, out_dtype, order, rowwise, use_bias, seed = case
        model = MODELS[model_key]
        c = Case(M, N, K, data=data, seed=seed, a_format=fa, b_format=fb)
        a, bt, _, _, _ = operands(c)
        gran = max(gran, model.L)
        plan = Plan(slices=slices_for(K, splits, gran), promotion=promotion)
        rng = np.random.default_rng(seed)
        if rowwise:
            sa = np.exp2(rng.uniform(-20, 20, (M, 1))).astype(np.float32)
            sb = np.exp2(rng.uniform(-20, 20, (1, N))).astype(np.float32)
        else:
            sa, sb = np.array(rng.uniform(-4, 4), np.float32), np.array(np.exp2(rng.uniform(-30, 30)), np.float32)
        bias = (rng.standard_normal(N) * 2.0 ** rng.integers(-10, 10)).astype(np.float32) if use_bias else None
        check(family, a, bt, fa, fb, plan, model, _mode(order), sa, sb, bias, out_dtype,
              what=f"{family} {case}")


# --------------------------------------------------------------------------- designed cases

SHAPES = [(1, 16, 16), (16, 16, 16), (17, 48, 80), (3, 16, 48), (65, 65 + 15, 96), (64, 64, 32), (100, 80, 1008),
          (128, 192, 256)]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("model_key", sorted(MODELS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shapes_all_models(family, model_key, shape):
    M, N, K = shape
    N = -(-N // 16) * 16
    model = MODELS[model_key]
    a, bt, _, _, _ = operands(Case(M, N, K, data="uniform", seed=M + N + K))
    for promotion in (None, 4):
        check(family, a, bt, plan=Plan(((0, K),), promotion), model=model, what=f"{family} {model_key} {shape}")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("model_key", sorted(MODELS))
@pytest.mark.parametrize("data", DATA_KINDS)
@pytest.mark.parametrize("formats", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")])
def test_data_kinds(family, model_key, data, formats):
    fa, fb = formats
    model = MODELS[model_key]
    M, N, K = 37, 80, 352
    a, bt, _, _, _ = operands(Case(M, N, K, data=data, seed=5, a_format=fa, b_format=fb))
    for plan in (Plan(((0, K),), None), Plan(slices_for(K, 3, 64), 2)):
        check(family, a, bt, fa, fb, plan, model, what=f"{family} {model_key} {data} {formats} {plan}")


def _special_codes(fmt):
    return [0x7F, 0xFF] if fmt == "e4m3" else [0x7C, 0xFC, 0x7D, 0xFE]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("formats", [("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e4m3")])
def test_nan_inf(family, formats):
    """NaN and Inf codes of both signs, inf * 0, inf - inf within a step, across steps
    (accumulator inf), across promotion chains and split-K slices (FP32 adds)."""
    fa, fb = formats
    rng = np.random.default_rng(11)
    M, N, K = 70, 96, 512
    a, bt, _, _, _ = operands(Case(M, N, K, data="gauss1", seed=3, a_format=fa, b_format=fb))
    for x, fmt in ((a, fa), (bt, fb)):
        sp = np.array(_special_codes(fmt), np.uint8)
        hit = rng.random(x.shape) < 0.004
        x[hit] = rng.choice(sp, size=int(hit.sum()))
        x[rng.random(x.shape) < 0.2] = 0  # zeros for inf * 0
    a[5, :] = _special_codes(fa)[0]  # a whole row of NaN (e4m3) / +inf (e5m2)
    bt[7, 100] = _special_codes(fb)[0]
    bt[8, 3] = _special_codes(fb)[-1]
    for model in MODELS.values():
        for plan in (Plan(((0, K),), None), Plan(((0, K),), 2), Plan(slices_for(K, 3, 128), None),
                     Plan(slices_for(K, 2, 128), 1)):
            for out_dtype in ("float32", "bfloat16", "float16"):
                check(family, a, bt, fa, fb, plan, model, out_dtype=out_dtype, what=f"{family} {formats} {plan}")


@pytest.mark.parametrize("family", FAMILIES)
def test_splitk_shapes_of_the_profile(family):
    """Shapes that the H200 profile splits, with its own plans (2 to 6 slices)."""
    prof = get_profile(HOPPER)
    for M, N, K in ((16, 64, 16384), (1, 16, 14336), (64, 64, 10256), (7, 48, 14352)):
        for fast in (True, False):
            plan = prof.plan(M, N, K, fast)
            assert plan.splits > 1
            a, bt, _, _, _ = operands(Case(M, N, K, data="gauss40", seed=M + K))
            check(family, a, bt, plan=plan, model=prof.instruction, mode=prof.mode("tensorwise"),
                  what=f"{family} {M}x{N}x{K} fast={fast} {plan.splits} slices")


def _encoder_inputs(values: np.ndarray):
    """A GEMM whose accumulator is exactly 1.0 everywhere and whose row scale is `values`:
    with the order (acc*sb)*sa, y = values[m] (then + bias), so the output conversion is
    tested on arbitrary FP32 values."""
    M, N, K = len(values), 32, 16
    one = np.uint8(0x38)  # e4m3 1.0
    a = np.zeros((M, K), np.uint8)
    a[:, 3] = one
    bt = np.zeros((N, K), np.uint8)
    bt[:, 3] = one
    return a, bt, values.reshape(M, 1).astype(np.float32), np.ones((1, N), np.float32)


def _interesting_f32(rng, n):
    """FP32 values around every rounding boundary of bf16 and fp16: ties, overflow to inf,
    subnormal ranges, the smallest values, plus random bit patterns."""
    vals = [0.0, -0.0, 65504.0, 65519.99, 65520.0, 65536.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26,
            2.0 ** -25 * 1.0000001, 3.3895314e38, 3.4028235e38, 1e-45, 1.17549435e-38, 1.1754942e-38]
    vals = np.array(vals + [-v for v in vals], np.float32)
    u = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    u[: n // 4] = (u[: n // 4] & 0xFFFF0000) | 0x8000  # bf16 ties
    u[n // 4: n // 2] = (u[n // 4: n // 2] & 0xFFFFE000) | 0x1000  # fp16 ties (normal range)
    e = rng.integers(90, 145, n // 4).astype(np.uint32)  # fp16 subnormal / overflow region
    u[n // 2: n // 2 + n // 4] = (u[n // 2: n // 2 + n // 4] & 0x807FFFFF) | (e << 23)
    r = u.view(np.float32)
    r = r[np.isfinite(r)]
    return np.concatenate([vals, r]).astype(np.float32)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
def test_output_conversion_and_extreme_scales(family, out_dtype):
    rng = np.random.default_rng(7)
    vals = _interesting_f32(rng, 1 << 14)
    a, bt, sa, sb = _encoder_inputs(vals)
    N = bt.shape[0]
    bias = np.zeros(N, np.float32)
    bias[1], bias[2], bias[3], bias[4] = np.inf, -np.inf, np.nan, 1.0  # y + inf, y - inf, NaN, +1
    mode = _mode("(acc*sb)*sa")
    check(family, a, bt, sa=sa, sb=sb, mode=mode, bias=None, out_dtype=out_dtype, what=f"{family} encode")
    check(family, a, bt, sa=sa, sb=sb, mode=mode, bias=bias, out_dtype=out_dtype, what=f"{family} encode+bias")
    # huge and tiny products of real GEMM outputs with the scales: overflow, subnormals, zeros
    a2, bt2, _, _, _ = operands(Case(40, 48, 256, data="loguniform", seed=9))
    for lo, hi in ((100, 127), (-149, -120), (-40, 40)):
        sa2 = np.exp2(rng.uniform(lo, hi, (40, 1))).astype(np.float32)
        sb2 = np.exp2(rng.uniform(-10, 10, (1, 48))).astype(np.float32)
        for order in ("acc*(sa*sb)", "(acc*sa)*sb", "(acc*sb)*sa"):
            check(family, a2, bt2, sa=sa2, sb=sb2, mode=_mode(order), out_dtype=out_dtype,
                  what=f"{family} scales 2**[{lo},{hi}] {order}")


@pytest.mark.parametrize("family", FAMILIES)
def test_nan_bits_of_the_mode(family):
    """NaN outputs take the mode's nan_bits."""
    a, bt, _, _, _ = operands(Case(16, 16, 32, data="uniform", seed=1))
    a[0, 0] = 0x7F
    mode = {"epilogue": {"order": "acc*(sa*sb)"}, "nan_bits": {"float32": 0x7FC00000, "bfloat16": 0x7FC0,
                                                                "float16": 0x7E00}}
    for out_dtype in ("float32", "bfloat16", "float16"):
        want = reference_bits(a, bt, "e4m3", "e4m3", Plan(((0, 32),), None), HOPPER_SM90A, mode,
                              np.array(1, np.float32), np.array(1, np.float32), None, out_dtype)
        got = cuda_bits(family, a, bt, "e4m3", "e4m3", Plan(((0, 32),), None), HOPPER_SM90A, mode,
                        np.array(1, np.float32), np.array(1, np.float32), None, out_dtype)
        assert_same(got, want, f"{family} nan_bits {out_dtype}")
        assert int(got[0, 0]) == mode["nan_bits"][out_dtype]


@pytest.mark.parametrize("family", FAMILIES)
def test_evo2_1b_rows(family):
    """The Evo 2 1B projection (M=256, N=5760, K=1920) against the reference on 16 rows."""
    M, N, K = 256, 5760, 1920
    prof = get_profile(HOPPER)
    a, bt, _, _, _ = operands(Case(M, N, K, data="gauss40", seed=42))
    for fast in (True, False):
        plan = prof.plan(M, N, K, fast)
        y = gemm_cuda(family, cp.asarray(a), cp.asarray(bt), "e4m3", "e4m3", plan, prof.instruction,
                      prof.mode("tensorwise"), np.float32(0.5), np.float32(0.25), None, "bfloat16")
        got = _bits(y.get())
        want = reference_bits(a[:16], bt, "e4m3", "e4m3", plan, prof.instruction, prof.mode("tensorwise"),
                              np.array(0.5, np.float32), np.array(0.25, np.float32), None, "bfloat16")
        assert_same(got[:16], want, f"{family} evo2-1b fast={fast}")
        # the other rows: against the first rows' kernel on a permutation of A's rows
        perm = np.random.default_rng(0).permutation(M)[:16]
        want2 = reference_bits(a[perm], bt, "e4m3", "e4m3", plan, prof.instruction, prof.mode("tensorwise"),
                               np.array(0.5, np.float32), np.array(0.25, np.float32), None, "bfloat16")
        assert_same(got[perm], want2, f"{family} evo2-1b random rows fast={fast}")


@pytest.mark.parametrize("family", FAMILIES)
def test_families_agree_on_a_large_shape(family):
    """Every kernel gives the same bits on a shape too large for the reference here."""
    if family != FAMILIES[0]:
        pytest.skip("compared once, every kernel against the first")
    prof = get_profile(HOPPER)
    M, N, K = 300, 1000 + 8, 4096
    a, bt, _, _, _ = operands(Case(M, N, K, data="loguniform", seed=3))
    for fast in (True, False):
        plan = Plan(slices_for(K, 3, 128), None if fast else 4)
        outs = [_bits(gemm_cuda(f, cp.asarray(a), cp.asarray(bt), "e4m3", "e4m3", plan, prof.instruction,
                                prof.mode("tensorwise"), np.float32(1), np.float32(1), None, "float32").get())
                for f in FAMILIES]
        for f, out in zip(FAMILIES[1:], outs[1:]):
            assert_same(out, outs[0], f"{f} vs {FAMILIES[0]} fast={fast}")


# --------------------------------------------------------------------------- the wrapper


@pytest.mark.parametrize("family", FAMILIES)
def test_current_stream(family):
    a, bt, _, _, _ = operands(Case(64, 64, 256, data="gauss40", seed=2))
    plan = Plan(((0, 256),), 4)
    want = reference_bits(a, bt, "e4m3", "e4m3", plan, HOPPER_SM90A, _mode(), np.array(1, np.float32),
                          np.array(1, np.float32), None, "bfloat16")
    ad, btd = cp.asarray(a), cp.asarray(bt)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        y = gemm_cuda(family, ad, btd, "e4m3", "e4m3", plan, HOPPER_SM90A, _mode(), np.float32(1), np.float32(1),
                      None, "bfloat16")
        host = cp.asnumpy(y, stream=s)
    s.synchronize()
    assert_same(host, want, f"{family} on a non-default stream")
    assert as_numpy(y, "bfloat16").dtype == np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("family", FAMILIES)
def test_argument_errors(family):
    a, bt, _, _, _ = operands(Case(16, 32, 64, data="uniform", seed=4))
    ad, btd = cp.asarray(a), cp.asarray(bt)
    plan, model, mode = Plan(((0, 64),), None), HOPPER_SM90A, _mode()
    one = np.float32(1)

    def call(**kw):
        args = dict(kernel_family=family, a_codes=ad, bt_codes=btd, a_format="e4m3", b_format="e4m3", plan=plan,
                    model=model, mode=mode, scale_a=one, scale_b=one, bias_f32=None, out_dtype="float32")
        args.update(kw)
        return gemm_cuda(**args)

    call()
    cases = [
        (dict(a_codes=a), "a_codes"),                                   # numpy, not cupy
        (dict(a_codes=ad.astype(cp.int8)), "a_codes"),                  # dtype
        (dict(a_codes=cp.asfortranarray(ad)), "a_codes"),               # not C-contiguous
        (dict(bt_codes=btd[:, ::2]), "bt_codes"),                       # not C-contiguous
        (dict(bt_codes=btd[:, :48].copy()), "bt_codes"),                # K mismatch
        (dict(a_format="e3m4"), "a_format"),
        (dict(scale_a=np.float64(1)), "scale_a"),
        (dict(scale_b=np.ones((2, 32), np.float32)), "scale_b"),
        (dict(scale_a=np.ones((1, 16), np.float32)), "scale_a"),
        (dict(bias_f32=np.ones(31, np.float32)), "bias_f32"),
        (dict(bias_f32=np.ones(32, np.float16)), "bias_f32"),
        (dict(out_dtype="float8"), "out_dtype"),
        (dict(plan=Plan(((0, 48),), None)), None),                      # fine: a plan need not cover K
        (dict(plan=Plan(((0, 60),), None)), "plan"),                    # bound not a multiple of 8
        (dict(plan=Plan(((0, 128),), None)), "plan"),                   # beyond K
        (dict(mode={"epilogue": {"order": "sa*acc"}}), "mode"),
        (dict(kernel_family="cuda-fast"), "kernel_family"),
        (dict(tiled_module="gemm_tiled_huge"), "tiled_module"),
        (dict(simple_kernel="per-row"), "simple_kernel"),
        (dict(model=BLACKWELL_SM120, simple_kernel="staged"), "simple_kernel"),  # F = 25: not exact there
    ]
    for kw, arg in cases:
        if arg is None:
            call(**kw)
            continue
        with pytest.raises(ValueError, match=arg):
            call(**kw)
    if cp.cuda.runtime.getDeviceCount() > 1:
        with cp.cuda.Device(1):
            other = cp.asarray(bt)
        with pytest.raises(ValueError, match="bt_codes"):
            call(bt_codes=other)


TILES = os.path.join(os.path.dirname(__file__), "data", "h200-splitk", "tiles")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("i", [0, 3, 23])  # tile 47 with 17 and 18 slices, 448 with 22 (e5m2 x e4m3, float32)
def test_tail_cut_gives_the_h200_bytes(family, i):
    """Where the H200 leaves the last 16 elements of K out (the profile's tail rule), each kernel
    under the profile's plan gives the H200's bytes (tests/data/h200-splitk/tiles, round 2)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("cpemu_tools_splitk_tiles_gpu", os.path.join(
        os.path.dirname(__file__), "..", "tools", "splitk_tiles.py"))
    st = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(st)
    with open(os.path.join(TILES, "verdict2.json")) as f:
        r = json.load(f)["rows"][i]
    fa, fb, out, acc = r["combo"].split(",")
    prof = get_profile(HOPPER)
    plan = prof.plan(r["M"], r["N"], r["K"], acc == "fast", "tensorwise", fa, fb, out)
    assert plan.splits == r["splits"] and plan.slices[-1][1] == r["K"] - 16
    a, bt = st.operands(r)
    one = np.ones((), np.float32)
    got = cuda_bits(family, a, bt, fa, fb, plan, prof.instruction, prof.mode("tensorwise"), one, one, None, out)
    want = np.load(os.path.join(TILES, "native2.npz"))[f"c{i}"]
    assert np.array_equal(np.ascontiguousarray(got).view(np.uint8).reshape(-1), want)
