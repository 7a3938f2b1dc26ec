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
