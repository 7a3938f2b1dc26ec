"""The record of ``tools/bench_kernels.py``: its first fields, and the command line that repeats the run."""

from __future__ import annotations

import os
import platform
import shlex
import sys

from benchkit import FMT
from benchkit.clocks import clock_record
from benchkit.launchers import DIRECT_CALL_SPELLED
from benchkit.provenance import code_fingerprint, git_state, package_versions, reference_threads, utc

TOOL = "tools/bench_kernels.py"
TOOL_VERSION = "1.0.0"

DATA_NOTES = {"gauss40": "N(0, 40^2) rounded to e4m3 (RNE, clipped to +-448)",
              "adversarial": "cpemu.cases 'spread': per row one element in each 32 K-elements (same position for "
                             "all rows of the operand) of magnitude U(64, 448), the rest N(0, 2^-6): every T-FDPA "
                             "step aligns to a large exponent and truncates the small products (maximal truncation "
                             "and exponent spread)"}

TIMING_METHOD = {
    "cuda": "cupy CUDA events on one non-blocking cupy stream around back-to-back launches; first call, warm-up >= "
            "min(1 s, window_s) in growing batches calibrating launches per window, then >= `windows` windows each "
            ">= window_s; ms = median over windows of window time / launches",
    "cuda_call": f"direct: {DIRECT_CALL_SPELLED} with plan = profile.plan(M, N, K, fast_accum, 'tensorwise', "
                 "'e4m3', 'e4m3', out_dtype), as cpemu.gemm calls it; `api` (where the direct call < api_max_ms): "
                 "cpemu.gemm(a_dev, bt_dev.T, a_format='e4m3', b_format='e4m3', profile=..., scale_a=..., "
                 "scale_b=..., out_dtype=..., fast_accum=..., backend=name) on the same cupy arrays",
    "native": "torch._scaled_mm on the same stream (torch.cuda.ExternalStream of the cupy stream), the same events "
              "and windows",
    "reference": "a host backend (reference, cpu-fp32): cpemu.gemm(numpy operands, backend=name), time.perf_counter, "
                 "first call then windows",
    "tmacs": "M*N*K / (ms/1e3) / 1e12",
    "mac_per_clock_per_sm": "M*N*K / seconds / (median SM clock during the windows, Hz) / SM count"}

#: The settings of a run recorded under ``config`` (after formats, scales and the grid).
_CONFIG_SETTINGS = ("window_s", "windows", "check_rows", "max_call_s", "max_check_call_s", "reference_max_macs",
                    "api_max_ms")


def new_record(params: dict, prof, shape_list, m_list, data_list, s) -> dict:
    """The record before the run: the tool, the command, the machine, the code, the profile and the
    settings ``s`` (:class:`benchkit.kernels_session.Settings`); ``params``: click's parameters."""
    return {
        "tool": TOOL, "tool_version": TOOL_VERSION,
        "command_line": shlex.join([os.path.basename(sys.executable)] + sys.argv),
        "command_line_explicit": None,
        "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in params.items()},
        "started_utc": utc(), "complete": False,
        "host": {"hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
                 "cpu_count": os.cpu_count()},
        "packages": package_versions(), "git": git_state(), "code": code_fingerprint(),
        "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CPEMU_CUDA_FROM_SOURCE", "CPEMU_THREADS")},
        "reference_threads": reference_threads(),
        "profile": {"name": prof.name, "status": prof.status, "instruction": prof.instruction.to_json()},
        "config": {"a_format": FMT, "b_format": FMT, "scales": "unit tensorwise (cpemu.cases scale='unit')",
                   "fast_accum": s.fast_accum, "out_dtype": s.out_dtype, "seed": s.seed,
                   "shapes": [{"label": lbl, "N": n, "K": k} for lbl, n, k in shape_list], "M": m_list,
                   "data": [{"label": lbl, "cpemu_cases_kind": kind} for lbl, kind in data_list],
                   "data_notes": dict(DATA_NOTES), **{k: getattr(s, k) for k in _CONFIG_SETTINGS}},
        "timing_method": dict(TIMING_METHOD),
        "device": None, "clock": clock_record(),
        "validation": {}, "results": [], "native": [], "exactness": [], "skipped": [], "operands": [],
    }


def explicit_command(kernel_list, profile: str, shape_list, m_list, data_list, s, out_path: str,
                     native: bool) -> str:
    """The command line that repeats the run with every option spelled out."""
    return shlex.join(
        ["python", TOOL, "--kernels", ",".join(kernel_list), "--profile", str(profile)]
        + [x for lbl, _, _ in shape_list for x in ("--shape", lbl)]
        + ["--M", ",".join(map(str, m_list)), "--data", ",".join(lbl for lbl, _ in data_list),
           "--fast-accum" if s.fast_accum else "--no-fast-accum", "--out-dtype", s.out_dtype,
           "--window-s", repr(s.window_s), "--windows", str(s.windows), "--out", str(out_path),
           "--native" if native else "--no-native", "--seed", str(s.seed), "--check-rows", str(s.check_rows),
           "--max-call-s", repr(s.max_call_s), "--max-check-call-s", repr(s.max_check_call_s),
           "--reference-max-macs", repr(s.reference_max_macs), "--api-max-ms", repr(s.api_max_ms)])
