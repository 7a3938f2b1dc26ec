"""``cpemu.torch.dispatch``: cpemu's aten::_scaled_mm kernels in torch's dispatcher, for a block.

* Inside the block, ``torch.ops.aten._scaled_mm``, ``torch._scaled_mm`` (also with ``out=``),
  ``torch.nn.functional.scaled_mm`` (``_scaled_mm_v2``, tensorwise and rowwise) and
  torch.compile'd functions return ``cpemu.gemm``'s bits on the same operands (integer views).
* Outside it torch's own CPU kernel runs: on an Evo 2 1B projection (M = 16) its bits differ
  from the H200's (about 19 % of the outputs), so the test can tell the two apart.
* torchao 0.18's Float8Linear (tensorwise and rowwise), eager and under torch.compile inside
  the block: equal to ``cpemu.gemm`` on the operands it passed (recorded in eager mode).
* Blocks nest; a function compiled before the block reaches cpemu's kernel when run inside.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cpemu  # noqa: E402
import cpemu.torch as ct  # noqa: E402

F = torch.nn.functional
_ML = {torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn, torch.float8_e5m2: ml_dtypes.float8_e5m2}
_OUT = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _codes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy().view(_ML[t.dtype])


def _reference(a, b, scale_a, scale_b, out_dtype, fast_accum, profile="hopper-h200-torch", bias=None):
    """cpemu.gemm (numpy reference) on a torch._scaled_mm call's operands; int16/int32 bits."""
    sa, sb = scale_a.float().numpy(), scale_b.float().numpy()
    if sa.size == 1 and sb.size == 1:
        sa, sb = np.float32(sa.reshape(())), np.float32(sb.reshape(()))
    bias_np = None if bias is None else bias.float().numpy().astype(ml_dtypes.bfloat16)
    y = cpemu.gemm(_codes(a), _codes(b.t()).T, profile=profile, scale_a=sa, scale_b=sb, bias=bias_np,
                   out_dtype=_OUT[out_dtype], fast_accum=fast_accum, backend="reference")
    y = np.asarray(y)
    return y.view(np.int32 if out_dtype == torch.float32 else np.int16)


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16).numpy()


@pytest.fixture(scope="module")
def evo2_1b():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 1920, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(5760, 1920, generator=g).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    return a, w, one, _reference(a, w.t(), one, one, torch.bfloat16, True)


def _mm(a, w, one, **kw):
    return torch._scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, **kw)


def test_outside_torch_runs_its_own_kernel(evo2_1b):
    a, w, one, ref = evo2_1b
    native = _bits(_mm(a, w, one))
    assert 0.1 < (native != ref).mean() < 0.3  # torch 2.13's CPU kernel: other bits
    with ct.dispatch():
        assert np.array_equal(_bits(_mm(a, w, one)), ref)
    assert np.array_equal(_bits(_mm(a, w, one)), native)  # unregistered on exit


def test_every_entry_reaches_cpemu(evo2_1b):
    a, w, one, ref = evo2_1b
    with ct.dispatch(profile="hopper-h200-torch"):
        assert np.array_equal(_bits(torch.ops.aten._scaled_mm(a, w.t(), one, one, None, None, torch.bfloat16,
                                                              True)), ref)
        out = torch.empty(16, 5760, dtype=torch.bfloat16)
        _mm(a, w, one, out=out)
        assert np.array_equal(_bits(out), ref)
        y = F.scaled_mm(a, w.t(), one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise,
                        output_dtype=torch.bfloat16, use_fast_accum=True)
        assert np.array_equal(_bits(y), ref)


def test_rowwise_v2_and_refused_recipes():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(32, 256, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(128, 256, generator=g).to(torch.float8_e4m3fn)
    sa = torch.rand(32, 1, generator=g) + 0.5
    sb = torch.rand(1, 128, generator=g) + 0.5
    ref = _reference(a, w.t(), sa, sb, torch.bfloat16, False)
    with ct.dispatch():
        y = F.scaled_mm(a, w.t(), sa, F.ScalingType.RowWise, sb, F.ScalingType.RowWise,
                        output_dtype=torch.bfloat16)
        assert np.array_equal(_bits(y), ref)
        y1 = torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16)
        assert np.array_equal(_bits(y1), ref)
        with pytest.raises(cpemu.ProfileFeatureError, match="swizzle_a"):
            torch.ops.aten._scaled_mm_v2(a, w.t(), [sa], [1], [1], [sb], [1], [0], None, torch.bfloat16)
        with pytest.raises(cpemu.ProfileFeatureError, match="scale_a"):
            torch.ops.aten._scaled_mm_v2(a, w.t(), [sa], [4], [], [sb], [1], [], None, torch.bfloat16)


def test_v2_recipes_must_match_the_scale_shapes():
    """The drop-in reads tensorwise or rowwise off the scales' shapes; under _scaled_mm_v2 the
    recipe says it, and a disagreement is refused as torch refuses it (never computed as the
    other recipe). Rowwise with one-element scales (M = 1) is not emulated."""
    a = torch.zeros(16, 32).to(torch.float8_e4m3fn)
    w = torch.zeros(16, 32).to(torch.float8_e4m3fn)
    v2 = torch.ops.aten._scaled_mm_v2
    one = torch.ones(())
    with ct.dispatch():
        with pytest.raises(RuntimeError, match=r"^scale_a must have 1 Float element for TensorWise scaling"):
            v2(a, w.t(), [torch.ones(16, 1)], [0], [0], [torch.ones(1, 16)], [0], [0], None, torch.bfloat16)
        with pytest.raises(RuntimeError, match=r"^scale_a must have shape \(16, 1\) for RowWise scaling"):
            v2(a, w.t(), [one], [1], [0], [one], [1], [0], None, torch.bfloat16)
        with pytest.raises(cpemu.ProfileFeatureError, match=r"^scale_a: a RowWise recipe with one-element scales"):
            v2(a[:1], w.t(), [torch.ones(1, 1)], [1], [0], [torch.ones(1, 16)], [1], [0], None, torch.bfloat16)
        assert v2(a, w.t(), [one], [0], [0], [one], [0], [0], None, torch.bfloat16).shape == (16, 16)


def test_nested_profiles_and_bad_arguments(evo2_1b):
    a, w, one, ref = evo2_1b
    ada = _reference(a, w.t(), one, one, torch.bfloat16, True, profile="ada-rtx4060-torch")
    assert not np.array_equal(ada, ref)
    with ct.dispatch():
        with ct.dispatch(profile="ada-rtx4060-torch"):
            assert np.array_equal(_bits(_mm(a, w, one)), ada)
        assert np.array_equal(_bits(_mm(a, w, one)), ref)
    with pytest.raises(ValueError, match="profile"):
        ct.dispatch(profile="no-such-gpu")
    with pytest.raises(ValueError, match="keys"):
        ct.dispatch(keys=("XLA",))


def test_compiled_functions(evo2_1b):
    a, w, one, ref = evo2_1b
    compiled = torch.compile(lambda a, w: _mm(a, w, one))
    native = _bits(compiled(a, w))
    assert not np.array_equal(native, ref)
    with ct.dispatch():
        assert np.array_equal(_bits(compiled(a, w)), ref)  # compiled before the block: its code calls the op
        fresh = torch.compile(lambda a, w: F.scaled_mm(a, w.t(), one, F.ScalingType.TensorWise, one,
                                                        F.ScalingType.TensorWise, output_dtype=torch.bfloat16,
                                                        use_fast_accum=True))
        assert np.array_equal(_bits(fresh(a, w)), ref)


# --- torchao ----------------------------------------------------------------------------

class _Record:
    """Records the operands of every ``torch._scaled_mm`` call (torchao's eager path looks the
    attribute up), then calls the op."""

    def __init__(self, monkeypatch):
        self.calls = []
        op = torch._scaled_mm
        names = ("a", "b", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")

        def recording(*args, **kwargs):
            call = dict(zip(names, args), **kwargs)
            self.calls.append({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                               for k, v in call.items()})
            return op(*args, **kwargs)

        monkeypatch.setattr(torch, "_scaled_mm", recording)


def _float8_model(recipe: str):
    pytest.importorskip("torchao", reason="torchao is not installed: pip install -e '.[evo2]'")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False)).to(torch.bfloat16)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    assert type(model[0]).__name__ == "Float8Linear"
    return model


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_float8linear_eager_and_compiled(recipe, monkeypatch):
    model = _float8_model(recipe)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        with ct.dispatch():
            compiled = torch.compile(model)(x)
            with monkeypatch.context() as mp:
                rec = _Record(mp)
                eager = model(x)
        native = model(x)
    assert len(rec.calls) == 1
    c = rec.calls[0]
    ref = _reference(c["a"], c["b"], c["scale_a"], c["scale_b"], c["out_dtype"], bool(c["use_fast_accum"]),
                     bias=c.get("bias"))
    assert np.array_equal(_bits(eager), ref)
    assert np.array_equal(_bits(compiled), ref)
    assert not np.array_equal(_bits(native), ref)  # outside the block: torch's own kernel


def test_fake_tensors_trace_inside_the_block():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with ct.dispatch(), FakeTensorMode():
        a = torch.empty(48, 64, dtype=torch.float8_e4m3fn)
        w = torch.empty(32, 64, dtype=torch.float8_e4m3fn)
        one = torch.ones(())
        y = torch._scaled_mm(a, w.t(), one, one, out_dtype=torch.float32)
        assert y.shape == (48, 32) and y.dtype == torch.float32
