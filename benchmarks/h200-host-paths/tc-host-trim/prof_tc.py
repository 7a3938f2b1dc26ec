"""Host time of the cublaslt-tc call (gemm_cuda), broken down."""
import cProfile, io, pstats, sys, time
import numpy as np, cupy as cp
sys.path.insert(0, ".")
from cpemu.cases import Case, operands
from cpemu.profile import get_profile
from cpemu.cuda import kernels, tensorcore as tc

prof = get_profile("hopper-h200-torch")
N, K = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "5760x1920").split("x"))
MS = tuple(int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "16,2048").split(","))
stream = cp.cuda.Stream(non_blocking=True)
def per_call(f, n=3000):
    f()
    stream.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    t1 = time.perf_counter()
    stream.synchronize()
    return (t1 - t) / n * 1e6
with stream:
    for M in MS:
        a, bt, *_ = operands(Case(M, N, K, data="gauss40", seed=1))
        ad, btd = cp.asarray(a), cp.asarray(bt)
        plan = prof.plan(M, N, K, True)
        mode = prof.mode("tensorwise")
        one = np.float32(1)
        sa_d = cp.ones(1, cp.float32); sb_d = cp.ones(1, cp.float32)
        call = lambda: kernels.gemm_cuda("cublaslt-tc", ad, btd, "e4m3", "e4m3", plan, prof.instruction, mode, one, one,
                                         None, "bfloat16")
        call_dev = lambda: kernels.gemm_cuda("cublaslt-tc", ad, btd, "e4m3", "e4m3", plan, prof.instruction, mode,
                                             sa_d, sb_d, None, "bfloat16")
        print(f"M={M}: gemm_cuda tc, host scalars: {per_call(call):.1f} us/call; device scales: {per_call(call_dev):.1f}")
        tc_call = lambda: tc.gemm_tc(ad, btd, "e4m3", "e4m3", plan, prof.instruction, mode, one, one, None, "bfloat16", True)
        print(f"  gemm_tc alone: {per_call(tc_call):.1f}")
        sig = tc.signature(0, M, N, K, "e4m3", "e4m3", plan, prof.instruction, mode, "tensorwise", False, "bfloat16", True)
        out = cp.empty((M, N), cp.uint16)
        s = stream.ptr
        ptrs = (ad.data.ptr, btd.data.ptr, out.data.ptr, sa_d.data.ptr, sb_d.data.ptr)
        print(f"  launch alone (fixed pointers): {per_call(lambda: tc.launch(sig, 0, s, *ptrs, None)):.1f}")
        print(f"  signature lookup: {per_call(lambda: tc.signature(0, M, N, K, 'e4m3', 'e4m3', plan, prof.instruction, mode, 'tensorwise', False, 'bfloat16', True)):.2f}")
        print(f"  _static_config: {per_call(lambda: kernels._static_config('e4m3', 'e4m3', plan, prof.instruction, K, 'acc*(sa*sb)', 'bfloat16', None)):.2f}")
        print(f"  cupy.empty: {per_call(lambda: cp.empty((M, N), cp.uint16)):.2f}")
        print(f"  _codes x2: {per_call(lambda: (kernels._codes(ad, 'a', cp, None), kernels._codes(btd, 'b', cp, 0))):.2f}")
        print(f"  _scale host: {per_call(lambda: tc._scale(one, 'scale_a', cp, 0, 1, 'x')):.2f}")
        print(f"  get_current_stream().ptr: {per_call(lambda: cp.cuda.get_current_stream().ptr):.2f}")
        print(f"  runtime.getDevice: {per_call(lambda: cp.cuda.runtime.getDevice()):.2f}")
        print(f"  a.device.id: {per_call(lambda: ad.device.id):.2f}; a.data.ptr: {per_call(lambda: ad.data.ptr):.2f}")
        lt = tc._lt(); m = sig.prep.made; h = tc._state["handles"][0]
        wsp = tc._workspace_ptr(0, s, sig.prep.workspace) if sig.prep.workspace else 0
        raw = lambda: lt.matmul(h, m["desc"], tc._ONE, ptrs[1], m["A"], ptrs[0], m["B"], tc._ZERO, ptrs[2], m["C"], ptrs[2],
                                m["D"], sig.prep.algo_ref, wsp, sig.prep.workspace, s)
        print(f"  raw cublasLtMatmul via ctypes: {per_call(raw):.1f}")
        if M == MS[0] and len(sys.argv) > 3:
            pr = cProfile.Profile(); pr.enable()
            for _ in range(3000):
                call()
            pr.disable(); stream.synchronize()
            out_s = io.StringIO(); pstats.Stats(pr, stream=out_s).sort_stats("tottime").print_stats(25); print(out_s.getvalue()[:6000])
    try:
        import torch
        ts = torch.cuda.ExternalStream(stream.ptr)
        with torch.cuda.stream(ts):
            for M in MS:
                a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn); b = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
                one_t = torch.ones((), device="cuda")
                f = lambda: torch._scaled_mm(a, b.t(), scale_a=one_t, scale_b=one_t, out_dtype=torch.bfloat16, use_fast_accum=True)
                print(f"torch._scaled_mm M={M}: {per_call(f):.1f} us/call")
    except Exception as e:
        print("torch:", e)
