"""Record torch._scaled_mm outputs on a real GPU for cpemu's designed case suites.

Run on a machine with a CUDA GPU and torch:

    python tools/record_truth.py record --suite core --suite epilogue ... --out DIR
    python tools/record_truth.py probe-errors --out DIR/errors.json

``record`` writes, per suite, ``DIR/<suite>.npz`` (output bit patterns, key = case id)
and ``DIR/<suite>.json`` (each case with the sha256 of its regenerated inputs and of
its output bits, or the error torch raised, and whether two calls agreed), plus the
provenance (GPU, driver, torch, CUDA, cuBLASLt, numpy) in ``DIR/provenance.json``.
``probe-errors`` records which malformed calls torch rejects and with what message.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time

import click
import numpy as np

from cpemu.cases import Case, SUITES, operands, sha256_arrays, suite


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def cublaslt_version():
    """cublasLtGetVersion() of the libcublasLt that torch loaded (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "libcublasLt" in line})
        lib = ctypes.CDLL(paths[0])
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        return {"version": int(lib.cublasLtGetVersion()), "path": paths[0]}
    except Exception as e:  # pragma: no cover - diagnostic only
        return {"error": repr(e)}


def provenance():
    import torch

    if DEVICE == "cpu":
        return {"gpu": None, "torch": torch.__version__, "numpy": np.__version__, "note": "CPU smoke run"}
    p = torch.cuda.get_device_properties(0)
    a = torch.ones(16, 16, device=DEVICE)
    (a @ a).sum().item()  # load cuBLAS / cuBLASLt
    info = {
        "gpu": p.name,
        "sm_count": p.multi_processor_count,
        "compute_capability": f"{p.major}.{p.minor}",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cublaslt": cublaslt_version(),
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }
    try:
        import ml_dtypes

        info["ml_dtypes"] = ml_dtypes.__version__
    except ImportError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
        info["nvidia_smi"] = out.strip()
        info["driver"] = out.split(",")[0].strip()
    except Exception as e:
        info["nvidia_smi"] = repr(e)
    return info


DEVICE = "cuda"  # the recorder's torch device; "cpu" only for smoke tests of this tool

_TORCH_FMT = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_TORCH_OUT = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def _sync():
    import torch

    if DEVICE != "cpu":
        torch.cuda.synchronize()


def run_case(case: Case, repeats: int = 2):
    """Call torch._scaled_mm for ``case``; returns (bits or None, record dict)."""
    import torch

    a, bt, sa, sb, bias = operands(case)
    rec = case.to_json()
    rec["inputs_sha256"] = sha256_arrays(a, bt, sa, sb, bias)
    ta = torch.from_numpy(a).to(DEVICE).view(getattr(torch, _TORCH_FMT[case.a_format]))
    tb = torch.from_numpy(bt).to(DEVICE).view(getattr(torch, _TORCH_FMT[case.b_format])).t()
    tsa = torch.from_numpy(np.ascontiguousarray(sa)).to(DEVICE)
    tsb = torch.from_numpy(np.ascontiguousarray(sb)).to(DEVICE)
    out_dt = getattr(torch, _TORCH_OUT[case.out_dtype])
    tbias = None
    if bias is not None:
        tbias = torch.from_numpy(bias.view(np.int16)).to(DEVICE).view(
            torch.float16 if case.out_dtype == "float16" else torch.bfloat16)
    outs = []
    try:
        for _ in range(repeats):
            y = torch._scaled_mm(ta, tb, scale_a=tsa, scale_b=tsb, bias=tbias, out_dtype=out_dt,
                                 use_fast_accum=case.fast_accum)
            _sync()
            ibits = torch.int32 if y.dtype == torch.float32 else torch.int16
            outs.append(y.contiguous().view(ibits).cpu().numpy().view(np.uint32 if ibits == torch.int32 else np.uint16))
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        return None, rec
    rec["deterministic"] = all(np.array_equal(outs[0], o) for o in outs[1:])
    rec["output_sha256"] = sha256_arrays(outs[0])
    rec["output_shape"] = list(outs[0].shape)
    return outs[0], rec


@click.group()
@click.option("--device", default="cuda", show_default=True, help="torch device (cpu: smoke test of the tool only).")
def cli(device):
    """Record torch._scaled_mm truth on this machine's GPU."""
    global DEVICE
    DEVICE = device


@cli.command()
@click.option("--suite", "suites", multiple=True, type=click.Choice(SUITES), help="Suites to record (default: all).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False))
@click.option("--repeats", default=2, show_default=True, help="Calls per case (a bit difference flags nondeterminism).")
def record(suites, out_dir, repeats):
    """Record the designed suites into OUT_DIR."""
    os.makedirs(out_dir, exist_ok=True)
    _write_json(os.path.join(out_dir, "provenance.json"), provenance())
    for name in suites or SUITES:
        recs = record_suite(name, out_dir, repeats)
        nerr = sum("error" in r for r in recs)
        nnd = sum(not r.get("deterministic", True) for r in recs)
        print(f"[{name}] {len(recs)} cases, {nerr} rejected by torch, {nnd} nondeterministic", flush=True)


def record_suite(name: str, out_dir: str, repeats: int = 2, progress=None) -> list[dict]:
    """Record one suite into ``out_dir/<name>.npz`` and ``<name>.json`` (written last, atomically)."""
    cases = suite(name)
    bits, recs = {}, []
    t0 = time.time()
    for i, case in enumerate(cases):
        y, rec = run_case(case, repeats)
        if y is not None:
            bits[case.id] = y
        recs.append(rec)
        if progress:
            progress(i + 1, len(cases))
        elif (i + 1) % 20 == 0 or i + 1 == len(cases):
            print(f"[{name}] {i + 1}/{len(cases)} {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    tmp = os.path.join(out_dir, f"{name}.tmp.npz")
    np.savez_compressed(tmp, **bits)
    os.replace(tmp, os.path.join(out_dir, f"{name}.npz"))
    _write_json(os.path.join(out_dir, f"{name}.json"), {"suite": name, "cases": recs})
    return recs


def _bad_calls():
    """Malformed calls and what they probe: (name, thunk)."""
    import torch

    f8, f8b = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.ones((), device=DEVICE)

    def A(M, K, dt=f8):
        return torch.zeros(M, K, device=DEVICE).to(dt)

    def B(K, N, dt=f8):
        return torch.zeros(N, K, device=DEVICE).to(dt).t()

    mm = torch._scaled_mm
    return [
        ("ok_16x16x16", lambda: mm(A(16, 16), B(16, 16), one, one, out_dtype=torch.bfloat16)),
        ("ok_M1", lambda: mm(A(1, 16), B(16, 16), one, one, out_dtype=torch.bfloat16)),
        ("ok_M3", lambda: mm(A(3, 32), B(32, 16), one, one, out_dtype=torch.bfloat16)),
        ("K_not_mult16", lambda: mm(A(16, 24), B(24, 16), one, one, out_dtype=torch.bfloat16)),
        ("N_not_mult16", lambda: mm(A(16, 32), B(32, 24), one, one, out_dtype=torch.bfloat16)),
        ("K_mismatch", lambda: mm(A(16, 32), B(48, 16), one, one, out_dtype=torch.bfloat16)),
        ("b_row_major", lambda: mm(A(16, 32), torch.zeros(32, 16, device=DEVICE).to(f8), one, one,
                                   out_dtype=torch.bfloat16)),
        ("a_col_major", lambda: mm(torch.zeros(32, 16, device=DEVICE).to(f8).t(), B(32, 16), one, one,
                                   out_dtype=torch.bfloat16)),
        ("a_bf16", lambda: mm(A(16, 32, torch.bfloat16), B(32, 16), one, one, out_dtype=torch.bfloat16)),
        ("e5m2_e5m2", lambda: mm(A(16, 32, f8b), B(32, 16, f8b), one, one, out_dtype=torch.bfloat16)),
        ("out_fp8", lambda: mm(A(16, 32), B(32, 16), one, one, out_dtype=f8)),
        ("scale_a_fp64", lambda: mm(A(16, 32), B(32, 16), one.double(), one, out_dtype=torch.bfloat16)),
        ("scale_a_2elems", lambda: mm(A(16, 32), B(32, 16), torch.ones(2, device=DEVICE), one,
                                      out_dtype=torch.bfloat16)),
        ("scale_a_1elem_1d", lambda: mm(A(16, 32), B(32, 16), torch.ones(1, device=DEVICE), one,
                                        out_dtype=torch.bfloat16)),
        ("rowwise_ok", lambda: mm(A(16, 32), B(32, 16), torch.ones(16, 1, device=DEVICE),
                                  torch.ones(1, 16, device=DEVICE), out_dtype=torch.bfloat16)),
        ("rowwise_fp32_out", lambda: mm(A(16, 32), B(32, 16), torch.ones(16, 1, device=DEVICE),
                                        torch.ones(1, 16, device=DEVICE), out_dtype=torch.float32)),
        ("rowwise_only_a", lambda: mm(A(16, 32), B(32, 16), torch.ones(16, 1, device=DEVICE), one,
                                      out_dtype=torch.bfloat16)),
        ("rowwise_wrong_shape", lambda: mm(A(16, 32), B(32, 16), torch.ones(1, 16, device=DEVICE),
                                           torch.ones(16, 1, device=DEVICE), out_dtype=torch.bfloat16)),
        ("rowwise_e5m2", lambda: mm(A(16, 32), B(32, 16, f8b), torch.ones(16, 1, device=DEVICE),
                                    torch.ones(1, 16, device=DEVICE), out_dtype=torch.bfloat16)),
        ("bias_fp32_out_bf16", lambda: mm(A(16, 32), B(32, 16), one, one, bias=torch.zeros(16, device=DEVICE),
                                          out_dtype=torch.bfloat16)),
        ("bias_bf16_out_fp32", lambda: mm(A(16, 32), B(32, 16), one, one,
                                          bias=torch.zeros(16, device=DEVICE, dtype=torch.bfloat16),
                                          out_dtype=torch.float32)),
        ("bias_fp16_out_bf16", lambda: mm(A(16, 32), B(32, 16), one, one,
                                          bias=torch.zeros(16, device=DEVICE, dtype=torch.float16),
                                          out_dtype=torch.bfloat16)),
        ("bias_wrong_len", lambda: mm(A(16, 32), B(32, 16), one, one,
                                      bias=torch.zeros(32, device=DEVICE, dtype=torch.bfloat16),
                                      out_dtype=torch.bfloat16)),
        ("scale_inf", lambda: mm(A(16, 32), B(32, 16), one * float("inf"), one, out_dtype=torch.bfloat16)),
        ("scale_cpu", lambda: mm(A(16, 32), B(32, 16), torch.ones(()), one, out_dtype=torch.bfloat16)),
        ("a_3d", lambda: mm(torch.zeros(2, 16, 32, device=DEVICE).to(f8), B(32, 16), one, one,
                            out_dtype=torch.bfloat16)),
        ("empty_M0", lambda: mm(A(0, 32), B(32, 16), one, one, out_dtype=torch.bfloat16)),
    ]


@cli.command("probe-errors")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False))
def probe_errors(out_path):
    """Record which malformed calls torch._scaled_mm rejects, and its messages."""
    import torch

    rows = []
    for name, thunk in _bad_calls():
        try:
            y = thunk()
            _sync()
            rows.append({"name": name, "accepted": True, "out_shape": list(y.shape), "out_dtype": str(y.dtype)})
        except Exception as e:
            rows.append({"name": name, "accepted": False, "error": f"{type(e).__name__}: {e}"[:2000]})
    _write_json(out_path, {"torch": torch.__version__, "calls": rows})
    for r in rows:
        print(r["name"], "accepted" if r["accepted"] else "REJECTED: " + r["error"].splitlines()[0][:150])


if __name__ == "__main__":
    cli()
