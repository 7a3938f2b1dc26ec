"""cpemu.torch.scaled_mm against the real torch._scaled_mm on a CUDA GPU (run on the device).

For every call of the recorder's malformed-call list (cpemu.recording.truth_recorder), the
emulated call must raise the same exception type with the same message as torch, or, where
torch accepts the call, return the same bits. Two documented refusals are allowed: FP8
output and non-finite scales (cpemu.ProfileFeatureError).
"""

import pytest

torch = pytest.importorskip("torch", reason="needs torch")
pytestmark = pytest.mark.gpu

ALLOWED_REFUSALS = {"out_fp8", "scale_inf"}


def _outcome(thunk):
    try:
        y = thunk()
        torch.cuda.synchronize()
        return ("ok", y)
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return ("raise", e)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU visible to torch")
def test_argument_checks_and_results_match_torch_on_cuda():
    import cpemu
    import cpemu.torch as ct
    from cpemu.recording import truth_recorder as tr

    tr.DEVICE = "cuda"
    real = tr._bad_calls()
    with ct.patch():
        emulated = tr._bad_calls()
        outcomes = [(name, _outcome(f_real), _outcome(f_emu)) for (name, f_real), (_, f_emu) in zip(real, emulated)]
    compared = 0
    for name, (kr, vr), (ke, ve) in outcomes:
        if name in ALLOWED_REFUSALS and ke == "raise":
            assert isinstance(ve, cpemu.ProfileFeatureError), (name, ve)
            continue
        assert kr == ke, (name, vr, ve)
        if kr == "raise":
            assert type(vr) is type(ve) and str(vr).split("\n")[0] == str(ve).split("\n")[0], (name, str(vr), str(ve))
        else:
            assert vr.dtype == ve.dtype and vr.shape == ve.shape and vr.device == ve.device, name
            ib = torch.int32 if vr.dtype == torch.float32 else torch.int16
            assert torch.equal(vr.contiguous().view(ib), ve.contiguous().view(ib)), name
        compared += 1
    assert compared >= 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU visible to torch")
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("side_stream", [False, True])
def test_cuda_operands_stay_on_the_device(monkeypatch, out_dtype, side_stream):
    """CUDA operands are handed to the CUDA backends in place (never copied to the host),
    on torch's current stream, and give torch's bits (an Evo 2 1B projection, M = 64)."""
    pytest.importorskip("cupy", reason="needs cupy")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("compares with the device's own torch._scaled_mm: needs a Hopper GPU (the default profile's)")
    import cpemu.torch as ct

    g = torch.Generator(device="cpu").manual_seed(5)
    M, N, K = 64, 5760, 1920
    a = (torch.randn(M, K, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn).cuda()
    w = (torch.randn(N, K, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn).cuda()
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
    bias = None if out_dtype == "float32" else (torch.randn(N, generator=g) * 100).to(getattr(torch, out_dtype)).cuda()
    odt = getattr(torch, out_dtype)
    want = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=odt, use_fast_accum=True)

    def no_host_copy(t):
        raise AssertionError("an FP8 operand was copied to the host")

    monkeypatch.setattr(ct, "_fp8_numpy", no_host_copy)
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = ct.scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=odt, use_fast_accum=True)
    stream.synchronize()
    assert got.device == a.device and got.dtype == odt and got.shape == (M, N) and got.is_contiguous()
    ib = torch.int32 if odt == torch.float32 else torch.int16
    assert torch.equal(got.view(ib), want.view(ib))
