"""The tensor-core backend (``cublaslt-tc``, cpemu/cuda/tensorcore.py) on a Hopper GPU.

Marked ``gpu``; skipped, with the reason, without cupy, without a GPU, or on a GPU that is
not compute capability 9.0 (the backend's only target). Truth comes from the H200
recordings (tests/data/h200, real torch._scaled_mm outputs) and from the reference, which
is cross-checked against MMA-Sim (tests/test_mmasim_crosscheck.py):

* every H200 recording through ``cpemu.gemm(..., backend="cublaslt-tc")``: the same sha256
  (or the same refusal);
* the Ada profile (zero-padded operands) and the Hopper profile against the reference on
  designed calls: every data kind, mixed formats, odd M, split-K shapes, bias, scales,
  every output dtype; the Evo 2 1B shape against the exact CUDA kernel (full output);
* the padding kernel against numpy, the fallback of ``auto`` for calls the path declines,
  the validation status per profile, and the current stream.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import cpemu
from cpemu import backends
from cpemu.cases import DATA_KINDS, Case, operands
from cpemu.formats import FP8_FORMATS
from cpemu.truth import check_case, load_manifest


def _state():
    try:
        import cupy
    except Exception as e:  # noqa: BLE001
        return None, f"cupy is not importable: {type(e).__name__}: {e}"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "no CUDA GPU"
    except Exception as e:  # noqa: BLE001
        return None, f"no CUDA GPU: {type(e).__name__}: {e}"
    ok, why = backends.available("cublaslt-tc")
    if not ok:
        return None, f"cublaslt-tc unavailable: {why}"
    return cupy, ""


cp, _REASON = _state()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cp is None, reason=_REASON or "no Hopper GPU")]

TC = "cublaslt-tc"
HOPPER, ADA, BLACKWELL = "hopper-h200-torch", "ada-rtx4060-torch", "blackwell-rtx5070ti-torch"
TRUTH = os.path.join(os.path.dirname(__file__), "data", "h200")
_MAN = load_manifest(TRUTH)
_NPZ: dict = {}


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


def assert_same(got, want, what):
    got, want = _bits(got), _bits(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    bad = np.argwhere(got != want)
    if len(bad):
        w = 2 * got.dtype.itemsize
        lines = [f"[{i},{j}] tc=0x{int(got[i, j]):0{w}x} reference=0x{int(want[i, j]):0{w}x}" for i, j in bad[:6]]
        pytest.fail(f"{what}: {len(bad)} of {got.size} outputs differ: " + "; ".join(lines))


def _stored(rec):
    if rec.get("stored") != "bits":
        return None
    path = os.path.join(TRUTH, rec["file"])
    if path not in _NPZ:
        _NPZ[path] = np.load(path)
    return _NPZ[path][rec["id"]]


@pytest.mark.parametrize("rec", _MAN["cases"], ids=[r["id"] for r in _MAN["cases"]])
def test_truth_recording(rec):
    """Each H200 recording: the tensor-core path gives the recorded sha256, or refuses what torch refused."""
    r = check_case(rec, _stored(rec), _MAN["profile"], backend=TC)
    assert r.status in ("match", "rejected-both"), f"{r.case_id}: {r.status}: {r.detail}"


def _call(profile, M, N, K, fa="e4m3", fb="e4m3", fast=True, out_dtype="bfloat16", scale="unit", bias=False,
          data="gauss40", bdata="loguniform", seed=0):
    """(device args, numpy args) of one call: operands from cpemu.cases."""
    a = operands(Case(M, 16, K, data=data, seed=seed, a_format=fa))[0]
    bt = operands(Case(N, 16, K, data=bdata, seed=seed + 1, a_format=fb))[0]
    rng = np.random.default_rng(seed)
    if scale == "rowwise":
        sa = np.exp2(rng.uniform(-6, 3, (M, 1))).astype(np.float32)
        sb = np.exp2(rng.uniform(-6, 3, (1, N))).astype(np.float32)
    elif scale == "tensor":
        sa, sb = np.float32(rng.uniform(0.1, 3)), np.float32(rng.uniform(0.1, 3))
    else:
        sa, sb = np.float32(1), np.float32(1)
    b = None
    if bias:
        b = (rng.standard_normal(N) * 8).astype(np.float32).astype(
            np.float16 if out_dtype == "float16" else ml_dtypes.bfloat16)
    kw = dict(profile=profile, scale_a=sa, scale_b=sb, bias=b, out_dtype=out_dtype, fast_accum=fast)
    host = (a.view(FP8_FORMATS[fa].np_dtype), bt.view(FP8_FORMATS[fb].np_dtype).T)
    return a, bt, host, kw


def _run_tc(a, bt, fa, fb, kw):
    y = cpemu.gemm(cp.asarray(a), cp.asarray(bt).T, a_format=fa, b_format=fb, backend=TC, **kw)
    return y.get()


CALLS = [
    # (M, N, K, fa, fb, fast, out_dtype, scale, bias)
    (1, 16, 16, "e4m3", "e4m3", True, "bfloat16", "unit", False),
    (17, 48, 80, "e4m3", "e4m3", True, "float32", "tensor", False),
    (64, 80, 512, "e4m3", "e5m2", True, "float16", "tensor", True),
    (33, 128, 1024, "e5m2", "e4m3", True, "bfloat16", "tensor", True),
    (70, 144, 640, "e4m3", "e4m3", False, "float32", "tensor", False),
    (33, 128, 1024, "e5m2", "e4m3", False, "bfloat16", "rowwise", True),
    (16, 64, 16384, "e4m3", "e4m3", False, "float32", "unit", False),  # split-K on the H200
    (16, 64, 16384, "e4m3", "e4m3", True, "bfloat16", "tensor", True),
    (1, 256, 12304, "e4m3", "e4m3", True, "float32", "unit", False),  # K not a multiple of 128
    (300, 272, 1920, "e4m3", "e4m3", True, "bfloat16", "unit", False),
]


def _declined(profile, call) -> str | None:
    """Why the module docstring says the path declines this call, else None."""
    M, N, K, fa, fb, fast, out_dtype, scale, bias = call
    if profile == ADA and not fast:
        return "Ada promotion"
    return None


@pytest.mark.parametrize("profile", [HOPPER, ADA])
@pytest.mark.parametrize("call", CALLS, ids=lambda c: "x".join(map(str, c[:3])) + "-" + "-".join(map(str, c[3:])))
def test_profile_calls(profile, call):
    """Designed calls against the reference; declined calls raise CallUnsupported and ``auto`` still
    returns the reference's bits."""
    M, N, K, fa, fb, fast, out_dtype, scale, bias = call
    prof = cpemu.get_profile(profile)
    if scale == "rowwise" and "rowwise" not in prof.data["modes"]:
        pytest.skip(f"{profile} does not record rowwise scaling")
    a, bt, (A, B), kw = _call(profile, M, N, K, fa, fb, fast, out_dtype, scale, bias, seed=M + N + K)
    want = cpemu.gemm(A, B, backend="reference", **kw)
    if _declined(profile, call):
        with pytest.raises(backends.CallUnsupported, match="does not reproduce"):
            _run_tc(a, bt, fa, fb, kw)
        y = cpemu.gemm(cp.asarray(a), cp.asarray(bt).T, a_format=fa, b_format=fb, backend="auto", **kw)
        assert_same(y.get(), want, f"auto fallback {profile} {call}")
        return
    assert_same(_run_tc(a, bt, fa, fb, kw), want, f"{profile} {call}")


@pytest.mark.parametrize("profile", [HOPPER, ADA])
@pytest.mark.parametrize("data", DATA_KINDS)
@pytest.mark.parametrize("formats", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")])
def test_data_kinds(profile, data, formats):
    """Every data kind of cpemu.cases (NaN, cancellation, spread, subnormals, ...) in both operands."""
    fa, fb = formats
    a, bt, (A, B), kw = _call(profile, 48, 64, 320, fa, fb, True, "float32", data=data, bdata=data, seed=11)
    want = cpemu.gemm(A, B, backend="reference", **kw)
    assert_same(_run_tc(a, bt, fa, fb, kw), want, f"{profile} {data} {formats}")


@pytest.mark.parametrize("profile", [HOPPER, ADA])
@pytest.mark.parametrize("data", ["gauss40", "spread"])
def test_evo2_1b_full_output_vs_exact_kernel(profile, data):
    """Evo 2 1B projection (N=5760, K=1920) at M=256: full output equals the exact CUDA-core kernel,
    whose own bits are checked against the reference and the recordings in test_cuda_backends."""
    ok, why = backends.available("cuda-tiled")
    if not ok:
        pytest.skip(f"cuda-tiled unavailable: {why}")
    a, bt, _, kw = _call(profile, 256, 5760, 1920, data=data, bdata="gauss40", seed=5)
    a_d, b_d = cp.asarray(a), cp.asarray(bt).T
    got = cpemu.gemm(a_d, b_d, a_format="e4m3", b_format="e4m3", backend=TC, **kw).get()
    want = cpemu.gemm(a_d, b_d, a_format="e4m3", b_format="e4m3", backend="cuda-tiled", **kw).get()
    assert_same(got, want, f"{profile} evo2-1b {data}")


@pytest.mark.parametrize("rows,K", [(1, 16), (5, 48), (64, 1920), (130, 4096)])
def test_pad_kernel(rows, K):
    """cuda_src/pad_k16.cu: every 16 codes followed by 16 zeros, for aligned and misaligned inputs."""
    from cpemu.cuda.tensorcore import _pad_k16

    x = np.random.default_rng(rows * K).integers(0, 256, (rows + 1, K), dtype=np.uint8)
    want = np.zeros((rows, K // 16, 32), np.uint8)
    want[:, :, :16] = x[1:].reshape(rows, K // 16, 16)
    want = want.reshape(rows, 2 * K)
    dev = cp.asarray(x)
    wide = cp.zeros((rows + 1, K + 32), cp.uint8)
    wide[:, 16:16 + K] = dev
    # the kernel (contiguous, 16-byte aligned) and the cupy fallback (a strided view)
    for view in (dev[1:], wide[1:, 16:16 + K]):
        got = _pad_k16(view).get()
        np.testing.assert_array_equal(got, want)


def test_misaligned_operand_views():
    """Row slices start at any byte offset: the operands are copied to 256-byte alignment first."""
    a, bt, _, kw = _call(HOPPER, 40, 64, 208, seed=3)
    a_d = cp.asarray(np.vstack([a[:3], a]))[3:]
    assert a_d.data.ptr % 256
    want = cpemu.gemm(a.view(ml_dtypes.float8_e4m3fn), bt.view(ml_dtypes.float8_e4m3fn).T, backend="reference",
                      **kw)
    got = cpemu.gemm(a_d, cp.asarray(bt).T, a_format="e4m3", b_format="e4m3", backend=TC, **kw).get()
    assert_same(got, want, "misaligned a")


def test_validation_status():
    """Validated for the Hopper and Ada profiles on this device; never for Blackwell's model."""
    for profile in (HOPPER, ADA):
        ok, why = backends.validate(TC, cpemu.get_profile(profile))
        assert ok, f"{profile}: {why}"
        assert backends.select("auto", cpemu.get_profile(profile)) == TC
    ok, why = backends.validate(TC, cpemu.get_profile(BLACKWELL))
    assert not ok and "no validation case" in why
    assert backends.select("auto", cpemu.get_profile(BLACKWELL)) != TC


def test_forced_on_unsupported_model():
    a, bt, _, kw = _call(BLACKWELL, 16, 32, 64, seed=2)
    with pytest.raises(backends.CallUnsupported, match="instruction model"):
        _run_tc(a, bt, "e4m3", "e4m3", kw)


def test_current_stream():
    """The call runs on cupy's current stream (non-blocking stream, result read after its sync)."""
    a, bt, (A, B), kw = _call(HOPPER, 96, 128, 2048, seed=4)
    want = cpemu.gemm(A, B, backend="reference", **kw)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a_d, b_d = cp.asarray(a), cp.asarray(bt).T
        y = cpemu.gemm(a_d, b_d, a_format="e4m3", b_format="e4m3", backend=TC, **kw)
        s.synchronize()
        assert_same(y.get(stream=s), want, "non-default stream")
