"""Speed of cpemu's reference backend next to MMA-Sim's on the same work, on this CPU.

The work: ``out = A @ B`` for FP8 e4m3 operands (``gauss40`` data from
:func:`cpemu.cases.operands`), each output one chain of T-FDPA steps over K from a
zero accumulator (fast accumulation, no split-K), FP32 output, unit scales. That is
exactly what MMA-Sim's simulators compute in ``__call__(A, B, C)`` with ``C = 0``:

* Hopper (L=32, F=13): ``mmasim.nv_ptx.WGMMA("Hopper", "m64n8k32.f32.e4m3.e4m3")``
* Ada (L=16, F=13):    ``mmasim.nv_ptx.MMA("Ada Lovelace", "m16n8k32.f32.e4m3.e4m3.f32")``

cpemu runs through its public API, ``cpemu.gemm(..., backend="reference")``, with a
profile built here from the matching instruction model (split-K ``none``), so the
times include operand decoding, the epilogue and the output encoding. Both results
are compared bit for bit and the comparison is recorded.

    python tools/bench_reference.py [--out bench.json] [--repeats 3]

Each time is the median of ``--repeats`` runs after one small warm-up call of each
side. MMA-Sim is skipped on a shape when its predicted time (from its speed on the
shapes before) exceeds ``--mmasim-max-seconds``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time

import click
import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cpemu import Profile, gemm  # noqa: E402
from cpemu.cases import Case, operands  # noqa: E402
from cpemu.instruction import ADA_SM89, HOPPER_SM90A  # noqa: E402

MODELS = {
    "hopper": (HOPPER_SM90A, "WGMMA", ("Hopper", "m64n8k32.f32.e4m3.e4m3")),
    "ada": (ADA_SM89, "MMA", ("Ada Lovelace", "m16n8k32.f32.e4m3.e4m3.f32")),
}
DEFAULT_SHAPES = ("16x256x1024", "64x256x2048", "16x5760x1920")


def bench_profile(key: str) -> Profile:
    """A profile whose only schedule is one fast-accumulation chain per output."""
    model = MODELS[key][0]
    mode = {
        "kernel": "benchmark: one T-FDPA chain per output",
        "promotion_interval": 4,
        "split_k": {"kind": "none", "source": "benchmark"},
        "reduction": {"order": "slice-ascending", "precision": "fp32", "rounding": "rn"},
        "epilogue": {"order": "acc*(sa*sb)", "bias": "fp32-rn-add-after-scaling", "source": "benchmark"},
        "out_dtypes": ["float32"],
        "bias_dtypes": {},
    }
    data = {"schema_version": 1, "name": f"{key}-bench-chain", "arch": key, "device": "-", "library": "-",
            "caller": "benchmark", "summary": "single-chain benchmark profile",
            "instruction": model.to_json(), "formats": [["e4m3", "e4m3"]], "modes": {"tensorwise": mode},
            "verification": {"status": "instruction-model-only", "method": "-", "counts": {}},
            "provenance": {}}
    return Profile(data["name"], data)


def simulator(key: str):
    from mmasim import nv_ptx

    _, cls, args = MODELS[key]
    return getattr(nv_ptx, cls)(*args)


def parse_shape(s: str):
    try:
        M, N, K = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"{s!r}: expected MxNxK, e.g. 16x256x1024") from None
    return M, N, K


def _timed(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, times


def thread_info(torch) -> dict:
    info = {"cpu_count": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "torch_threads": torch.get_num_threads() if torch else None,
            "torch_interop_threads": torch.get_num_interop_threads() if torch else None,
            "numpy_threads": 1,
            "numpy_threads_note": "numpy's elementwise and integer reductions (all the reference backend uses; "
                                  "no BLAS call) run on one thread",
            "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
                    if k in os.environ}}
    try:
        import threadpoolctl

        info["threadpools"] = [{k: p.get(k) for k in ("user_api", "internal_api", "num_threads")}
                               for p in threadpoolctl.threadpool_info()]
    except ImportError:
        pass
    return info


@click.command()
@click.option("--shape", "shapes", multiple=True, default=DEFAULT_SHAPES, show_default=True,
              help="MxNxK (repeatable).")
@click.option("--model", "models", multiple=True, type=click.Choice(sorted(MODELS)), default=("hopper", "ada"),
              show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--mmasim-max-seconds", type=float, default=45.0, show_default=True,
              help="Skip MMA-Sim on a shape when its predicted time for all repeats exceeds this.")
@click.option("--torch-threads", type=int, default=None, help="torch.set_num_threads for MMA-Sim (default: torch's).")
@click.option("--no-mmasim", is_flag=True, help="Time cpemu only.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Write the results as JSON.")
def main(shapes, models, repeats, mmasim_max_seconds, torch_threads, no_mmasim, out_path):
    """Time cpemu's reference backend and MMA-Sim on the same GEMMs; check equal bits."""
    torch, mmasim_version = (None, None) if no_mmasim else _mmasim()
    if torch is not None and torch_threads:
        torch.set_num_threads(torch_threads)
    env = {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
           "processor": platform.processor() or None, "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__,
           "torch": torch.__version__ if torch else None, "mmasim": mmasim_version, **thread_info(torch)}
    t_start = time.perf_counter()
    _warm_up(models, torch)
    rows = []
    rate = {}  # MMA-Sim MAC/s so far, per model (for the skip prediction)
    for s in shapes:
        M, N, K = parse_shape(s)
        a, bt, *_ = operands(Case(M, N, K, data="gauss40", seed=0))
        for key in models:
            row = _row(key, a, bt, repeats, torch, rate, mmasim_max_seconds)
            rows.append(row)
            _print_row(row)
    _finish(rows, repeats, env, time.perf_counter() - t_start, out_path)


def _mmasim():
    """(torch, MMA-Sim's version), or (None, None) when either is not importable."""
    try:
        import torch

        importlib.import_module("mmasim")
        return torch, importlib.metadata.version("mmasim")
    except ImportError as e:
        click.echo(f"MMA-Sim not available ({e}); timing cpemu only", err=True)
        return None, None


def _warm_up(models, torch) -> None:
    """First calls pay one-time costs (torch kernels, numpy tables): one small call of each side."""
    for key in models:
        a, bt, *_ = operands(Case(16, 16, 64, data="gauss40"))
        gemm(a.view(ml_dtypes.float8_e4m3fn), bt.view(ml_dtypes.float8_e4m3fn).T, profile=bench_profile(key),
             out_dtype="float32")
        if torch is not None:
            f8 = torch.float8_e4m3fn
            simulator(key)(torch.from_numpy(a).view(f8), torch.from_numpy(bt).view(f8).T, torch.zeros(16, 16))


def _row(key: str, a, bt, repeats: int, torch, rate: dict, mmasim_max_seconds: float) -> dict:
    """cpemu timed on one shape and model, then MMA-Sim (None: not run), unless its predicted
    time (from ``rate``, its best MAC/s so far per model, updated here) is too long."""
    (M, K), N = a.shape, bt.shape[0]
    A, B = a.view(ml_dtypes.float8_e4m3fn), bt.view(ml_dtypes.float8_e4m3fn).T
    macs = M * N * K
    prof, model = bench_profile(key), MODELS[key][0]
    y, t_c = _timed(lambda: gemm(A, B, profile=prof, out_dtype="float32", fast_accum=True, backend="reference"),
                    repeats)
    row = {"shape": [M, N, K], "model": key, "L": model.L, "F": model.F, "macs": macs,
           "cpemu": {"seconds": t_c, "median_s": statistics.median(t_c), "mac_per_s": macs / statistics.median(t_c)}}
    if torch is None:
        row["mmasim"] = {"skipped": "not run"}
    elif key in rate and repeats * macs / rate[key] > mmasim_max_seconds:
        row["mmasim"] = {"skipped": f"predicted {repeats * macs / rate[key]:.0f} s for {repeats} runs "
                                    f"> --mmasim-max-seconds {mmasim_max_seconds:g}"}
    else:
        sim = simulator(key)
        f8 = torch.float8_e4m3fn
        At, Bt = torch.from_numpy(a).view(f8), torch.from_numpy(bt).view(f8).T
        zero = torch.zeros(M, N, dtype=torch.float32)
        ym, t_m = _timed(lambda: sim(At, Bt, zero), repeats)
        med = statistics.median(t_m)
        rate[key] = max(rate.get(key, 0.0), macs / med)
        theirs = ym.contiguous().view(torch.int32).numpy().view(np.uint32)
        diff = int(np.count_nonzero(y.view(np.uint32) != theirs))
        row["mmasim"] = {"seconds": t_m, "median_s": med, "mac_per_s": macs / med,
                         "simulator": f"mmasim.nv_ptx.{MODELS[key][1]}{MODELS[key][2]!r}"}
        row["identical_bits"] = diff == 0
        row["differing_outputs"] = diff
        row["speedup_cpemu_over_mmasim"] = med / row["cpemu"]["median_s"]
    return row


def _finish(rows: list, repeats: int, env: dict, total: float, out_path: str | None) -> None:
    """The verdict line, the JSON (with --out), and exit 1 when a compared pair differs."""
    compared = [r for r in rows if "identical_bits" in r]
    result = {"tool": "tools/bench_reference.py",
              "work": "out = A @ B, e4m3 x e4m3 gauss40 operands, one fast-accumulation T-FDPA chain over K per "
                      "output from a zero accumulator (no split-K), FP32 output, unit scales; cpemu through "
                      "cpemu.gemm(backend='reference'), MMA-Sim through the simulator's __call__(A, B, C=0)",
              "repeats": repeats, "statistic": "median", "environment": env, "results": rows,
              "all_compared_identical": bool(compared) and all(r["identical_bits"] for r in compared),
              "compared_cases": len(compared), "total_seconds": total}
    verdict = ("none" if not compared else "all bit-identical" if result["all_compared_identical"]
               else "DIFFERENCES FOUND")
    click.echo(f"\n{len(compared)} shape/model pairs compared with MMA-Sim: {verdict}"
               f"; total {total:.0f} s; torch threads {env['torch_threads']}, numpy threads 1, "
               f"{env['usable_cpus']} CPUs")
    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)
        click.echo(f"wrote {out_path}")
    if compared and not result["all_compared_identical"]:
        sys.exit(1)


_header_done = False


def _print_row(r):
    global _header_done
    if not _header_done:
        click.echo(f"{'shape MxNxK':>14} {'model':>7} {'cpemu s':>9} {'cpemu MAC/s':>12} {'mmasim s':>9} "
                   f"{'mmasim MAC/s':>13} {'cpemu/mmasim':>12}  bits")
        _header_done = True
    M, N, K = r["shape"]
    c, m = r["cpemu"], r["mmasim"]
    if "skipped" in m:
        tail = f"{'-':>9} {'-':>13} {'-':>12}  mmasim skipped: {m['skipped']}"
    else:
        same = "identical" if r["identical_bits"] else f"{r['differing_outputs']} DIFFER"
        tail = (f"{m['median_s']:>9.3f} {m['mac_per_s']:>13.3e} {r['speedup_cpemu_over_mmasim']:>11.2f}x  {same}")
    click.echo(f"{f'{M}x{N}x{K}':>14} {r['model']:>7} {c['median_s']:>9.3f} {c['mac_per_s']:>12.3e} {tail}")


if __name__ == "__main__":
    main()
