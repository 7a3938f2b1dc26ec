"""The benchmark of record of cpemu's backends: speed, exactness, and the native FP8 GEMM beside them.

    python tools/bench_kernels.py --out bench_kernels.json \\
        [--kernels cuda-tiled,cuda-simple] [--profile hopper-h200-torch] \\
        [--shape evo2-1b --shape evo2-7b --shape evo2-40b | --shape NxK ...] \\
        [--M 16,64,256,1024,2048,8192] [--data gauss40,adversarial] \\
        [--fast-accum/--no-fast-accum] [--out-dtype bfloat16] \\
        [--window-s 0.5] [--windows 5] [--native/--no-native]

What is measured. For every (shape, data, M) the operands are generated on the host by
:func:`cpemu.cases.operands` from ``Case(M, N, K, data=..., seed=--seed)`` (e4m3 x e4m3, unit
tensorwise scales, so every input can be regenerated from the case id in the JSON) and
uploaded once. Shapes are ``N x K`` of the weight: ``evo2-1b`` (5760 x 1920), ``evo2-7b``
(12288 x 4096), ``evo2-40b`` (24576 x 8192) -- the Evo 2 projections -- or ``NxK``. Data:
``gauss40`` is N(0, 40^2) rounded to e4m3 (Transformer-Engine-like activations);
``adversarial`` is cpemu.cases' ``spread`` kind: one large element (|x| in [64, 448]) per 32
K-elements, the rest N(0, 1/64), so that every T-FDPA step aligns its products to a large
exponent and truncates most of the others -- the data that maximises truncation and exponent
spread. Any other data kind of :mod:`cpemu.cases` may be named directly.

Timing (CUDA kernels and the native baseline). All GPU work runs on one non-blocking cupy
stream; torch runs on the same stream (``torch.cuda.ExternalStream``), and both are timed
with cupy CUDA events recorded on it. One first call (its output is the one checked), then a
warm-up of at least ``min(1 s, --window-s)`` of back-to-back launches in growing batches,
whose last batch calibrates the number of launches per window; then at least ``--windows``
windows, each an event-timed run of back-to-back launches lasting at least ``--window-s``
seconds (a shorter window is discarded, recorded, and the count raised). The result is the
median over the windows of (window time / launches): ms per call, TMAC/s = M*N*K / time, and
MAC per clock per SM = MACs / seconds / SM clock (Hz) / SM count, with the SM clock the median
of the nvidia-smi samples taken during the windows (a background thread queries
``nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu`` about every 100 ms for the
whole run; every sample is kept in the JSON; without nvidia-smi the clock is null) and the SM
count from cupy's device attributes. The host (Python) time per call is measured on a warm-up
batch of at most 128 launches, too few to fill the driver's launch queue: ``host_bound`` is
set when it is at least 90 % of the GPU time per call (the GPU then waits for Python, and the
figure is a launch-overhead figure, not a kernel figure).

Which call is timed. ``cublaslt-tc``, ``cuda-tiled`` and ``cuda-simple`` are timed through
``cpemu.cuda.kernels.gemm_cuda`` ("direct"), with the plan from ``profile.plan(...)`` and the
scales already on the device, exactly as ``cpemu.gemm`` calls it: the kernel plus the launch
wrapper's argument checks, without cpemu.gemm's per-call Python (profile lookup, scale and
feature checks, the plan). Where a direct call takes less than ``--api-max-ms`` (default 10 ms,
where that overhead could matter) the user's path ``cpemu.gemm(a_dev, bt_dev.T,
a_format="e4m3", b_format="e4m3", ..., backend=name)`` on the same cupy arrays is timed the
same way as well and recorded under ``api`` (its output must equal the direct one). A backend
of ``cpemu.backends.LADDER`` without a direct launcher is timed through cpemu.gemm only.
The host backends (``reference``, ``cpu-fp32``) run on the CPU through ``cpemu.gemm(...,
backend=name)`` on numpy arrays, timed with ``time.perf_counter`` (first call, then windows as
above), and only where M*N*K <= ``--reference-max-macs`` (default 2e9); ``--kernels
reference,cpu-fp32 --no-native`` never imports cupy.

Caps. A kernel whose first call takes longer than ``--max-call-s`` (default 2 s) is not timed
in windows: the first call's event time is its result (``timing: "single-call"``), and its
output is still checked. A kernel whose call is predicted (from its best rate earlier in the
run) to exceed ``--max-check-call-s`` (default 30 s) is not launched (``status: "skipped"``).

Native baseline (``--native``, default on when torch with CUDA is importable):
``torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=..., use_fast_accum=...)`` on the same
codes (``torch.from_numpy(a).cuda().view(torch.float8_e4m3fn)``, ``b`` the transposed view of
the (N, K) codes), timed as above; each kernel's TMAC/s is divided by the native TMAC/s. The
native output is also compared with cpemu's (recorded, and printed when it differs; it is not
an exactness failure of cpemu's kernels, since the profile need not describe this GPU or
this torch).

Exactness. Each kernel's output is compared bit for bit with the reference on the first
``--check-rows`` rows (full width; computed on the host by :mod:`cpemu.reference` with the
plan of the full shape), every kernel's full output with ``cuda-simple``'s (or, where
cuda-simple did not run on that configuration, with ``cuda-tiled``'s; recorded under
``vs_cuda_simple`` with ``against``), the ``api`` output with the direct one, and each CUDA
backend passes ``cpemu.backends.validate`` (six hard cases, ten for cublaslt-tc). Any mismatch, a kernel error, or a
requested backend (or an explicit ``--native``) that cannot run is printed and makes the exit
status 1, after the JSON is written (2: bad options, or no CUDA backend available for the
default ``--kernels``; 130: interrupted). The JSON is rewritten after every (shape, data, M),
so an interrupted run leaves a valid partial record (``complete: false``).

Code: this file is the command; the run's parts are the ``kernels_*`` modules of
``tools/benchkit/``, beside the parts the other benchmark tools share (options, timing,
clocks, exactness, records, and the one direct launcher of the CUDA kernels).
"""

from __future__ import annotations

import os
import sys
import traceback

import click

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import FMT  # noqa: E402
from benchkit.kernels_point import run_config  # noqa: E402
from benchkit.kernels_record import explicit_command, new_record  # noqa: E402
from benchkit.kernels_session import Bench, Settings  # noqa: E402
from benchkit.kernels_setup import choose_kernels, choose_native, open_gpu, validate_cuda  # noqa: E402
from benchkit.kernels_table import print_table  # noqa: E402
from benchkit.options import DEFAULT_SHAPES, parse_data, parse_int_list, parse_kernels, parse_shape  # noqa: E402
from cpemu.profile import get_profile  # noqa: E402

DEFAULT_MS = "16,64,256,1024,2048,8192"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--kernels", default=None,
              help="Comma list of backends (cpemu.backends.LADDER names: cuda-tiled, cuda-simple, reference, ...). "
                   "Default: every available CUDA backend of the ladder (not the host backends).")
@click.option("--profile", default="hopper-h200-torch", show_default=True, help="cpemu profile name or JSON file")
@click.option("--shape", "shapes", multiple=True,
              help="Repeatable: evo2-1b (5760x1920), evo2-7b (12288x4096), evo2-40b (24576x8192) or NxK. "
                   "Default: the three Evo 2 shapes.")
@click.option("--M", "m_text", default=DEFAULT_MS, show_default=True, help="Comma list of M (tokens)")
@click.option("--data", "data_text", default="gauss40,adversarial", show_default=True,
              help="Comma list: gauss40 (N(0,1600)), adversarial (cpemu.cases 'spread'), or any cpemu.cases kind")
@click.option("--fast-accum/--no-fast-accum", default=True, show_default=True, help="use_fast_accum")
@click.option("--out-dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16",
              show_default=True)
@click.option("--window-s", default=0.5, show_default=True, type=float, help="minimum length of a timed window")
@click.option("--windows", default=5, show_default=True, type=int, help="number of timed windows")
@click.option("--out", "out_path", default="bench_kernels.json", show_default=True, help="JSON record to write")
@click.option("--native/--no-native", default=True,
              help="torch._scaled_mm baseline. Default: on when torch with CUDA is importable.")
@click.option("--seed", default=1, show_default=True, type=int, help="seed of the generated operands")
@click.option("--check-rows", default=2, show_default=True, type=int,
              help="rows compared (full width) with the reference on the CPU")
@click.option("--max-call-s", default=2.0, show_default=True, type=float,
              help="a kernel whose first call takes longer is not timed in windows (its first call is its time)")
@click.option("--max-check-call-s", default=30.0, show_default=True, type=float,
              help="a kernel predicted to take longer per call is not launched at all")
@click.option("--reference-max-macs", default=2e9, show_default=True, type=float,
              help="the host backends (reference, cpu-fp32) are skipped above this M*N*K")
@click.option("--api-max-ms", default=10.0, show_default=True, type=float,
              help="also time the cpemu.gemm path where a direct call takes less than this (0: never)")
@click.pass_context
def main(ctx, kernels, profile, shapes, m_text, data_text, fast_accum, out_dtype, window_s, windows, out_path,
         native, seed, check_rows, max_call_s, max_check_call_s, reference_max_macs, api_max_ms):
    """Speed and exactness of cpemu's backends (and the native FP8 GEMM) on the Evo 2 shapes."""
    if window_s <= 0 or windows < 1:
        raise click.BadParameter("--window-s must be > 0 and --windows >= 1")
    if check_rows < 0:
        raise click.BadParameter("--check-rows must be >= 0")
    shape_list = [parse_shape(s) for s in (shapes or DEFAULT_SHAPES)]
    m_list = parse_int_list(m_text, "--M")
    data_list = parse_data(data_text)
    kernel_list = parse_kernels(kernels)
    try:
        prof = get_profile(profile)
        prof.check_features(FMT, FMT, out_dtype, "tensorwise", None)
    except Exception as e:  # noqa: BLE001
        raise click.BadParameter(f"{profile!r}: {e}", param_hint="--profile") from None
    native_source = ctx.get_parameter_source("native")
    native_auto = native_source is None or native_source.name == "DEFAULT"
    settings = Settings.of(ctx.params)
    bench = Bench(settings, prof, new_record(ctx.params, prof, shape_list, m_list, data_list, settings), out_path)
    choose_kernels(ctx, bench, kernel_list)
    bench.rec["command_line_explicit"] = explicit_command(bench.kernels, profile, shape_list, m_list, data_list,
                                                          settings, out_path, native)
    choose_native(bench, native, native_auto)
    open_gpu(bench)
    validate_cuda(bench)
    bench.total = len(shape_list) * len(data_list) * len(m_list) * (len(bench.kernels) + (1 if bench.native_on
                                                                                         else 0))
    dv = bench.rec["device"] or {}
    bench.log(f"{len(shape_list)} shape(s) x {len(data_list)} data x {len(m_list)} M; kernels "
              f"{','.join(bench.kernels)}; native {'on' if bench.native_on else 'off'}; device "
              f"{dv.get('name', 'none (CPU)')}" + (f", {dv.get('sm_count')} SMs" if dv else "")
              + f"; SM clock {'sampled' if bench.sampler is not None else 'not sampled'}; writing {out_path}")
    bench.write(False)
    interrupted = _run_grid(bench, shape_list, data_list, m_list)
    _report(ctx, bench, interrupted)


def _run_grid(bench: Bench, shape_list, data_list, m_list) -> bool:
    """Every (shape, data, M), the record rewritten after each; returns whether it was interrupted."""
    interrupted = False
    try:
        for label, N, K in shape_list:
            for data_label, kind in data_list:
                for M in m_list:
                    try:
                        run_config(bench, label, N, K, data_label, kind, M)
                    except Exception as e:  # noqa: BLE001 - e.g. out of memory: recorded, the run goes on
                        bench.rec.setdefault("config_errors", []).append(
                            {"shape": label, "data": data_label, "M": M, "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()[-4000:]})
                        bench.fail(f"{label} {data_label} M={M}: {type(e).__name__}: {e}")
                    bench.write(False)
    except KeyboardInterrupt:
        interrupted = True
        bench.fail("interrupted (KeyboardInterrupt): the record is partial")
    finally:
        if bench.sampler is not None:
            bench.sampler.stop()
    return interrupted


def _report(ctx, bench: Bench, interrupted: bool) -> None:
    """The final record, the table, the warnings and failures; exit 1 on a failure (130 when interrupted)."""
    bench.rec["interrupted"] = interrupted
    bench.write(not interrupted)
    bench.log("")
    print_table(bench.rec)
    click.echo(f"wrote {bench.out_path}")
    if bench.warnings:
        click.echo(f"{len(bench.warnings)} warning(s) (in the JSON under 'warnings'):", err=True)
        for w in bench.warnings[:20]:
            click.echo(f"  {w[:300]}", err=True)
        if len(bench.warnings) > 20:
            click.echo(f"  ... and {len(bench.warnings) - 20} more", err=True)
    if bench.failures:
        click.echo(f"{len(bench.failures)} failure(s):", err=True)
        for f in bench.failures:
            click.echo(f"  {f}", err=True)
        ctx.exit(130 if interrupted else 1)


if __name__ == "__main__":
    main()
