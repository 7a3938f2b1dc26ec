"""The start of a ``tools/bench_kernels.py`` run: which backends run, the native baseline, the GPU
(stream, torch, clock sampler) and the validation of the CUDA backends."""

from __future__ import annotations

import click

from benchkit import clocks, gpu, host_backend
from benchkit.kernels_session import Bench
from benchkit.options import default_kernels


def choose_kernels(ctx, bench: Bench, kernel_list: list[str] | None) -> None:
    """bench.kernels (the --kernels list, or every available CUDA backend: exit 2 when there is
    none) and bench.runnable_cuda; a requested backend that cannot run is a failure."""
    from cpemu.backends import available

    record = bench.rec
    if kernel_list is None:
        kernel_list, why_not = default_kernels()
        record["default_kernels_unavailable"] = why_not
        if not kernel_list:
            click.echo("no CUDA backend of cpemu is available here:", err=True)
            for n, why in why_not.items():
                click.echo(f"  {n}: {why}", err=True)
            click.echo("(use --kernels reference for the CPU backend)", err=True)
            ctx.exit(2)
    record["kernels"] = bench.kernels = kernel_list
    unavailable = {}
    for n in (n for n in kernel_list if not host_backend(n)):
        ok, why = available(n)
        if not ok:
            unavailable[n] = why
            bench.fail(f"{n}: requested but cannot run here: {why}")
    bench.runnable_cuda = [n for n in kernel_list if not host_backend(n) and n not in unavailable]
    record["kernels_unavailable"] = unavailable


def _torch_with_cuda():
    """(torch, None) when torch with CUDA and FP8 is importable, else (None, why not)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None, "torch is importable but CUDA is not available to it"
        if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            return None, f"torch {torch.__version__} has no _scaled_mm / float8_e4m3fn"
        return torch, None
    except Exception as e:  # noqa: BLE001
        return None, f"torch not importable: {type(e).__name__}: {e}"


def choose_native(bench: Bench, native: bool, native_auto: bool) -> None:
    """bench.native_on and record["native_setting"]: on with --native, or by default where torch
    with CUDA is importable; an explicit --native that cannot run is a failure."""
    if native or native_auto:
        bench.torch, why = _torch_with_cuda()
        bench.native_on = bench.torch is not None
    else:
        why = "--no-native"
    if bench.native_on:
        bench.rec["native_setting"] = {"on": True, "reason": "--native" if not native_auto else
                                       "auto: torch with CUDA"}
    else:
        bench.rec["native_setting"] = {"on": False, "reason": why}
        if native and not native_auto:
            bench.fail(f"--native asked for but unavailable: {why}")


def _native_off(bench: Bench, reason: str) -> None:
    bench.native_on, bench.torch = False, None
    bench.rec["native_setting"] = {"on": False, "reason": reason}
    bench.warn(reason)


def open_gpu(bench: Bench) -> bool:
    """cupy's stream, the device record, torch on that stream (with a first small call) and the
    clock sampler, where a CUDA backend or the native baseline runs. Returns whether the GPU is used."""
    need_gpu = bool(bench.runnable_cuda) or bench.native_on
    if need_gpu:
        try:
            import cupy as cp
        except Exception as e:  # noqa: BLE001 - only the native baseline can get here without cupy
            need_gpu = False
            _native_off(bench, f"cupy (for the stream and events) not importable: {type(e).__name__}: {e}")
    if need_gpu:
        bench.cp = cp
        bench.stream = cp.cuda.Stream(non_blocking=True)
        info = gpu.device_info(cp)
        bench.sm_count = info.get("sm_count")
        info["cupy"] = cp.__version__
        if bench.torch is not None:
            bench.torch_device, bench.torch_stream = gpu.torch_on_stream(bench.torch, info, bench.stream)
            try:
                gpu.first_scaled_mm(bench.torch, bench.torch_device, bench.torch_stream, bench.stream,
                                    bench.s.out_dtype, bench.s.fast_accum)
            except Exception as e:  # noqa: BLE001
                _native_off(bench, f"a first small torch._scaled_mm failed: {type(e).__name__}: {e}")
        bench.rec["device"] = info
    bench.sampler = clocks.start_sampling(bench.rec, need_gpu, bench.warn)
    return need_gpu


def validate_cuda(bench: Bench) -> None:
    """cpemu.backends.validate of every runnable CUDA backend (on the run's stream); a failure is one."""
    if not bench.runnable_cuda:
        return
    from cpemu import backends

    for n in bench.runnable_cuda:
        try:
            with bench.stream:
                ok, why = backends.validate(n, bench.prof)
        except Exception as e:  # noqa: BLE001
            ok, why = False, f"{type(e).__name__}: {e}"
        bench.rec["validation"][n] = {"ok": bool(ok), "detail": why}
        if not ok:
            bench.fail(f"{n}: backends.validate failed: {why}")
