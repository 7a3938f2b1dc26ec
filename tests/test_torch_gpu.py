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


def _needs_hopper():
    pytest.importorskip("cupy", reason="needs cupy")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU visible to torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("compares with the device's own torch._scaled_mm: needs a Hopper GPU (the default profile's)")


def _evo2_1b_operands(M: int, seed: int = 5):
    g = torch.Generator(device="cpu").manual_seed(seed)
    N, K = 5760, 1920
    a = (torch.randn(M, K, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn).cuda()
    w = (torch.randn(N, K, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn).cuda()
    return a, w, g


def _rowwise_case(M: int, seed: int, fast_accum: bool):
    """Evo 2 1B operands with rowwise scales, and torch's bf16 result for them."""
    a, w, g = _evo2_1b_operands(M, seed=seed)
    sa = (torch.rand(M, 1, generator=g) + 0.5).cuda()
    sb = (torch.rand(1, w.shape[0], generator=g) + 0.5).cuda()
    want = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
    return a, w, sa, sb, want


def _at_offset(a, offset: int):
    """A copy of FP8 matrix ``a`` that starts ``offset`` bytes into its allocation."""
    shifted = torch.empty(a.numel() + offset, dtype=torch.uint8, device="cuda")
    moved = shifted[offset:].view(a.shape)
    moved.copy_(a.view(torch.uint8))
    return moved.view(a.dtype)


def _same_bits(got, want):
    assert got.device == want.device and got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
    ib = torch.int32 if want.dtype == torch.float32 else torch.int16
    diff = int((got.view(ib) != want.view(ib)).sum())
    assert diff == 0, f"{diff} of {want.numel()} outputs differ"


@pytest.mark.parametrize("backend", ["auto", "cuda-tiled"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("side_stream", [False, True])
def test_cuda_operands_stay_on_the_device(monkeypatch, out_dtype, side_stream, backend):
    """CUDA operands are handed to the CUDA backends in place (never copied to the host),
    on torch's current stream, and give torch's bits (an Evo 2 1B projection, M = 64).
    ``auto`` on a Hopper GPU must take the pointer path to the tensor cores, ``cuda-tiled``
    the exact-kernel route; neither reads a scale or the bias on the host before the GEMM is
    queued, nor takes the general route."""
    _needs_hopper()
    import cpemu.torch as ct
    from cpemu.torch import convert, routes

    M, N = 64, 5760
    a, w, g = _evo2_1b_operands(M)
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
    bias = None if out_dtype == "float32" else (torch.randn(N, generator=g) * 100).to(getattr(torch, out_dtype)).cuda()
    odt = getattr(torch, out_dtype)
    want = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=odt, use_fast_accum=True)

    def no_host_copy(t):
        raise AssertionError("an FP8 operand was copied to the host")

    def not_this_route(*args, **kw):
        raise AssertionError("backend 'auto' on a Hopper GPU left the pointer path to the tensor cores")

    def no_host_read(t):
        raise AssertionError("a scale or the bias was read on the host before the GEMM was queued")

    monkeypatch.setattr(routes, "_fp8_numpy", no_host_copy)
    monkeypatch.setattr(routes, "_host_numpy", no_host_read)
    monkeypatch.setattr(convert, "_host_numpy", no_host_read)
    monkeypatch.setattr(routes, "_gemm_on_device", not_this_route)
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = ct.scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=odt, use_fast_accum=True, backend=backend)
    stream.synchronize()
    _same_bits(got, want)


@pytest.mark.parametrize("fast_accum", [True, False])
def test_tensor_core_pointer_path_rowwise_and_padded_operands(monkeypatch, fast_accum):
    """The pointer path with rowwise scales, a padded leading dimension of ``a`` (made dense
    first) and an operand at an offset that is not 256-byte aligned (declined: the cupy
    route copies it): torch's bits in each case."""
    _needs_hopper()
    import cpemu.torch as ct
    from cpemu.torch import routes

    M = 48
    a, w, sa, sb, want = _rowwise_case(M, 6, fast_accum)
    _same_bits(ct.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum), want)

    padded = torch.zeros(M, a.shape[1] + 64, dtype=torch.uint8, device="cuda")
    padded[:, :a.shape[1]] = a.view(torch.uint8)
    a_pad = padded.view(torch.float8_e4m3fn)[:, :a.shape[1]]
    assert a_pad.stride(0) != a.shape[1]
    _same_bits(ct.scaled_mm(a_pad, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum), want)

    a_off = _at_offset(a, 16)
    assert a_off.data_ptr() % 256
    calls = []
    original = routes._gemm_on_device
    monkeypatch.setattr(routes, "_gemm_on_device", lambda *x, **k: calls.append(1) or original(*x, **k))
    _same_bits(ct.scaled_mm(a_off, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum), want)
    assert calls == [1], "an unaligned operand must leave the pointer path"


@pytest.mark.parametrize("backend", ["auto", "cuda-tiled"])
@pytest.mark.parametrize("bad", ["inf_a", "nan_b", "ninf_a", "rowwise_nan"])
def test_tensor_core_pointer_path_refuses_non_finite_scales(bad, backend):
    """A non-finite scale is refused on the pointer path and on the exact-kernel route too (it
    is checked after the GEMM is queued, before the result would be returned), and the next
    call is unaffected."""
    _needs_hopper()
    import cpemu
    import cpemu.torch as ct

    M, N = 32, 5760
    a, w, _ = _evo2_1b_operands(M, seed=7)
    one = torch.ones((), device="cuda")
    if bad == "rowwise_nan":
        sa, sb = torch.ones(M, 1, device="cuda"), torch.ones(1, N, device="cuda")
        sb[0, N - 1] = float("nan")
    else:
        value = {"inf_a": float("inf"), "nan_b": float("nan"), "ninf_a": float("-inf")}[bad]
        sa = one * value if bad.endswith("_a") else one.clone()
        sb = one * value if bad.endswith("_b") else one.clone()
    with pytest.raises(cpemu.ProfileFeatureError, match="non-finite scale"):
        ct.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True, backend=backend)
    want = torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)
    _same_bits(ct.scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, backend=backend),
               want)


@pytest.mark.parametrize("fast_accum", [True, False])
def test_exact_kernel_route_rowwise_and_unaligned_operand(monkeypatch, fast_accum):
    """``cuda-tiled`` through the drop-in with rowwise scales, with and without fast
    accumulation, and with an operand at an offset the kernel cannot load from (copied by
    the kernel's wrapper): torch's bits, and the exact-kernel route in each case."""
    _needs_hopper()
    import cpemu.torch as ct
    from cpemu.torch import routes

    a, w, sa, sb, want = _rowwise_case(48, 8, fast_accum)
    calls = []
    original = routes._exact_kernel_call
    monkeypatch.setattr(routes, "_exact_kernel_call", lambda *x, **k: calls.append(1) or original(*x, **k))
    _same_bits(ct.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum,
                            backend="cuda-tiled"), want)
    a_off = _at_offset(a, 8)
    assert a_off.data_ptr() % 16
    _same_bits(ct.scaled_mm(a_off, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum,
                            backend="cuda-tiled"), want)
    assert calls == [1, 1]


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_ada_profile_pointer_path_equals_the_exact_kernel(monkeypatch, out_dtype):
    """The Ada profile on a Hopper GPU through the pointer path (operands zero-padded on the
    device, then the tensor cores) gives the bits of the exact CUDA-core kernel (cupy route),
    which does not use tensor cores; an Evo 2 1B projection, M = 40, unit and non-unit scales."""
    _needs_hopper()
    import cpemu.torch as ct
    from cpemu.torch import routes

    M, N = 40, 5760
    a, w, g = _evo2_1b_operands(M, seed=8)
    odt = getattr(torch, out_dtype)
    bias = None if out_dtype == "float32" else (torch.randn(N, generator=g) * 100).to(odt).cuda()
    for sa, sb in ((1.0, 1.0), (0.375, 3.0)):
        sa, sb = torch.tensor(sa, device="cuda"), torch.tensor(sb, device="cuda")
        want = ct.scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=odt, use_fast_accum=True,
                            profile="ada-rtx4060-torch", backend="cuda-tiled")
        with monkeypatch.context() as mp:
            mp.setattr(routes, "_gemm_on_device", lambda *x, **k: (_ for _ in ()).throw(
                AssertionError("the Ada profile on a Hopper GPU left the pointer path")))
            got = ct.scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=odt, use_fast_accum=True,
                               profile="ada-rtx4060-torch")
        torch.cuda.synchronize()
        _same_bits(got, want)
