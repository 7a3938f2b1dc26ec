"""Speed of the torch drop-in, ``cpemu.torch.scaled_mm``, side by side with ``torch._scaled_mm``.

What a user of the drop-in pays per call: the emulated call on CUDA tensors (argument checks
as torch's, the profile's plan, the backend ``--backend`` picks, the result as a torch tensor)
against the native call on the same operands, in one run. Per (shape, M): both calls warm up,
then ``--windows`` windows of back-to-back calls, each at least ``--window-s`` long, are timed
with CUDA events on torch's current stream; the median window gives ms per call, TMAC/s and the
ratio emulated / native. The method is ``bench_kernels``' (:func:`benchkit.timing.time_windows`):
warm-up batches, windows shorter than ``--window-s`` discarded, the host time per call from a
warm-up batch too short to fill the driver's queue. Both calls run on one non-blocking cupy
stream that is torch's current stream for the run (the drop-in takes torch's current stream).

Bits: where the profile is the GPU's own (``--must-match``, e.g. ``hopper-h200-torch`` on an
H200 with the recorded torch/cuBLASLt), every output must equal the native one (full output,
exit 1 otherwise); else the number of differing outputs is recorded.

Operands: ``cpemu.cases`` data (``gauss40``: N(0, 1600), or ``adversarial``) as FP8 e4m3 codes,
``a`` (M, K) row-major, ``b`` the transposed view of an (N, K) weight, unit float32 scales on
the device, bf16 output, fast accumulation.

    python tools/bench_dropin.py --shape evo2-1b --shape evo2-40b --M 64,2048 --out dropin.json
"""

from __future__ import annotations

import os
import platform
import sys

import click

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.options import grid_options, parse_grid  # noqa: E402
from benchkit.provenance import record_header  # noqa: E402
from benchkit.records import finish, write_json  # noqa: E402
from benchkit.timing import time_windows  # noqa: E402


def _time(cp, stream, fn, window_s: float, windows: int) -> dict:
    """bench_kernels' event-timed windows (:func:`benchkit.timing.time_windows`) of ``fn()`` on
    ``stream``, which is torch's current stream during the run."""
    return time_windows(cp, stream, fn, window_s=window_s, windows=windows)[1]


def _point(rec, cp, stream, one, label, N, K, dlabel, kind, M, o):
    """One (shape, data, M): bits against native, then both timed; appended to ``rec``.
    ``o``: the command's options (seed, profile, backend, must_match, window_s, windows)."""
    import torch

    import cpemu.torch as ct
    from cpemu.cases import Case, operands

    seed, profile, backend, must_match, window_s, windows = (o[k] for k in ("seed", "profile", "backend",
                                                                              "must_match", "window_s", "windows"))
    a_np, bt_np, *_ = operands(Case(M, N, K, data=kind, seed=seed))
    a = torch.from_numpy(a_np).cuda().view(torch.float8_e4m3fn)
    w = torch.from_numpy(bt_np).cuda().view(torch.float8_e4m3fn)

    def native():
        return torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                use_fast_accum=True)

    def emulated():
        return ct.scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True,
                            profile=profile, backend=backend)

    y_nat, y_emu = native(), emulated()
    torch.cuda.synchronize()
    diff = int((y_nat.view(torch.int16) != y_emu.view(torch.int16)).sum())
    r = {"shape": label, "N": N, "K": K, "M": M, "data": dlabel, "macs": M * N * K,
         "outputs_differing_from_native": diff}
    r["native"] = _time(cp, stream, native, window_s, windows)
    r["emulated"] = _time(cp, stream, emulated, window_s, windows)
    for k in ("native", "emulated"):
        r[k]["tmac_s"] = M * N * K / (r[k]["ms"] / 1e3) / 1e12
    r["emulated_over_native"] = r["native"]["ms"] / r["emulated"]["ms"]
    rec["results"].append(r)
    if must_match and diff:
        rec["failures"].append(f"{label} {dlabel} M={M}: {diff} outputs differ from native")
    click.echo(f"{label:9s} {dlabel:11s} M={M:<5d} native {r['native']['ms'] * 1e3:9.1f} us "
               f"(host {r['native']['host_ms_per_call'] * 1e3:6.1f})  cpemu.torch "
               f"{r['emulated']['ms'] * 1e3:9.1f} us (host {r['emulated']['host_ms_per_call'] * 1e3:6.1f})"
               f"  ratio {r['emulated_over_native']:.3f}  differing outputs {diff}")


@click.command()
@grid_options("16,64,256,1024,2048,8192")
@click.option("--backend", default="auto", show_default=True, help="cpemu backend ('auto': the ladder)")
@click.option("--must-match/--no-must-match", default=None,
              help="Require the emulated bits to equal the native ones. Default: on for hopper-h200-torch "
                   "on a compute-capability 9.0 GPU.")
@click.option("--window-s", default=0.5, show_default=True, type=float)
@click.option("--windows", default=5, show_default=True, type=int)
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--out", "out_path", default="bench_dropin.json", show_default=True)
def main(shapes, m_list, data, profile, backend, must_match, window_s, windows, seed, out_path):
    """Time cpemu.torch.scaled_mm against torch._scaled_mm on CUDA tensors (writes JSON)."""
    shape_list, ms_, data_list = parse_grid(shapes, m_list, data, window_s, windows)
    import torch

    if not torch.cuda.is_available():
        raise click.ClickException("needs torch with a CUDA GPU")
    try:
        import cupy as cp
    except ImportError as e:
        raise click.ClickException(f"needs cupy for the stream and events ({e})") from None

    cc = torch.cuda.get_device_capability()
    if must_match is None:
        must_match = profile == "hopper-h200-torch" and cc == (9, 0)
    rec = {**record_header("tools/bench_dropin.py"), "host": platform.node(),
           "device": {"name": torch.cuda.get_device_name(), "compute_capability": list(cc),
                      "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
                      "torch": torch.__version__, "torch_cuda": torch.version.cuda},
           "profile": profile, "backend": backend, "must_match": must_match,
           "call": "cpemu.torch.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True, "
                   "profile=..., backend=...) vs torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16, "
                   "use_fast_accum=True); a (M, K), w (N, K) float8_e4m3fn CUDA tensors, unit float32 scales",
           "timing": f"median of {windows} CUDA-event windows of >= {window_s} s of back-to-back calls "
                     f"(bench_kernels.time_device), on one stream",
           "results": [], "failures": []}
    opts = {"seed": seed, "profile": profile, "backend": backend, "must_match": must_match, "window_s": window_s,
            "windows": windows}
    stream = cp.cuda.Stream(non_blocking=True)
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
        one = torch.ones((), dtype=torch.float32, device="cuda")
        for label, N, K in shape_list:
            for dlabel, kind in data_list:
                for M in ms_:
                    _point(rec, cp, stream, one, label, N, K, dlabel, kind, M, opts)
                    write_json(rec, out_path)
    finish(rec, out_path)


if __name__ == "__main__":
    main()
