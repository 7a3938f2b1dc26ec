"""``cpemu.torch``: the torch._scaled_mm drop-in, ``patch``, ``FP8Linear`` and the Evo 2 example.

* The drop-in returns the H200's recorded bits for a subset of tests/data/h200 that covers
  every feature (the full set is checked through ``cpemu.gemm`` by test_truth.py): every
  recording of at most 3e6 multiply-adds, the cheapest recording of each split-K count
  (but 2, recorded only on 2e8-MAC shapes), and Evo 2 1B at M = 1; called as unmodified code calls it (``torch._scaled_mm`` inside
  ``cpemu.torch.patch()``).
* Calls torch rejects raise torch's exception type and message: the messages recorded on
  the H200 (tools/record_truth.py ``probe-errors`` and the rejected recordings of the
  manifest).
* ``patch`` restores ``torch._scaled_mm`` on exit, when the block raises, and when nested.
* ``FP8Linear`` quantises as Transformer Engine does and runs the padded GEMM; the example
  script (examples/evo2_projection.py) reproduces the recorded Evo 2 1B outputs through it.

Skipped without torch (a CPU build is enough).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cpemu
import cpemu.torch as ct
from cpemu.cases import Case, operands, sha256_arrays
from cpemu.torch import convert, layout, routes, scaling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTH = os.path.join(ROOT, "tests", "data", "h200")
with open(os.path.join(TRUTH, "manifest.json")) as _f:
    MANIFEST = json.load(_f)

F8, F8B = torch.float8_e4m3fn, torch.float8_e5m2
_TF = {"e4m3": F8, "e5m2": F8B}
_OUT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _cost(rec):
    return rec["M"] * rec["N"] * rec["K"]


def _subset():
    ok = [r for r in MANIFEST["cases"] if "error" not in r]
    pick = {r["id"]: r for r in ok if _cost(r) <= 3_000_000}
    for s in sorted({r.get("splits", 1) for r in ok}):
        r = min((r for r in ok if r.get("splits", 1) == s), key=_cost)
        if _cost(r) <= 20_000_000:  # 2 slices: only on 2e8-MAC shapes, left to test_truth.py
            pick.setdefault(r["id"], r)
    for r in ok:
        if "evo2-1b" in r.get("tags", ()) and r["M"] == 1:
            pick.setdefault(r["id"], r)
    return list(pick.values())


SUBSET = _subset()


def torch_inputs(rec):
    """The recorded call's arguments as torch CPU tensors, as tools/record_truth.py made them."""
    case = Case.from_json(rec)
    a, bt, sa, sb, bias = operands(case)
    assert sha256_arrays(a, bt, sa, sb, bias) == rec["inputs_sha256"]
    ta = torch.from_numpy(a).view(_TF[case.a_format])
    tb = torch.from_numpy(bt).view(_TF[case.b_format]).t()  # column-major (K, N)
    tsa = torch.from_numpy(np.ascontiguousarray(sa))
    tsb = torch.from_numpy(np.ascontiguousarray(sb))
    tbias = None
    if bias is not None:
        tbias = torch.from_numpy(bias.view(np.int16)).view(torch.float16 if case.out_dtype == "float16"
                                                           else torch.bfloat16)
    return ta, tb, tsa, tsb, tbias, _OUT[case.out_dtype], case.fast_accum


def out_bits(y):
    if y.dtype == torch.float32:
        return y.contiguous().view(torch.int32).numpy().view(np.uint32)
    return y.contiguous().view(torch.int16).numpy().view(np.uint16)


def test_subset_covers_every_feature():
    from cpemu.truth import features_of

    feats = {f for r in SUBSET for f in features_of(r)}
    for f in ("out-bfloat16", "out-float16", "out-float32", "fast-accum", "promotion", "scale-unit",
              "scale-tensor", "scale-rowwise", "bias", "split-k", "e4m3xe5m2", "e5m2xe4m3", "data-nan", "evo2"):
        assert f in feats, f
    assert {r.get("splits", 1) for r in SUBSET} >= {1, 3, 4, 5, 6}
    assert any(r["bias"] and r["out_dtype"] == "float16" for r in SUBSET)
    assert any(r["scale"] == "rowwise" and r["bias"] for r in SUBSET)


@pytest.mark.parametrize("rec", SUBSET, ids=[r["id"] for r in SUBSET])
def test_dropin_matches_h200(rec):
    a, b, sa, sb, bias, out_dtype, fast = torch_inputs(rec)
    with ct.patch():
        y = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype, use_fast_accum=fast)
    assert y.dtype == out_dtype and y.device == a.device and list(y.shape) == rec["output_shape"]
    assert y.is_contiguous()
    assert sha256_arrays(out_bits(y)) == rec["output_sha256"], rec["id"]


def test_layout_rule_matches_torch():
    """c10's non-overlapping-and-dense test (which decides what ``_scaled_mm`` accepts): the
    drop-in's rank-2 shortcut agrees with its general form and, on every small non-empty 2-D
    layout, with torch's own Python version (``torch._prims_common``; for rank 3 that one sorts
    size-1 dimensions by stride, unlike c10, so it is no reference there)."""
    ref = getattr(torch._prims_common, "is_non_overlapping_and_dense_or_false", None)
    if ref is None:
        pytest.skip("this torch has no torch._prims_common.is_non_overlapping_and_dense_or_false")
    # torch's flag also holds for every contiguous tensor, which differs from c10's computed
    # rule only for empty ones; the drop-in returns before its layout test when M, N or K is 0
    base = torch.empty(512)
    for s0, s1, t0, t1 in itertools.product(range(4), range(4), range(8), range(8)):
        t = base.as_strided((s0, s1), (t0, t1))
        assert layout._dense_2d(s0, s1, t0, t1) == layout._dense_any([s0, s1], [t0, t1]), (s0, s1, t0, t1)
        if t.numel():
            assert layout._non_overlapping_and_dense(t) == bool(ref(t)), (s0, s1, t0, t1)


@pytest.mark.parametrize("sb_shape", [(), (1,), (1, 1), (1, 1, 1), (2,), (1, 32)])
def test_tensorwise_shortcut_is_the_joint_rule(sb_shape):
    """``_joint_scaling`` answers TensorWise x TensorWise without transposing; the outcome
    (the pair, or the exception with its message) is the one of ATen's loop over the pairs."""
    a = torch.zeros((16, 32), dtype=F8)
    b = torch.zeros((32, 32), dtype=F8).t().contiguous().t()
    sa, sb = torch.ones(()), torch.ones(sb_shape)

    def outcome(f):
        try:
            return f()
        except RuntimeError as e:
            return type(e), str(e).split("\n")[0]

    # the rule without the shortcut: ATen's loop over the pairs
    assert (outcome(lambda: scaling._joint_scaling(a, b, sa, sb))
            == outcome(lambda: scaling._joint_scaling_by_pairs(a, b, sa, sb)))


def test_dropin_positional_and_strided_operands():
    """Positional arguments; ``a`` a row slice of a wider matrix and ``b`` a column slice:
    non-dense operands torch accepts give the same bits as contiguous ones."""
    rec = next(r for r in SUBSET if r["scale"] == "rowwise" and r["bias"] and r["out_dtype"] == "bfloat16")
    a, b, sa, sb, bias, out_dtype, fast = torch_inputs(rec)
    M, K = a.shape
    wide_a = torch.zeros((M, K + 64), dtype=torch.uint8)
    wide_a[:, 32:32 + K] = a.view(torch.uint8)
    a2 = wide_a[:, 32:32 + K].view(a.dtype)
    wide_b = torch.zeros((b.shape[1] + 16, K + 32), dtype=torch.uint8)  # (N', K') row-major = column-major b
    wide_b[16:, :K] = b.t().view(torch.uint8)
    b2 = wide_b[16:, :K].view(b.dtype).t()
    assert not a2.is_contiguous() and b2.stride(0) == 1
    y = ct.scaled_mm(a2, b2, sa, sb, bias, None, out_dtype, fast)
    assert sha256_arrays(out_bits(y)) == rec["output_sha256"]


def test_numpy_views_do_not_copy():
    a = torch.zeros((16, 32), dtype=torch.uint8).view(F8)
    b = torch.zeros((16, 32), dtype=torch.uint8).view(F8).t()
    na, nb = convert._fp8_numpy(a), convert._fp8_numpy(b)
    assert na.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and nb.shape == (32, 16)
    assert na.__array_interface__["data"][0] == a.data_ptr()
    assert nb.__array_interface__["data"][0] == b.data_ptr() and nb.T.flags.c_contiguous


def test_recorded_rejections_raise_torchs_error():
    """Each distinct error of the manifest's rejected recordings, raised with torch's type and message."""
    seen = {}
    for rec in MANIFEST["cases"]:
        if "error" in rec:
            seen.setdefault(rec["error"], rec)
    assert len(seen) >= 2
    for err, rec in seen.items():
        a, b, sa, sb, bias, out_dtype, fast = torch_inputs(rec)
        with pytest.raises(Exception) as ei:
            ct.scaled_mm(a, b, sa, sb, bias, out_dtype=out_dtype, use_fast_accum=fast)
        assert f"{type(ei.value).__name__}: {ei.value}" == err


# --------------------------------------------------------------------------- argument checks (H200 probe-errors)

def A(M, K, dt=F8):
    return torch.zeros(M, K).to(dt)


def B(K, N, dt=F8):
    return torch.zeros(N, K).to(dt).t()


ONE = torch.ones(())
BF = torch.bfloat16

#: (name, call, exception type, message) -- messages as torch raised them on the H200; the
#: scaling message is long (its recorded form was truncated), so its start is compared.
BAD_CALLS = [
    ("K_not_mult16", lambda: ct.scaled_mm(A(16, 24), B(24, 16), ONE, ONE, out_dtype=BF), RuntimeError,
     "Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: (16x24)."),
    ("N_not_mult16", lambda: ct.scaled_mm(A(16, 32), B(32, 24), ONE, ONE, out_dtype=BF), RuntimeError,
     "mat2 shape (32x24) must be divisible by 16"),
    ("K_mismatch", lambda: ct.scaled_mm(A(16, 32), B(48, 16), ONE, ONE, out_dtype=BF), RuntimeError,
     "mat1 and mat2 shapes cannot be multiplied (16x32 and 48x16)"),
    ("b_row_major", lambda: ct.scaled_mm(A(16, 32), torch.zeros(32, 16).to(F8), ONE, ONE, out_dtype=BF),
     RuntimeError, "Only multiplication of row-major and column-major matrices is supported by cuBLASLt"),
    ("a_col_major", lambda: ct.scaled_mm(torch.zeros(32, 16).to(F8).t(), B(32, 16), ONE, ONE, out_dtype=BF),
     RuntimeError, "Only multiplication of row-major and column-major matrices is supported by cuBLASLt"),
    ("e5m2_e5m2", lambda: ct.scaled_mm(A(16, 32, F8B), B(32, 16, F8B), ONE, ONE, out_dtype=BF), ValueError,
     "Multiplication of two Float8_e5m2 matrices is not supported"),
    ("bias_fp32_out_bf16", lambda: ct.scaled_mm(A(16, 32), B(32, 16), ONE, ONE, bias=torch.zeros(16),
                                                out_dtype=BF),
     RuntimeError, "Bias must be BFloat16 or Half, but got Float"),
    ("bias_bf16_out_fp32", lambda: ct.scaled_mm(A(16, 32), B(32, 16), ONE, ONE,
                                                bias=torch.zeros(16, dtype=BF), out_dtype=torch.float32),
     RuntimeError, "Bias is not supported when out_dtype is set to Float32"),
    ("bias_fp16_out_bf16", lambda: ct.scaled_mm(A(16, 32), B(32, 16), ONE, ONE,
                                                bias=torch.zeros(16, dtype=torch.float16), out_dtype=BF),
     RuntimeError, "Bias must be BFloat16 to compute BFloat16 output, but got Half"),
    ("bias_wrong_len", lambda: ct.scaled_mm(A(16, 32), B(32, 16), ONE, ONE, bias=torch.zeros(32, dtype=BF),
                                            out_dtype=BF),
     RuntimeError, "Bias must be size 16 but got 32"),
    ("a_3d", lambda: ct.scaled_mm(torch.zeros(2, 16, 32).to(F8), B(32, 16), ONE, ONE, out_dtype=BF),
     RuntimeError, "mat1 must be a matrix"),
]

_SCALING = ("Invalid scaling configuration.\n"
            "- For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n"
            "- For RowWise scaling, a and b should be float8, scales should be float, scale_a should be (16, 1) "
            "and scale_b should be (1, 16), and both should be contiguous.\n")
BAD_SCALING = [
    ("scale_a_fp64", lambda: ct.scaled_mm(A(16, 32), B(32, 16), ONE.double(), ONE, out_dtype=BF)),
    ("scale_a_2elems", lambda: ct.scaled_mm(A(16, 32), B(32, 16), torch.ones(2), ONE, out_dtype=BF)),
    ("rowwise_only_a", lambda: ct.scaled_mm(A(16, 32), B(32, 16), torch.ones(16, 1), ONE, out_dtype=BF)),
    ("rowwise_wrong_shape", lambda: ct.scaled_mm(A(16, 32), B(32, 16), torch.ones(1, 16), torch.ones(16, 1),
                                                 out_dtype=BF)),
    ("a_bf16", lambda: ct.scaled_mm(A(16, 32, BF), B(32, 16), ONE, ONE, out_dtype=BF)),
]


@pytest.mark.parametrize("name,call,exc,msg", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_call_raises_like_torch(name, call, exc, msg):
    with pytest.raises(Exception) as ei:
        call()
    assert type(ei.value) is exc
    assert str(ei.value) == msg


@pytest.mark.parametrize("name,call", BAD_SCALING, ids=[c[0] for c in BAD_SCALING])
def test_bad_scaling_raises_like_torch(name, call):
    with pytest.raises(Exception) as ei:
        call()
    assert type(ei.value) is RuntimeError
    assert str(ei.value).startswith(_SCALING)
    assert "\nGot a.dtype()=" in str(ei.value)


def test_scaling_message_names_the_arguments():
    with pytest.raises(RuntimeError) as ei:
        ct.scaled_mm(A(16, 32), B(32, 16), ONE.double(), ONE, out_dtype=BF)
    assert str(ei.value).endswith(
        "Got a.dtype()=Float8_e4m3fn, scale_a.dtype()=Double, scale_a.size()=[], scale_a.stride()=[], "
        "b.dtype()=Float8_e4m3fn, scale_b.dtype()=Float, scale_b.size()=[] and scale_b.stride()=[]")


def test_device_mismatch_raises():
    """A scale on another device than the operands: the dispatcher's device check (the meta
    device stands in for CUDA here; with CUDA operands the message names cuda:0)."""
    with pytest.raises(RuntimeError, match="^Expected all tensors to be on the same device, but got scale_a is on "
                                           "cpu, different from other tensors on meta"):
        ct.scaled_mm(A(16, 32).to("meta"), B(32, 16).to("meta"), ONE, ONE.to("meta"), out_dtype=BF)


def test_calls_torch_accepts():
    y = ct.scaled_mm(A(0, 32), B(32, 16), ONE, ONE, out_dtype=BF)  # M = 0: empty result
    assert y.shape == (0, 16) and y.dtype == BF
    y = ct.scaled_mm(A(16, 32), B(32, 16), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.float32)
    assert y.shape == (16, 16) and y.dtype == torch.float32  # rowwise with fp32 output
    y = ct.scaled_mm(A(16, 32), B(32, 16), torch.ones(1), ONE, out_dtype=BF)  # 1-element 1-D scale
    assert y.shape == (16, 16)
    y = ct.scaled_mm(A(16, 32), B(32, 16), ONE, ONE, scale_result=ONE, out_dtype=BF)  # ignored for bf16 out
    assert y.shape == (16, 16)
    y = ct.scaled_mm(A(3, 32).to("meta"), B(32, 16).to("meta"), ONE.to("meta"), ONE.to("meta"), out_dtype=BF)
    assert y.shape == (3, 16) and y.device.type == "meta"  # shapes only


def test_accepted_by_torch_but_not_emulated():
    """FP8 output (also out_dtype=None: a's dtype) and non-finite scales: refused, never approximated."""
    for kw in ({}, {"out_dtype": F8}):
        with pytest.raises(cpemu.ProfileFeatureError, match="out_dtype"):
            ct.scaled_mm(A(16, 32), B(32, 16), ONE, ONE, **kw)
    with pytest.raises(cpemu.ProfileFeatureError, match="non-finite scale"):
        ct.scaled_mm(A(16, 32), B(32, 16), ONE * float("inf"), ONE, out_dtype=BF)
    with pytest.raises(cpemu.ProfileFeatureError, match="BlockWise1x128 x BlockWise1x128"):
        # 1x128 blocks on both sides: scale_a (M, K/128) outer-dim-major, scale_b (K/128, N)
        ct.scaled_mm(A(16, 256), B(256, 16), torch.ones(2, 16).t(), torch.ones(2, 16), out_dtype=BF)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fnuz"), reason="this torch has no fnuz dtypes")
def test_fnuz_operands_are_refused_naming_them():
    """torch accepts the fnuz FP8 types (AMD's); cpemu emulates NVIDIA's formats only."""
    with pytest.raises(cpemu.ProfileFeatureError, match=r"^mat1 dtype torch.float8_e4m3fnuz: .*float8_e4m3fn and"):
        ct.scaled_mm(torch.zeros(16, 32).to(torch.float8_e4m3fnuz), B(32, 16), ONE, ONE, out_dtype=BF)
    with pytest.raises(cpemu.ProfileFeatureError, match=r"^mat2 dtype torch.float8_e5m2fnuz"):
        ct.scaled_mm(A(16, 32), torch.zeros(16, 32).to(torch.float8_e5m2fnuz).t(), ONE, ONE, out_dtype=BF)


def test_memory_is_checked_before_zeros_and_operand_copies(monkeypatch):
    """K = 0 returns zeros (as torch does) only if they fit; an expanded (zero-stride) operand is
    copied on the host, so its copy counts before it is made."""
    import cpemu.memory as mem

    monkeypatch.setattr(mem, "available_bytes", lambda: 1 << 30)
    with pytest.raises(cpemu.OutputTooLarge, match=r"^out: the \(40000, 40000\) bfloat16 output needs 2\.98 GiB"):
        ct.scaled_mm(torch.empty(40000, 0, dtype=F8), torch.empty(40000, 0, dtype=F8).t(), ONE, ONE, out_dtype=BF)
    x = torch.zeros(1, 65536).to(F8).expand(16384, 65536)  # a 1 GiB copy of 64 KiB
    with pytest.raises(cpemu.OutputTooLarge, match=r"plus 1\.00 GiB of working memory and operand copies"):
        ct.scaled_mm(x, torch.zeros(16, 65536).to(F8).t(), ONE, ONE, out_dtype=BF)
    y = ct.scaled_mm(torch.zeros(1, 64).to(F8).expand(16, 64), B(64, 16), ONE, ONE, out_dtype=BF)
    assert y.shape == (16, 16) and not y.float().any()


def test_non_tensor_arguments_are_type_errors():
    with pytest.raises(TypeError, match="argument 'scale_a'"):
        ct.scaled_mm(A(16, 32), B(32, 16), 1.0, ONE, out_dtype=BF)
    with pytest.raises(TypeError, match="use_fast_accum"):
        ct.scaled_mm(A(16, 32), B(32, 16), ONE, ONE, out_dtype=BF, use_fast_accum=1)


# --------------------------------------------------------------------------- patch

def test_patch_restores_after_exception():
    original = torch._scaled_mm
    with pytest.raises(KeyError):
        with ct.patch():
            assert torch._scaled_mm is not original
            raise KeyError("inside the block")
    assert torch._scaled_mm is original


def test_patch_nested_and_reentrant():
    original = torch._scaled_mm
    outer, inner = ct.patch(), ct.patch(profile="hopper-h200-torch", backend="reference")
    with outer:
        f_outer = torch._scaled_mm
        assert f_outer.cpemu_profile == "hopper-h200-torch"
        with inner:
            assert torch._scaled_mm is not f_outer
            with pytest.raises(RuntimeError):
                with outer:  # the same object re-entered
                    raise RuntimeError("inside")
            assert torch._scaled_mm is not f_outer and torch._scaled_mm is not original
        assert torch._scaled_mm is f_outer
    assert torch._scaled_mm is original


def test_patch_as_decorator():
    original = torch._scaled_mm

    @ct.patch()
    def run():
        assert torch._scaled_mm is not original
        return torch._scaled_mm(A(16, 32), B(32, 16), ONE, ONE, out_dtype=BF)

    assert run().shape == (16, 16)
    assert torch._scaled_mm is original

    @ct.patch()
    def fails():
        torch._scaled_mm(A(16, 24), B(24, 16), ONE, ONE, out_dtype=BF)

    with pytest.raises(RuntimeError, match="divisible by 16"):
        fails()
    assert torch._scaled_mm is original


def test_patch_checks_the_profile_early():
    with pytest.raises(ValueError, match="unknown profile"):
        ct.patch(profile="no-such-gpu")


# --------------------------------------------------------------------------- FP8Linear

def test_quantize_e4m3_saturates_and_rounds_to_nearest_even():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(4000) * 100, [500.0, -1e9, 448.0, 464.0, 0.0, -0.0, 2.0 ** -12,
                                                            np.nan]]).astype(np.float32)
    scale = np.float32(1.7)
    q = ct.quantize_e4m3(torch.from_numpy(x), torch.tensor(scale))
    y = (x * scale).astype(np.float32)
    ref = np.clip(y, -448, 448).astype(ml_dtypes.float8_e4m3fn)  # ml_dtypes: RNE
    assert np.array_equal(q.view(torch.uint8).numpy(), ref.view(np.uint8))


def test_delayed_scaling_scale():
    assert ct.delayed_scaling_scale(torch.tensor(2.0)).item() == 224.0
    assert ct.delayed_scaling_scale(torch.tensor(2.0), margin=1).item() == 112.0
    assert ct.delayed_scaling_scale(torch.tensor(0.0)).item() == 1.0
    assert ct.delayed_scaling_scale(torch.tensor(float("inf"))).item() == 1.0


def _small_layer(seed=0, N=48, K=64):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
    x = (torch.randn(2, 5, K, generator=g) * 2).to(torch.bfloat16)
    return w, x


def test_fp8linear_forward_is_the_padded_scaled_mm():
    w, x = _small_layer()
    layer = ct.FP8Linear.from_weight(w, input_amax=x.abs().max().float())
    y = layer(x)
    assert y.shape == (2, 5, 48) and y.dtype == torch.bfloat16
    q = layer.quantize_input(x.reshape(10, 64))
    pad = torch.zeros((16, 64), dtype=torch.uint8)
    pad[:10] = q.view(torch.uint8)
    ref = ct.scaled_mm(pad.view(F8), layer.weight.t(), layer.input_scale_inv, layer.weight_scale_inv,
                       out_dtype=torch.bfloat16, use_fast_accum=True)[:10]
    assert torch.equal(y.reshape(10, 48).view(torch.int16), ref.view(torch.int16))
    # rows are independent: one token alone gives the same bits as in the batch
    assert torch.equal(layer(x[1, 2]).view(torch.int16), y[1, 2].view(torch.int16))
    # the weight was quantised with TE's delayed scaling from its amax
    w_scale = ct.delayed_scaling_scale(w.abs().max().float())
    assert torch.equal(layer.weight.view(torch.uint8), ct.quantize_e4m3(w, w_scale).view(torch.uint8))
    assert layer.weight_scale_inv.item() == torch.reciprocal(w_scale).item()


def test_fp8linear_from_fp8_and_state_dict():
    w, x = _small_layer(1)
    a = ct.FP8Linear.from_weight(w, input_scale=torch.tensor(4.0))
    b = ct.FP8Linear.from_fp8(a.weight.clone(), a.weight_scale_inv.clone(), input_scale=4.0)
    assert torch.equal(a(x).view(torch.int16), b(x).view(torch.int16))
    c = ct.FP8Linear.from_fp8(torch.zeros_like(a.weight), torch.tensor(1.0), input_scale=1.0)
    c.load_state_dict(a.state_dict())
    assert torch.equal(a(x).view(torch.int16), c(x).view(torch.int16))
    assert "in_features=64, out_features=48" in repr(a)
    with pytest.raises(ValueError, match="in_features"):
        a(torch.zeros(3, 65, dtype=torch.bfloat16))


# --------------------------------------------------------------------------- import safety and the example

def test_import_cpemu_does_not_import_torch():
    code = "import sys, cpemu; assert 'torch' not in sys.modules, 'cpemu imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_example_script_prints_match():
    script = os.path.join(ROOT, "examples", "evo2_projection.py")
    r = subprocess.run([sys.executable, script, "--tokens", "3"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("MATCH") >= 1 and "MISMATCH" not in r.stdout, r.stdout


def test_tensor_core_decision_is_cached_per_signature(monkeypatch):
    """The drop-in decides once per call signature whether the tensor-core path takes a call
    (ladder, profile features, plan, prepared signature); what the profile refuses raises on
    every call, and another profile object is a different signature."""
    from cpemu import backends
    from cpemu.cuda import tensorcore as tc
    from cpemu.profile import get_profile

    calls = []

    def select(backend, prof, exclude=()):
        calls.append(("select", prof.name))
        return "cublaslt-tc"

    def signature(device, call):
        calls.append(("signature", call.M, call.N, call.K))
        if call.K == 48:  # K = 48: declined by the path
            raise tc.TensorCoreUnsupported("declined")
        return ("sig", call.M, call.N, call.K)

    monkeypatch.setattr(backends, "select", select)
    monkeypatch.setattr(tc, "signature", signature)
    monkeypatch.setattr(routes, "_tc_signatures", {})
    prof = get_profile(ct.DEFAULT_PROFILE)
    args = ("auto", 0, 16, 64, 32, "e4m3", "e4m3", "bfloat16", "tensorwise", None, True)
    first = routes._tc_signature(prof, *args)
    assert first == ("sig", 16, 64, 32)
    assert routes._tc_signature(prof, *args) is first
    assert calls == [("select", prof.name), ("signature", 16, 64, 32)]
    # a declined call is remembered as declined
    declined = args[:4] + (48,) + args[5:]
    assert routes._tc_signature(prof, *declined) is None
    assert routes._tc_signature(prof, *declined) is None
    assert len(calls) == 4
    # a feature the profile refuses (bias with fp32 output) raises on every call
    refused = args[:7] + ("float32",) + args[8:9] + ("bfloat16",) + args[10:]
    for _ in range(2):
        with pytest.raises(cpemu.ProfileFeatureError, match="bias"):
            routes._tc_signature(prof, *refused)
    assert len(calls) == 6
    # an equal profile object loaded again is its own signature
    other = dataclasses.replace(prof)
    assert other is not prof
    assert routes._tc_signature(other, *args) == first
    assert len(calls) == 8
