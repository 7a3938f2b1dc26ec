"""Builds of cpemu's tiled kernels side by side on the same GEMMs: geometries, and tuning or
measurement builds of one geometry (compiled from source with extra macros).

For each (shape, data, M) every build runs the same GEMM (the profile's plan, e4m3 operands from
:mod:`cpemu.cases`, unit scales, bf16 output, fast accumulation), forced through
``gemm_cuda(..., tiled_module=..., defines=...)``. Timing is ``bench_kernels``' (:func:`benchkit.timing.time_device`:
warm-up, CUDA-event windows, median); the SM clock is sampled with nvidia-smi during each build's
windows, so the record gives MAC per clock per SM. The full outputs of every exact build must
equal the first build's bit for bit (exit 1 otherwise). A build with ``CPT_PROBE_SKIP`` set skips
work and gives wrong bits by construction (a ceiling measurement): its bits are recorded, not compared.

    python tools/bench_tiled_geometry.py --M 16,32,48,64,96,128,256 --out geometry.json
    python tools/bench_tiled_geometry.py --M 2048 --build gemm_rzacc_pre \\
        --build gemm_rzacc_pre:CPT_PROBE_SKIP=1 --build gemm_rzacc_pre:CPT_PROBE_SKIP=3 --out ceilings.json

A build is ``MODULE`` or ``MODULE:NAME=VALUE,NAME=VALUE``; without ``--build``, the two
geometries of ``cuda-tiled`` (what ``tiled_module_for`` picks from).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys

import click
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.clocks import clock_record, rate_figures, start_sampling  # noqa: E402
from benchkit.launchers import direct_launcher  # noqa: E402
from benchkit.options import grid_options, parse_grid  # noqa: E402
from benchkit.provenance import record_header  # noqa: E402
from benchkit.records import finish, write_json  # noqa: E402
from benchkit.timing import time_device  # noqa: E402

_MACRO = re.compile(r"[A-Z_][A-Z0-9_]*=[0-9A-Za-z_]+")


def parse_build(text: str) -> dict:
    """``MODULE`` or ``MODULE:NAME=VALUE,...`` -> {label, family, module, defines, probe}."""
    from cpemu.cuda import kernels

    module, _, macros = text.strip().partition(":")
    family = next((f for f in kernels.TILED_FAMILIES if module in kernels.MODULES[f]), None)
    if family is None:
        raise click.BadParameter(f"{text!r}: the module must be one of "
                                 f"{[m for f in kernels.TILED_FAMILIES for m in kernels.MODULES[f]]}",
                                 param_hint="--build")
    defines = tuple(d for d in macros.split(",") if d)
    bad = [d for d in defines if not _MACRO.fullmatch(d)]
    if bad:
        raise click.BadParameter(f"{text!r}: macros are NAME=VALUE (NAME in capitals), not {bad}", param_hint="--build")
    probe = any(d.split("=")[0] == "CPT_PROBE_SKIP" and d.split("=")[1] != "0" for d in defines)
    return {"label": text.strip(), "family": family, "module": module, "defines": defines, "probe": probe}


def _point(rec, cp, stream, prof, sms, sampler, builds, label, N, K, dlabel, kind, M, o):
    """One (shape, data, M): every build timed, the exact builds' bits compared with the first
    exact build's; appended to ``rec``. ``o``: the command's options (seed, window_s, windows)."""
    from cpemu.cases import Case, operands
    from cpemu.cuda import kernels

    one = np.float32(1)
    a, bt, *_ = operands(Case(M, N, K, data=kind, seed=o["seed"]))
    with stream:
        ad, btd = cp.asarray(a), cp.asarray(bt)
    stream.synchronize()
    plan = prof.plan(M, N, K, True, "tensorwise")
    r = {"shape": label, "N": N, "K": K, "M": M, "data": dlabel, "splits": plan.splits,
         "picked": {f: kernels.tiled_module_for(M, N, sms, f) for f in sorted({b["family"] for b in builds})},
         "builds": []}
    for b in builds:
        launch = direct_launcher(b["family"], prof, M, N, K, True, "bfloat16", (ad, btd, one, one),
                                 tiled_module=b["module"], defines=b["defines"])
        with stream:
            out, t = time_device(cp, stream, launch, window_s=o["window_s"], windows=o["windows"],
                                 max_call_s=float("inf"), warmup_s=min(1.0, o["window_s"]))
            host = out.get(stream=stream)
        stream.synchronize()
        span = t.pop("span")
        t.update(rate_figures(M * N * K, t["ms"], sampler.summary(*span) if sampler is not None else None, sms))
        r["builds"].append(dict(b, defines=list(b["defines"]), **t,
                                output_sha256=hashlib.sha256(host.tobytes()).hexdigest()))
    exact = [x for x in r["builds"] if not x["probe"]]
    r["same_bits"] = len({x["output_sha256"] for x in exact}) <= 1
    for x in r["builds"]:
        x["speedup_over_first"] = r["builds"][0]["ms"] / x["ms"]
    rec["results"].append(r)
    if not r["same_bits"]:
        rec["failures"].append(f"{label} {dlabel} M={M}: the exact builds' outputs differ")
    click.echo(f"{label:9s} {dlabel:11s} M={M:<5d} " + "  ".join(
        f"{x['label']} {x['ms']:8.3f} ms ({x['tmacs']:.2f} TMAC/s, {x['speedup_over_first']:.2f}x)"
        for x in r["builds"]) + f"  picked {r['picked']}  same bits {r['same_bits']}")


@click.command()
@grid_options("16,32,48,64,96,128,256")
@click.option("--build", "build_texts", multiple=True,
              help="Repeatable: MODULE or MODULE:NAME=VALUE,... (default: both cuda-tiled geometries).")
@click.option("--window-s", default=0.2, show_default=True, type=float)
@click.option("--windows", default=5, show_default=True, type=int)
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--out", "out_path", default="bench_tiled_geometry.json", show_default=True)
def main(shapes, m_list, data, profile, build_texts, window_s, windows, seed, out_path):
    """Time builds of the tiled kernels on the same GEMMs and compare their bits (writes JSON)."""
    shape_list, ms_, data_list = parse_grid(shapes, m_list, data, window_s, windows)
    from cpemu.cuda import kernels

    builds = [parse_build(t) for t in (build_texts or kernels.TILED_FAMILIES["cuda-tiled"])]
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA GPU")
    except Exception as e:  # noqa: BLE001 - ImportError, or a cupy without a GPU
        raise click.ClickException(f"needs cupy and a CUDA GPU ({type(e).__name__}: {e})") from None
    from benchkit.gpu import device_info
    from cpemu.profile import get_profile

    prof = get_profile(profile)
    device = device_info(cp)
    sms = device.get("sm_count")
    rec = {**record_header("tools/bench_tiled_geometry.py"), "device": device, "clock": clock_record(),
           "profile": profile, "builds": [dict(b, defines=list(b["defines"])) for b in builds],
           "geometries": {b["module"]: list(kernels.TILED_VARIANTS[b["module"]]) for b in builds},
           "timing": f"median of {windows} CUDA-event windows of >= {window_s} s (bench_kernels.time_device)",
           "results": [], "failures": []}
    sampler = start_sampling(rec, True, lambda m: click.echo(f"warning: {m}", err=True))
    stream = cp.cuda.Stream(non_blocking=True)
    opts = {"seed": seed, "window_s": window_s, "windows": windows}
    try:
        for label, N, K in shape_list:
            for dlabel, kind in data_list:
                for M in ms_:
                    _point(rec, cp, stream, prof, sms, sampler, builds, label, N, K, dlabel, kind, M, opts)
                    write_json(rec, out_path)
    finally:
        if sampler is not None:
            sampler.stop()
            rec["clock"]["samples"] = sampler.snapshot()
    finish(rec, out_path)


if __name__ == "__main__":
    main()
