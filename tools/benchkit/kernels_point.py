"""One configuration (shape, data, M) of ``tools/bench_kernels.py``: operands, every backend, the
native baseline, and the exactness checks between them."""

from __future__ import annotations

import dataclasses
import time
import traceback

import numpy as np

from benchkit import FMT
from benchkit.exactness import compare, reference_rows, sha256
from benchkit.gpu import cublaslt_info
from benchkit.kernels_backends import may_run, run_kernel, run_native
from benchkit.kernels_session import Bench
from cpemu.cases import Case, operands, sha256_arrays
from cpemu.schedule import UnsupportedShape


@dataclasses.dataclass(frozen=True)
class Point:
    """A configuration: the weight's shape (label, N, K), the data (label, cpemu.cases kind), M,
    its case (operands regenerate from it) and the profile's plan."""

    label: str
    N: int
    K: int
    data_label: str
    kind: str
    M: int
    case: Case
    plan: object = None

    @property
    def macs(self) -> int:
        return self.M * self.N * self.K

    @property
    def where(self) -> dict:
        return {"shape": self.label, "N": self.N, "K": self.K, "data": self.data_label, "M": self.M}

    @property
    def tag(self) -> str:
        return f"{self.label} {self.data_label} M={self.M}"

    def base(self, kernel: str) -> dict:
        return dict(self.where, kernel=kernel, macs=self.macs, case_id=self.case.id)


def run_config(bench: Bench, label, N, K, data_label, kind, M) -> None:
    """Every backend (and the native baseline) on one configuration, appended to the record."""
    s = bench.s
    case = Case(M, N, K, data=kind, seed=s.seed, a_format=FMT, b_format=FMT, fast_accum=s.fast_accum,
                out_dtype=s.out_dtype)
    pt = Point(label, N, K, data_label, kind, M, case)
    try:
        pt = dataclasses.replace(pt, plan=bench.prof.plan(M, N, K, s.fast_accum, "tensorwise", FMT, FMT,
                                                          s.out_dtype))
    except UnsupportedShape as e:
        for n in bench.kernels + (["native"] if bench.native_on else []):
            bench.rec["results" if n != "native" else "native"].append(
                bench.skip(dict(pt.where, kernel=n, macs=pt.macs), f"{n} {pt.tag}", f"UnsupportedShape: {e}"))
        bench.done += len(bench.kernels) + (1 if bench.native_on else 0)
        return
    if not bench.native_on and not any(may_run(bench, n, pt.macs) for n in bench.kernels):
        for n in bench.kernels:  # every backend skips this configuration: no operands needed
            r, _ = run_kernel(bench, pt, n, pt.base(n), None, {})
            bench.rec["results"].append(r)
            bench.rec["exactness"].append(dict(pt.where, kernel=n, status=r.get("status"), reason=r.get("reason")))
            bench.done += 1
        return
    ops, want, rows = _operands(bench, pt)
    dev = _upload(bench, ops)
    results, outputs = _run_kernels(bench, pt, ops, dev)
    if bench.native_on:
        _native(bench, pt, ops, results, outputs)
    check_exactness(bench, pt, results, outputs, want, rows)
    del dev, outputs
    _free(bench)


def _operands(bench: Bench, pt: Point):
    """The host operands (a, bt, sa, sb), recorded with their sha256 and the plan, and the
    reference's bits of the first --check-rows rows (or None): (ops, want, rows)."""
    bench.progress(f"{pt.tag}: generating operands")
    t0 = time.perf_counter()
    a, bt, sa, sb, _ = operands(pt.case)
    gen_s = time.perf_counter() - t0
    bench.rec["operands"].append(dict(pt.where, case=pt.case.to_json(), generate_s=gen_s,
                                      sha256=sha256_arrays(a, bt, sa, sb, None),
                                      plan={"slices": [list(s) for s in pt.plan.slices],
                                            "promotion": pt.plan.promotion}))
    rows = min(bench.s.check_rows, pt.M)
    want = None
    if rows:
        bench.progress(f"{pt.tag}: reference rows")
        t0 = time.perf_counter()
        want = reference_rows(a, bt, pt.plan, bench.model, bench.mode, sa.reshape(()), sb.reshape(()),
                              bench.s.out_dtype, rows)
        bench.rec["operands"][-1]["reference_rows_s"] = time.perf_counter() - t0
    return (a, bt, sa, sb), want, rows


def _upload(bench: Bench, ops) -> dict:
    """Device copies of the operands and scales, where the GPU is used."""
    dev = {}
    if bench.runnable_cuda or bench.native_on:
        cp = bench.cp
        a, bt, sa, sb = ops
        with bench.stream:
            dev["a"] = cp.asarray(a)
            dev["bt"] = cp.asarray(bt)
            dev["sa"] = cp.asarray(sa.reshape(1).astype(np.float32))
            dev["sb"] = cp.asarray(sb.reshape(1).astype(np.float32))
        bench.stream.synchronize()
    return dev


def _error(base: dict, e: Exception) -> dict:
    return dict(base, status="error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])


def _run_kernels(bench: Bench, pt: Point, ops, dev: dict):
    """Every backend of the run: (records by name, host output bits by name)."""
    outputs: dict = {}
    results: dict = {}
    for name in bench.kernels:
        bench.progress(f"{pt.tag}: {name}")
        base = pt.base(name)
        try:
            r, out = run_kernel(bench, pt, name, base, ops, dev)
        except Exception as e:  # noqa: BLE001 - a failing kernel is recorded and the run goes on
            r, out = _error(base, e), None
            bench.fail(f"{name} {pt.tag}: {type(e).__name__}: {e}")
        if out is not None:
            outputs[name] = out
            r["output_sha256"] = sha256(out)
            if r.get("tmacs"):
                bench.best_rate[name] = max(bench.best_rate.get(name, 0.0), r["tmacs"] * 1e12)
        results[name] = r
        bench.rec["results"].append(r)
        bench.done += 1
        if r.get("status") == "ok":
            bench.log(f"{name:12s} {pt.tag:28s} {r['ms']:11.4f} ms  {r['tmacs']:.4g} TMAC/s"
                      + (f"  {r['mac_per_clock_per_sm']:.3g} MAC/clk/SM" if r.get("mac_per_clock_per_sm") else "")
                      + (" (single call)" if r.get("timing") == "single-call" else "")
                      + (" (host-bound)" if r.get("host_bound") else ""))
    return results, outputs


def _native(bench: Bench, pt: Point, ops, results: dict, outputs: dict) -> None:
    """The native baseline: timed, its output compared with cpemu's (a warning, not a failure),
    and every backend's TMAC/s divided by its TMAC/s."""
    bench.progress(f"{pt.tag}: native torch._scaled_mm")
    base = pt.base("native")
    try:
        nr, nout = run_native(bench, base, ops, pt.macs)
    except Exception as e:  # noqa: BLE001
        nr, nout = _error(base, e), None
        bench.warn(f"native {pt.tag}: {type(e).__name__}: {e}")
    if nout is not None:
        nr["output_sha256"] = sha256(nout)
        against = "cuda-simple" if "cuda-simple" in outputs else next(iter(outputs), None)
        if against is not None:
            c = compare(nout, outputs[against])
            nr["matches_cpemu"] = dict(c, against=against)
            if not c["ok"]:
                bench.warn(f"native torch._scaled_mm differs from cpemu ({against}, profile {bench.prof.name}) on "
                           f"{pt.tag}: {c['mismatches']} of {c['compared']} outputs (first: "
                           f"{c['first_mismatches'][:2]})")
    ratios = {}
    for name, r in results.items():
        if r.get("status") == "ok" and nr.get("status") == "ok" and r.get("tmacs") and nr.get("tmacs"):
            r["vs_native"] = r["tmacs"] / nr["tmacs"]
            ratios[name] = r["vs_native"]
    nr["kernel_tmacs_over_native"] = ratios
    if nr.get("status") == "ok" and "cublaslt" not in bench.rec["device"]:
        bench.rec["device"]["cublaslt"] = cublaslt_info()
    bench.rec["native"].append(nr)
    bench.done += 1
    if nr.get("status") == "ok":
        bench.log(f"{'native':12s} {pt.tag:28s} {nr['ms']:11.4f} ms  {nr['tmacs']:.4g} TMAC/s"
                  + (f"  {nr['mac_per_clock_per_sm']:.3g} MAC/clk/SM" if nr.get("mac_per_clock_per_sm") else ""))


def check_exactness(bench: Bench, pt: Point, results: dict, outputs: dict, want, rows: int) -> None:
    """Every backend's output against the reference's first rows and against cuda-simple's full
    output (cuda-tiled's where cuda-simple did not run: it equals cuda-simple wherever both ran),
    and the api output against the direct one; each mismatch is a failure."""
    base_name = "cuda-simple" if "cuda-simple" in outputs else ("cuda-tiled" if "cuda-tiled" in outputs else None)
    simple = outputs.get(base_name) if base_name else None
    for name in bench.kernels:
        r = results[name]
        ex = dict(pt.where, kernel=name)
        if name not in outputs:
            ex.update(status=r.get("status"), reason=r.get("reason") or r.get("error"))
            bench.rec["exactness"].append(ex)
            continue
        got = outputs[name]
        ex["status"] = "checked"
        if want is not None:
            c = compare(got, want)
            ex["vs_reference_rows"] = dict(c, rows=rows)
            if not c["ok"]:
                bench.fail(f"{name} {pt.tag}: first {rows} rows differ from the reference: {c['mismatches']} "
                           f"outputs, first {c['first_mismatches'][:3]}")
        if name != base_name:
            ex["vs_cuda_simple"] = _vs_base(bench, pt, name, got, simple, base_name, results)
        api = r.get("api") or {}
        if "matches_direct" in api:
            ex["api_vs_direct"] = api["matches_direct"]
            if not api["matches_direct"]["ok"]:
                bench.fail(f"{name} {pt.tag}: cpemu.gemm output differs from gemm_cuda's: "
                           f"{api['matches_direct']['mismatches']} outputs")
        ex["ok"] = all(ex[k]["ok"] is not False for k in ("vs_reference_rows", "vs_cuda_simple", "api_vs_direct")
                       if k in ex)
        bench.rec["exactness"].append(ex)


def _vs_base(bench: Bench, pt: Point, name: str, got, simple, base_name, results: dict) -> dict:
    """The full output of ``name`` against the base backend's (cuda-simple's or cuda-tiled's)."""
    if simple is None:
        sr = results.get("cuda-simple")
        return {"ok": None, "reason": "cuda-simple not selected" if sr is None else
                f"cuda-simple {sr.get('status')}: {sr.get('reason') or sr.get('error')}"}
    c = compare(got, simple)
    if not c["ok"]:
        bench.fail(f"{name} {pt.tag}: full output differs from {base_name}: {c['mismatches']} outputs, "
                   f"first {c['first_mismatches'][:3]}")
    return dict(c, against=base_name)


def _free(bench: Bench) -> None:
    """Free the device memory pools between configurations."""
    if bench.cp is not None:
        bench.stream.synchronize()
        try:
            bench.cp.get_default_memory_pool().free_all_blocks()
            if bench.torch is not None:
                bench.torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
