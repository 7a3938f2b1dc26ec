"""On a GPU: the tiny vortex model's FP8 projections under cpemu.torch.dispatch equal native torch._scaled_mm.

The projections of a tiny random-weight StripedHyena 2 (tests/evo2_fixtures.py) are swapped
for cpemu's TEProjection and moved to the GPU. Each projection's GEMM is then run twice on
the same quantised CUDA operands: natively (torch's own kernel) and inside
``cpemu.torch.dispatch()`` (cpemu's kernel for aten::_scaled_mm). On the profile's own GPU
(an H200 for the default profile) the bits must be equal. Also the Evo 2 projection shapes
at M = 16 and 2048 through FP8Linear on CUDA against native. Skipped without CUDA or vtx.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs torch")
pytestmark = pytest.mark.gpu

needs_h200 = pytest.mark.skipif(not torch.cuda.is_available() or "H200" not in torch.cuda.get_device_name(0),
                                reason="needs the default profile's GPU (an H200) visible to torch")


def _native_and_emulated(q, lin):
    args = (q, lin.weight.t(), lin.input_scale_inv, lin.weight_scale_inv)
    kw = dict(out_dtype=torch.bfloat16, use_fast_accum=True)
    import cpemu.torch as ct
    native = torch._scaled_mm(*args, **kw)
    with ct.dispatch():
        emulated = torch._scaled_mm(*args, **kw)
    torch.cuda.synchronize()
    return native, emulated


@needs_h200
def test_tiny_model_projections_equal_native():
    pytest.importorskip("vortex", reason="vortex (PyPI vtx) is not installed")
    import cpemu.evo2 as ce
    from evo2_fixtures import tiny_checkpoint

    model = ce.tiny_model()
    ce.swap_fp8_projections(model, tiny_checkpoint(model))
    g = torch.Generator().manual_seed(4)
    for i in range(4):
        lin = model.blocks[i].projections.linear.to("cuda")
        x = torch.randn(2 * 32, lin.in_features, generator=g).to(torch.bfloat16).cuda()
        native, emulated = _native_and_emulated(lin.quantize_input(x), lin)
        assert torch.equal(native.view(torch.int16), emulated.view(torch.int16)), i


@needs_h200
@pytest.mark.parametrize("N, K", [(5760, 1920), (12288, 4096), (24576, 8192)])
@pytest.mark.parametrize("M", [16, 2048])
def test_evo2_shapes_under_dispatch_equal_native(M, N, K):
    from cpemu.torch import FP8Linear

    g = torch.Generator().manual_seed(M + N)
    lin = FP8Linear.from_weight(torch.randn(N, K, generator=g) * 0.05, input_amax=4.0).to("cuda")
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).cuda()
    native, emulated = _native_and_emulated(lin.quantize_input(x), lin)
    assert torch.equal(native.view(torch.int16), emulated.view(torch.int16))
