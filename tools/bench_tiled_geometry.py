"""The two geometries of the ``cuda-tiled`` kernel side by side (what ``tiled_module_for`` picks from).

For each (shape, data, M) both geometries of ``cuda-tiled`` (:data:`cpemu.cuda.kernels.TILED_FAMILIES`) run the
same GEMM (the profile's plan, e4m3 operands from :mod:`cpemu.cases`, unit scales, bf16
output, fast accumulation), forced through ``gemm_cuda(..., tiled_module=...)``. Timing is
``bench_kernels``' (:func:`benchkit.timing.time_windows`: warm-up, CUDA-event windows, median).
The full outputs of the two geometries must be equal bit for bit (exit 1 otherwise); the
record also says which one ``tiled_module_for`` picks on this GPU.

    python tools/bench_tiled_geometry.py --M 16,32,48,64,96,128,256 --out geometry.json
"""

from __future__ import annotations

import hashlib
import os
import sys

import click
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.launchers import direct_launcher  # noqa: E402
from benchkit.options import grid_options, parse_grid  # noqa: E402
from benchkit.provenance import record_header  # noqa: E402
from benchkit.records import finish, write_json  # noqa: E402
from benchkit.timing import time_windows  # noqa: E402


def _point(rec, cp, stream, prof, sms, label, N, K, dlabel, kind, M, o):
    """One (shape, data, M): both geometries timed, their bits compared; appended to ``rec``.
    ``o``: the command's options (seed, window_s, windows)."""
    from cpemu.cases import Case, operands
    from cpemu.cuda import kernels

    one = np.float32(1)
    a, bt, *_ = operands(Case(M, N, K, data=kind, seed=o["seed"]))
    with stream:
        ad, btd = cp.asarray(a), cp.asarray(bt)
    stream.synchronize()
    plan = prof.plan(M, N, K, True, "tensorwise")
    r = {"shape": label, "N": N, "K": K, "M": M, "data": dlabel, "splits": plan.splits,
         "picked": kernels.tiled_module_for(M, N, sms)}
    sha = {}
    for module in kernels.TILED_FAMILIES["cuda-tiled"]:
        launch = direct_launcher("cuda-tiled", prof, M, N, K, True, "bfloat16", (ad, btd, one, one),
                                 tiled_module=module)
        with stream:
            out, t = time_windows(cp, stream, launch, window_s=o["window_s"], windows=o["windows"])
            host = out.get(stream=stream)
        stream.synchronize()
        t["tmac_s"] = M * N * K / (t["ms"] / 1e3) / 1e12
        sha[module] = hashlib.sha256(host.tobytes()).hexdigest()
        r[module] = dict(t, output_sha256=sha[module])
    r["same_bits"] = len(set(sha.values())) == 1
    first, second = kernels.TILED_FAMILIES["cuda-tiled"]
    r["speedup_of_" + second] = r[first]["ms"] / r[second]["ms"]
    rec["results"].append(r)
    if not r["same_bits"]:
        rec["failures"].append(f"{label} {dlabel} M={M}: the geometries' outputs differ")
    click.echo(f"{label:9s} {dlabel:11s} M={M:<5d} " + "  ".join(
        f"{m} {r[m]['ms']:8.3f} ms ({r[m]['tmac_s']:.2f} TMAC/s)" for m in kernels.TILED_FAMILIES["cuda-tiled"])
        + f"  {second}: {r['speedup_of_' + second]:.2f}x  picked {r['picked']}  same bits {r['same_bits']}")


@click.command()
@grid_options("16,32,48,64,96,128,256")
@click.option("--window-s", default=0.2, show_default=True, type=float)
@click.option("--windows", default=5, show_default=True, type=int)
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--out", "out_path", default="bench_tiled_geometry.json", show_default=True)
def main(shapes, m_list, data, profile, window_s, windows, seed, out_path):
    """Time both cuda-tiled geometries on the same GEMMs and compare their bits (writes JSON)."""
    shape_list, ms_, data_list = parse_grid(shapes, m_list, data, window_s, windows)
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA GPU")
    except Exception as e:  # noqa: BLE001 - ImportError, or a cupy without a GPU
        raise click.ClickException(f"needs cupy and a CUDA GPU ({type(e).__name__}: {e})") from None
    from cpemu.cuda import kernels
    from cpemu.profile import get_profile

    prof = get_profile(profile)
    dev = cp.cuda.Device()
    sms = int(dev.attributes["MultiProcessorCount"])
    rec = {**record_header("tools/bench_tiled_geometry.py"),
           "device": {"name": cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode(), "sm_count": sms},
           "profile": profile, "geometries": {m: list(kernels.TILED_VARIANTS[m]) for m in kernels.TILED_FAMILIES["cuda-tiled"]},
           "timing": f"median of {windows} CUDA-event windows of >= {window_s} s (bench_kernels.time_device)",
           "results": [], "failures": []}
    stream = cp.cuda.Stream(non_blocking=True)
    opts = {"seed": seed, "window_s": window_s, "windows": windows}
    for label, N, K in shape_list:
        for dlabel, kind in data_list:
            for M in ms_:
                _point(rec, cp, stream, prof, sms, label, N, K, dlabel, kind, M, opts)
                write_json(rec, out_path)
    finish(rec, out_path)


if __name__ == "__main__":
    main()
