"""Speed of cpemu's CUDA backends (MAC/s), with an exactness check against the reference.

    python tools/bench_cuda.py [--out bench_cuda.json] [--shape 256x5760x1920]
                               [--profile hopper-h200-torch] [--windows 5] [--window-ms 200]

The work is the Evo 2 1B projection by default (M=256, N=5760, K=1920: e4m3 x e4m3,
``gauss40`` operands from :func:`cpemu.cases.operands`, tensorwise scales, bf16 output),
scheduled by the profile, with fast accumulation and without it. For each kernel family
the time of one GEMM is the median over ``--windows`` windows, each timed with CUDA events
around as many back-to-back launches as fill about ``--window-ms`` (after a warm-up). The
first ``--check-rows`` rows of each output are compared bit for bit with the reference
(:mod:`cpemu.reference`, on the CPU) and every family's full output with the others'.
Writes JSON; needs cupy and a CUDA GPU. ``CPEMU_CUDA_FROM_SOURCE=1`` compiles the kernels
from ``cuda_src/`` instead of loading the fatbins; ``--define NAME=VALUE`` (repeatable)
compiles the CUDA kernels from source with that macro, for tuning experiments.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import click
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit.exactness import bits, reference_rows  # noqa: E402
from benchkit.launchers import direct_launcher  # noqa: E402
from cpemu.cases import Case, operands, sha256_arrays  # noqa: E402
from cpemu.profile import get_profile  # noqa: E402


def time_windows(cp, launch, windows: int, window_ms: float):
    """Median milliseconds per launch over ``windows`` event-timed windows."""
    launch()
    cp.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    launch()
    cp.cuda.get_current_stream().synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    iters = max(1, min(10000, int(window_ms / 1e3 / one)))
    per = []
    for _ in range(windows):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(iters):
            launch()
        end.record()
        end.synchronize()
        per.append(cp.cuda.get_elapsed_time(start, end) / iters)
    return statistics.median(per), per, iters


@click.command()
@click.option("--out", "out_path", default="bench_cuda.json", show_default=True, help="JSON file to write")
@click.option("--shape", default="256x5760x1920", show_default=True, help="MxNxK")
@click.option("--profile", default="hopper-h200-torch", show_default=True)
@click.option("--families", default="cuda-simple,cuda-tiled", show_default=True)
@click.option("--windows", default=5, show_default=True, type=int)
@click.option("--window-ms", default=200.0, show_default=True, type=float)
@click.option("--check-rows", default=16, show_default=True, type=int, help="rows checked against the reference")
@click.option("--out-dtype", default="bfloat16", show_default=True)
@click.option("--define", "defines", multiple=True, help="NAME=VALUE macro for the CUDA kernels (compiled from source)")
def main(out_path, shape, profile, families, windows, window_ms, check_rows, out_dtype, defines):
    import cupy as cp

    from cpemu.cuda import kernels

    M, N, K = (int(x) for x in shape.lower().split("x"))
    prof = get_profile(profile)
    model = prof.instruction
    mode = prof.mode("tensorwise")
    a, bt, _, _, _ = operands(Case(M, N, K, data="gauss40", seed=1))
    sa, sb = np.float32(0.5), np.float32(0.25)
    ad, btd = cp.asarray(a), cp.asarray(bt)
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    result = {
        "tool": "tools/bench_cuda.py",
        "device": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        "compute_capability": dev.compute_capability,
        "sm_count": props["multiProcessorCount"],
        "driver": cp.cuda.runtime.driverGetVersion(),
        "cupy": cp.__version__,
        "host": platform.node(),
        "kernels_from": "source" if (os.environ.get(kernels.FROM_SOURCE_ENV) == "1" or defines) else "fatbin",
        "defines": list(defines),
        "shape": {"M": M, "N": N, "K": K},
        "macs": M * N * K,
        "profile": profile,
        "instruction": model.to_json(),
        "out_dtype": out_dtype,
        "timing": f"median of {windows} CUDA-event windows of ~{window_ms} ms of back-to-back launches",
        "runs": [],
    }
    for fast in (True, False):
        plan = prof.plan(M, N, K, fast, "tensorwise", "e4m3", "e4m3", out_dtype)  # the plan direct_launcher uses
        want = reference_rows(a, bt, plan, model, mode, sa, sb, out_dtype, min(check_rows, M)) if check_rows else None
        outs = {}
        for fam in families.split(","):
            launch = direct_launcher(fam, prof, M, N, K, fast, out_dtype, (ad, btd, sa, sb), defines=defines)
            y = launch()
            ms, per, iters = time_windows(cp, launch, windows, window_ms)
            got = bits(y.get())
            outs[fam] = got
            run = {"family": fam, "fast_accum": fast, "splits": plan.splits, "promotion": plan.promotion,
                   "ms": ms, "windows_ms": per, "launches_per_window": iters, "mac_per_s": M * N * K / (ms / 1e3),
                   "output_sha256": sha256_arrays(got)}
            if want is not None:
                bad = int((got[: want.shape[0]] != want).sum())
                run["checked_rows"] = int(want.shape[0])
                run["mismatches_vs_reference"] = bad
                run["exact"] = bad == 0
            result["runs"].append(run)
            click.echo(f"{fam:12s} fast_accum={fast!s:5s} {ms:9.3f} ms  {run['mac_per_s'] / 1e9:9.1f} GMAC/s  "
                       f"exact={run.get('exact')}")
        fams = list(outs)
        for f in fams[1:]:
            same = bool(np.array_equal(outs[f], outs[fams[0]]))
            result.setdefault("families_agree", []).append({"fast_accum": fast, "a": fams[0], "b": f, "same": same})
            click.echo(f"{f} == {fams[0]} (all {M} rows, fast_accum={fast}): {same}")
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)
    click.echo(f"wrote {out_path}")


if __name__ == "__main__":
    main()
