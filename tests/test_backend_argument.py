"""``backend=`` is checked where it is given (FP8Linear, patch, dispatch, the Evo 2 swap), with the
message the first GEMM would give, not at that GEMM. Skipped without torch (a CPU build is enough)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cpemu.torch as ct  # noqa: E402
from cpemu import backends  # noqa: E402
from cpemu.evo2 import swap_fp8_projections  # noqa: E402

W8 = torch.zeros(32, 64).to(torch.float8_e4m3fn)
#: names the first GEMM refuses here: not a backend's, and the backends that cannot run on this machine
BAD = ["cuda", "", None, 5] + [n for n in backends.LADDER if not backends.available(n)[0]]


def _first_gemm_message(backend) -> str:
    a = torch.zeros(16, 64).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32)
    with pytest.raises(backends.BackendUnavailable) as e:
        ct.scaled_mm(a, W8.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, backend=backend)
    return str(e.value)


ENTRIES = {
    "FP8Linear": lambda b: ct.FP8Linear(W8, 1.0, 1.0, backend=b),
    "FP8Linear.from_weight": lambda b: ct.FP8Linear.from_weight(torch.randn(32, 64), input_amax=3.0, backend=b),
    "FP8Linear.from_fp8": lambda b: ct.FP8Linear.from_fp8(W8, 1.0, input_scale=1.0, backend=b),
    "patch": lambda b: ct.patch(backend=b),
    "dispatch": lambda b: ct.dispatch(backend=b),
    "swap_fp8_projections": lambda b: swap_fp8_projections(torch.nn.Linear(64, 32), {}, backend=b, dry_run=True),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("backend", BAD, ids=repr)
def test_bad_backend_is_refused_where_it_is_given(entry, backend):
    want = _first_gemm_message(backend)
    assert want.startswith("backend: ")
    with pytest.raises(backends.BackendUnavailable) as e:
        ENTRIES[entry](backend)
    assert str(e.value) == want


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_good_backends_are_taken(entry, backend):
    ENTRIES[entry](backend)


def test_patch_takes_nothing_over_on_a_bad_backend():
    before = torch._scaled_mm
    with pytest.raises(backends.BackendUnavailable):
        with ct.patch(backend="cuda"):
            pass
    assert torch._scaled_mm is before
