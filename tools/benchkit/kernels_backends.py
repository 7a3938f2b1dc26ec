"""One backend, or the native torch._scaled_mm, timed on one configuration of ``tools/bench_kernels.py``.

Each function returns ``(record, host output bits or None)``."""

from __future__ import annotations

import numpy as np

import cpemu
from benchkit import FMT, host_backend
from benchkit.exactness import bits
from benchkit.gpu import torch_dtype
from benchkit.kernels_session import Bench
from benchkit.launchers import DIRECT_CALL, direct_details, direct_launcher, has_direct
from benchkit.timing import time_device, time_host
from cpemu.formats import FP8_FORMATS


def may_run(bench: Bench, name: str, macs: int) -> bool:
    """False when run_kernel would skip ``name`` without running it (the caps, unavailability)."""
    if host_backend(name):
        return macs <= bench.s.reference_max_macs
    if name not in bench.runnable_cuda:
        return False
    rate = bench.best_rate.get(name)
    return not (rate and macs / rate > bench.s.max_check_call_s)


def run_kernel(bench: Bench, pt, name: str, base: dict, ops, dev: dict):
    """Time backend ``name`` on the configuration ``pt`` (host operands ``ops`` = (a, bt, sa, sb),
    device copies ``dev``), or skip it (the caps, a backend that cannot run here)."""
    s, macs, tag = bench.s, pt.macs, pt.tag
    if host_backend(name):
        if macs > s.reference_max_macs:
            return bench.skip(base, f"{name} {tag}", f"M*N*K = {macs:.3g} > --reference-max-macs "
                                                       f"{s.reference_max_macs:.3g}"), None
        return _run_host(bench, name, base, ops, macs)
    if name not in bench.runnable_cuda:
        why = bench.rec["kernels_unavailable"].get(name, "not available")
        return bench.skip(base, f"{name} {tag}", f"backend cannot run here: {why}"), None
    rate = bench.best_rate.get(name)
    if rate and macs / rate > s.max_check_call_s:
        return bench.skip(base, f"{name} {tag}",
                          f"predicted {macs / rate:.1f} s per call (at its best rate so far, {rate / 1e12:.3g} "
                          f"TMAC/s) > --max-check-call-s {s.max_check_call_s}"), None
    return _run_cuda(bench, pt, name, base, ops, dev)


def _run_host(bench: Bench, name: str, base: dict, ops, macs: int):
    s = bench.s
    a, bt, sa, sb = ops
    fmt = FP8_FORMATS[FMT]
    A, B = a.view(fmt.np_dtype), bt.view(fmt.np_dtype).T

    def launch():
        return cpemu.gemm(A, B, profile=bench.prof, scale_a=sa.reshape(()), scale_b=sb.reshape(()),
                          out_dtype=s.out_dtype, fast_accum=s.fast_accum, backend=name)

    out, r = time_host(launch, window_s=s.window_s, windows=s.windows, max_call_s=s.max_call_s)
    r = dict(base, status="ok", call=f"cpemu.gemm (numpy, backend='{name}')", **r)
    span = r.pop("span", None)
    bench.figures(r, macs, span)
    r["mac_per_clock_per_sm"] = None  # a CPU backend: no SM
    r["span_unix"] = span
    return r, bits(np.asarray(out))


def _device_timed(bench: Bench, launch, macs: int, head: dict, after_span: dict | None = None):
    """time_device of ``launch`` on the run's stream: (first output, ``head`` + the timing, its
    wall-time span, ``after_span`` and the derived figures)."""
    s = bench.s
    out, t = time_device(bench.cp, bench.stream, launch, window_s=s.window_s, windows=s.windows,
                         max_call_s=s.max_call_s, warmup_s=min(1.0, s.window_s))
    bench.stream.synchronize()
    r = dict(head, **t)
    span = r.pop("span", None)
    r["span_unix"] = span
    r.update(after_span or {})
    bench.figures(r, macs, span)
    return out, r


def _run_cuda(bench: Bench, pt, name: str, base: dict, ops, dev: dict):
    s, cp, stream = bench.s, bench.cp, bench.stream
    _, _, sa, sb = ops
    a_dev, bt_dev = dev["a"], dev["bt"]
    prof = bench.prof

    def api_launch():
        return cpemu.gemm(a_dev, bt_dev.T, a_format=FMT, b_format=FMT, profile=prof.name if not prof.base_dir
                          else prof, scale_a=sa.reshape(()), scale_b=sb.reshape(()), out_dtype=s.out_dtype,
                          fast_accum=s.fast_accum, backend=name)

    direct = has_direct(name)
    if direct:
        launch = direct_launcher(name, prof, pt.M, pt.N, pt.K, s.fast_accum, s.out_dtype,
                                 (a_dev, bt_dev, dev["sa"], dev["sb"]))
        call = DIRECT_CALL
    else:
        launch, call = api_launch, "api: cpemu.gemm (no direct launcher for this backend)"
    with stream:
        out, r = _device_timed(bench, launch, pt.macs, dict(base, status="ok", call=call))
        if direct:
            r.update(direct_details(name, prof, pt.plan, pt.M, pt.N, pt.K, s.out_dtype, s.fast_accum,
                                    bench.sm_count))
            r["api"] = _api(bench, pt, r, out, api_launch)
        stream.synchronize()
        host = out.get(stream=stream)
        stream.synchronize()
    return r, bits(host)


def _api(bench: Bench, pt, r: dict, out, api_launch) -> dict:
    """cpemu.gemm on the same cupy arrays, timed where the direct call takes less than --api-max-ms;
    its output must equal the direct one's."""
    api_max_ms = bench.s.api_max_ms
    if not (r["timing"] == "windows" and r["ms"] < api_max_ms):
        return {"status": "not timed", "reason": f"direct call {r['ms']:.3g} ms >= --api-max-ms {api_max_ms} "
                                                 f"or single-call timing"}
    aout, ar = _device_timed(bench, api_launch, pt.macs, {}, {"call": "api: cpemu.gemm on cupy arrays"})
    same = aout.shape == out.shape and aout.dtype == out.dtype
    n_bad = int(bench.cp.count_nonzero(aout != out)) if same else None
    ar["matches_direct"] = {"ok": n_bad == 0, "mismatches": n_bad}
    ar["overhead_ms_per_call"] = ar["ms"] - r["ms"]
    return ar


def run_native(bench: Bench, base: dict, ops, macs: int):
    """torch._scaled_mm on the same codes and unit scales, on the run's stream."""
    torch, stream = bench.torch, bench.stream
    a, bt, sa, sb = ops
    devname = bench.torch_device
    tdt = torch_dtype(torch, bench.s.out_dtype)
    ta = torch.from_numpy(np.ascontiguousarray(a)).to(devname).view(torch.float8_e4m3fn)
    tbt = torch.from_numpy(np.ascontiguousarray(bt)).to(devname).view(torch.float8_e4m3fn)
    tb = tbt.t()  # (K, N) column-major, as torch._scaled_mm wants
    tsa = torch.from_numpy(np.array(sa, dtype=np.float32).reshape(())).to(devname)
    tsb = torch.from_numpy(np.array(sb, dtype=np.float32).reshape(())).to(devname)
    torch.cuda.synchronize(devname)
    fast_accum = bench.s.fast_accum

    def launch():
        return torch._scaled_mm(ta, tb, tsa, tsb, out_dtype=tdt, use_fast_accum=fast_accum)

    head = dict(base, status="ok", call=f"torch._scaled_mm(a, b, scale_a, scale_b, out_dtype={tdt}, "
                                        f"use_fast_accum={fast_accum})")
    with torch.cuda.stream(bench.torch_stream), stream:
        out, r = _device_timed(bench, launch, macs, head)
    ibits = torch.int32 if out.element_size() == 4 else torch.int16
    host = out.view(ibits).cpu().numpy()
    host = host.view(np.uint32 if host.dtype.itemsize == 4 else np.uint16)
    return r, np.ascontiguousarray(host)
