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
``reference`` runs on the CPU through ``cpemu.gemm(..., backend="reference")`` on numpy
arrays, timed with ``time.perf_counter`` (first call, then windows as above), and only where
M*N*K <= ``--reference-max-macs`` (default 2e9); ``--kernels reference --no-native`` never
imports cupy.

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
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback

import click
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cpemu  # noqa: E402
from cpemu import reference as ref  # noqa: E402
from cpemu.backends import LADDER  # noqa: E402
from cpemu.cases import DATA_KINDS, EVO2_SHAPES, Case, operands, sha256_arrays  # noqa: E402
from cpemu.formats import FP8_FORMATS, OUT_DTYPES, encode_output  # noqa: E402
from cpemu.profile import get_profile  # noqa: E402
from cpemu.schedule import UnsupportedShape  # noqa: E402

TOOL = "tools/bench_kernels.py"
TOOL_VERSION = "1.0.0"
DATA_ALIASES = {"adversarial": "spread"}
DEFAULT_MS = "16,64,256,1024,2048,8192"
DEFAULT_SHAPES = ("evo2-1b", "evo2-7b", "evo2-40b")
FMT = "e4m3"
#: nvidia-smi sampling period (seconds) and the fields sampled.
CLOCK_PERIOD_S = 0.1
CLOCK_FIELDS = ("clocks.sm", "power.draw", "temperature.gpu")
HOST_BOUND = 0.9
#: Batches of at most this many launches never fill the driver's queue of pending launches.
QUEUE_SAFE_LAUNCHES = 128
MAX_LAUNCHES = 1_000_000


# ---------------------------------------------------------------- argument parsing


def parse_shape(text: str) -> tuple[str, int, int]:
    """``evo2-1b`` / ``evo2-7b`` / ``evo2-40b`` or ``NxK`` -> (label, N, K)."""
    t = text.strip().lower()
    if t in EVO2_SHAPES:
        N, K = EVO2_SHAPES[t]
        return t, int(N), int(K)
    parts = t.split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise click.BadParameter(f"{text!r}: expected one of {sorted(EVO2_SHAPES)} or NxK (e.g. 5760x1920)",
                                 param_hint="--shape")
    N, K = int(parts[0]), int(parts[1])
    if N <= 0 or K <= 0 or N % 16 or K % 16:
        raise click.BadParameter(f"{text!r}: N and K must be positive multiples of 16 (torch._scaled_mm's rule)",
                                 param_hint="--shape")
    return f"{N}x{K}", N, K


def parse_int_list(text: str, hint: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a comma list of integers", param_hint=hint) from None
    if not vals or any(v <= 0 for v in vals):
        raise click.BadParameter(f"{text!r}: expected positive integers", param_hint=hint)
    return vals


def parse_data(text: str) -> list[tuple[str, str]]:
    """Comma list of data labels -> [(label, cpemu.cases data kind)]."""
    out = []
    for label in (x.strip() for x in text.split(",")):
        if not label:
            continue
        kind = DATA_ALIASES.get(label, label)
        if kind not in DATA_KINDS:
            raise click.BadParameter(f"{label!r}: expected gauss40, adversarial or a data kind of cpemu.cases "
                                     f"{DATA_KINDS}", param_hint="--data")
        out.append((label, kind))
    if not out:
        raise click.BadParameter("no data kind given", param_hint="--data")
    return out


def parse_kernels(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise click.BadParameter("no backend given", param_hint="--kernels")
    for n in names:
        if n not in LADDER:
            raise click.BadParameter(f"{n!r}: not a backend of cpemu.backends.LADDER {LADDER}",
                                     param_hint="--kernels")
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------- environment


def package_versions() -> dict:
    out = {}
    for dist in ("cpemu", "numpy", "ml_dtypes", "click", "cupy-cuda13x", "cupy-cuda12x", "cupy", "torch"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001 - broken metadata must not stop a benchmark
            out[dist] = f"unknown ({type(e).__name__})"
    out["cpemu (imported)"] = getattr(cpemu, "__version__", None)
    out["numpy (imported)"] = np.__version__
    return out


def git_state() -> dict | None:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], check=False, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        st = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                            check=False, capture_output=True, text=True, timeout=10)
        return {"commit": head.stdout.strip(), "modified_tracked_files": st.stdout.split("\n")[:20]
                if st.stdout.strip() else []}
    except Exception:  # noqa: BLE001 - no git: no record of it
        return None


#: What decides the numbers a benchmark measures: the package, the CUDA sources and the fatbins.
CODE_GLOBS = ("cpemu/**/*.py", "cpemu/profile_data/*.json", "cuda_src/*", "bin/*.fatbin", "bin/manifest.json")


def code_fingerprint(root: str | None = None) -> dict:
    """sha256 over the files of CODE_GLOBS (path and bytes, sorted by path): identifies the code a
    record was measured with even where the checkout's git metadata is stale or missing."""
    import glob

    root = root or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    paths = sorted({os.path.relpath(p, root).replace(os.sep, "/")
                    for g in CODE_GLOBS for p in glob.glob(os.path.join(root, g), recursive=True)
                    if os.path.isfile(p)})
    h = hashlib.sha256()
    for rel in paths:
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return {"sha256": h.hexdigest(), "files": len(paths), "globs": list(CODE_GLOBS)}


def record_header(tool: str) -> dict:
    """The first fields of a smaller benchmark tool's record (bench_dropin, bench_tiled_geometry):
    the tool, its command line, the start time, and what identifies the code and packages."""
    return {"tool": tool, "command_line": " ".join(shlex.quote(x) for x in sys.argv), "started_utc": _utc(),
            "packages": package_versions(), "git": git_state(), "code": code_fingerprint()}


def _reference_threads():
    from cpemu import reference

    try:
        return reference.threads_default()
    except ValueError as e:  # a bad CPEMU_THREADS: the reference backend would refuse it too
        return str(e)


def _num(s: str):
    try:
        v = float(s.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", ...
    return v if math.isfinite(v) else None


def _pci_key(bus_id: str):
    """'00000000:1B:00.0' and '0000:1b:00.0' -> (0, 0x1b, '00.0')."""
    try:
        dom, bus, rest = bus_id.strip().split(":")
        return int(dom, 16), int(bus, 16), rest.lower()
    except (ValueError, AttributeError):
        return None


def find_nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


def nvidia_smi_gpus(exe: str) -> tuple[list[dict], str | None]:
    """Static info of every GPU nvidia-smi sees (fields that this nvidia-smi refuses are dropped)."""
    fields = ["index", "pci.bus_id", "name", "driver_version", "clocks.max.sm", "power.limit"]
    last = None
    for fs in (fields, fields[:4]):
        try:
            r = subprocess.run([exe, "--query-gpu=" + ",".join(fs), "--format=csv,noheader,nounits"],
                               check=False, capture_output=True, text=True, timeout=30)
        except Exception as e:  # noqa: BLE001
            return [], f"{type(e).__name__}: {e}"
        if r.returncode == 0:
            gpus = []
            for line in r.stdout.strip().splitlines():
                vals = [v.strip() for v in line.split(",")]
                if len(vals) == len(fs):
                    gpus.append(dict(zip(fs, vals)))
            return gpus, None
        last = (r.stderr or r.stdout).strip()[:500]
    return [], f"nvidia-smi failed: {last}"


class ClockSampler:
    """Samples SM clock (MHz), power (W) and temperature (C) with nvidia-smi about every
    ``period`` seconds in a background thread; each sample is stamped with the wall time
    (``time.time()``) of the middle of its query."""

    def __init__(self, exe: str, index: str | None, period: float = CLOCK_PERIOD_S):
        self.exe, self.index, self.period = exe, index, period
        self.fields = list(CLOCK_FIELDS)
        self.samples: list[list] = []  # [t_wall, sm_mhz, power_w, temp_c]
        self.errors: list[str] = []
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def _cmd(self):
        cmd = [self.exe, "--query-gpu=" + ",".join(self.fields), "--format=csv,noheader,nounits"]
        if self.index is not None:
            cmd += ["-i", str(self.index)]
        return cmd

    def query(self):
        """One sample [t, sm_mhz, power_w, temp_c], or raise RuntimeError."""
        t0 = time.time()
        r = subprocess.run(self._cmd(), check=False, capture_output=True, text=True, timeout=10)
        t1 = time.time()
        if r.returncode != 0:
            raise RuntimeError(f"nvidia-smi exit {r.returncode}: {(r.stderr or r.stdout).strip()[:300]}")
        line = (r.stdout.strip().splitlines() or [""])[0]
        vals = [v.strip() for v in line.split(",")]
        if len(vals) != len(self.fields):
            raise RuntimeError(f"unexpected nvidia-smi output {line!r}")
        d = dict(zip(self.fields, (_num(v) for v in vals)))
        return [round((t0 + t1) / 2, 4), d.get("clocks.sm"), d.get("power.draw"), d.get("temperature.gpu")]

    def start(self) -> bool:
        """First query in the caller's thread (falls back to the SM clock alone), then the thread."""
        try:
            first = self.query()
        except Exception as e:  # noqa: BLE001
            self.fields = ["clocks.sm"]
            try:
                first = self.query()
                self.errors.append(f"full query failed, sampling clocks.sm only: {e}")
            except Exception as e2:  # noqa: BLE001
                self.error = f"{type(e2).__name__}: {e2}"
                return False
        self.samples.append(first)
        self._thread = threading.Thread(target=self._run, name="nvidia-smi-sampler", daemon=True)
        self._thread.start()
        return True

    def _run(self):
        consecutive = 0
        next_t = time.time() + self.period
        while not self._stop.wait(max(0.0, next_t - time.time())):
            next_t = max(next_t + self.period, time.time())
            try:
                s = self.query()
                consecutive = 0
                with self._lock:
                    self.samples.append(s)
            except Exception as e:  # noqa: BLE001
                consecutive += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{type(e).__name__}: {e}")
                if consecutive >= 20:
                    self.error = f"stopped after 20 failed queries in a row: {e}"
                    return

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def snapshot(self) -> list[list]:
        with self._lock:
            return list(self.samples)

    def summary(self, t0: float, t1: float) -> dict | None:
        """Median SM clock (and power, max temperature) of the samples taken in [t0, t1]
        (wall time); when none fell inside, the nearest sample within 1 s."""
        samples = self.snapshot()
        idx = [i for i, s in enumerate(samples) if t0 <= s[0] <= t1 and s[1] is not None]
        nearest = False
        if not idx:
            mid = (t0 + t1) / 2
            cand = [(abs(s[0] - mid), i) for i, s in enumerate(samples) if s[1] is not None]
            if not cand or min(cand)[0] > (t1 - t0) / 2 + 1.0:
                return None
            idx, nearest = [min(cand)[1]], True
        mhz = [samples[i][1] for i in idx]
        pw = [samples[i][2] for i in idx if samples[i][2] is not None]
        tc = [samples[i][3] for i in idx if samples[i][3] is not None]
        return {"samples": len(idx), "sample_index_range": [idx[0], idx[-1]], "nearest_only": nearest,
                "sm_mhz_median": statistics.median(mhz), "sm_mhz_min": min(mhz), "sm_mhz_max": max(mhz),
                "power_w_median": statistics.median(pw) if pw else None, "temp_c_max": max(tc) if tc else None}


# ---------------------------------------------------------------- timing


def _window_stats(kept: list[dict]) -> dict:
    ms = [w["ms_per_call"] for w in kept]
    return {"ms": statistics.median(ms), "windows_ms_per_call": ms, "window_s": [w["elapsed_s"] for w in kept],
            "launches_per_window": [w["launches"] for w in kept],
            "host_enqueue_ms_per_call": statistics.median(w["host_ms_per_call"] for w in kept)}


def grid_options(m_default: str):
    """The --shape, --M, --data and --profile options of the smaller benchmark tools
    (bench_dropin, bench_tiled_geometry), parsed by parse_shape / parse_int_list / parse_data."""
    opts = [click.option("--shape", "shapes", multiple=True, help="Repeatable: evo2-1b, evo2-7b, evo2-40b or NxK. "
                         "Default: the three Evo 2 shapes."),
            click.option("--M", "m_list", default=m_default, show_default=True, help="Comma list of M"),
            click.option("--data", default="gauss40", show_default=True,
                         help="Comma list: gauss40, adversarial, ..."),
            click.option("--profile", default="hopper-h200-torch", show_default=True)]

    def apply(f):
        for opt in reversed(opts):  # click lists the outermost option first
            f = opt(f)
        return f

    return apply


def write_json(rec: dict, path: str) -> None:
    """Write a record atomically: a temporary file beside ``path``, then a rename."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(rec, fh, indent=1, default=_json_default)
    os.replace(tmp, path)


def finish(rec: dict, path: str) -> None:
    """The end of a benchmark tool: write the record, say where, and exit 1 after printing
    its failures (``rec["failures"]``) if it has any."""
    write_json(rec, path)
    click.echo(f"wrote {path}")
    if rec["failures"]:
        for msg in rec["failures"]:
            click.echo(f"FAIL: {msg}", err=True)
        sys.exit(1)


def time_device(cp, stream, launch, *, window_s: float, windows: int, max_call_s: float, warmup_s: float):
    """Event-timed windows of back-to-back ``launch()`` calls on ``stream``.

    Returns ``(first_output, record)``; the record has the wall-time span of the timed part
    (``span``) for the clock samples."""

    def timed(n: int):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        h0 = time.perf_counter()
        start.record(stream)
        for _ in range(n):
            launch()
        end.record(stream)
        h1 = time.perf_counter()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3, h1 - h0

    wall0 = time.time()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    out = launch()
    end.record(stream)
    end.synchronize()
    first = cp.cuda.get_elapsed_time(start, end) / 1e3
    rec = {"first_call_ms": first * 1e3}
    if first > max_call_s:
        rec.update({"timing": "single-call", "ms": first * 1e3, "windows_ms_per_call": [first * 1e3],
                    "window_s": [first], "launches_per_window": [1], "host_ms_per_call": None,
                    "host_bound": False, "span": [wall0, time.time()],
                    "note": f"first call {first:.3f} s > --max-call-s {max_call_s}: not timed in windows"})
        return out, rec
    # warm-up in growing batches; the last batch calibrates the launches per window
    n, spent, per, warm, host_per = 1, 0.0, max(first, 1e-7), [], None
    while True:
        t, host = timed(n)
        spent += t
        per = max(t / n, 1e-7)
        warm.append([n, t, host])
        if n <= QUEUE_SAFE_LAUNCHES:
            host_per = host / n
        if spent >= warmup_s:
            break
        n = max(1, min(n * 4, math.ceil((warmup_s - spent) / per), MAX_LAUNCHES))
    n = max(1, min(MAX_LAUNCHES, math.ceil(window_s / per * 1.02)))
    rec["warmup"] = {"batches_n_gpu_s_host_s": warm, "s": spent, "calibrated_ms_per_call": per * 1e3}
    kept, short = [], []
    wall1 = time.time()
    for _ in range(3 * windows):
        if len(kept) >= windows:
            break
        t, host = timed(n)
        w = {"launches": n, "elapsed_s": t, "ms_per_call": t / n * 1e3, "host_ms_per_call": host / n * 1e3}
        if t >= window_s:
            kept.append(w)
        else:
            short.append(w)
            n = max(n + 1, min(MAX_LAUNCHES, math.ceil(n * window_s / max(t, 1e-9) * 1.05)))
    rec["span"] = [wall1, time.time()]
    if not kept:  # cannot happen unless MAX_LAUNCHES launches are shorter than a window
        kept = short[-windows:]
        rec["note"] = f"no window reached --window-s {window_s}; the last ones are used"
    elif len(kept) < windows:
        rec["note"] = f"only {len(kept)} of {windows} windows reached --window-s {window_s}"
    rec.update(_window_stats(kept))
    # Host time per call from a warm-up batch too short to fill the driver's launch queue (in
    # the windows a full queue makes enqueueing as slow as the GPU, whatever the host cost).
    rec["host_ms_per_call"] = host_per * 1e3 if host_per is not None else None
    rec["host_bound"] = bool(host_per is not None and host_per * 1e3 >= HOST_BOUND * rec["ms"])
    rec["timing"] = "windows"
    rec["discarded_short_windows"] = short
    return out, rec


def time_host(launch, *, window_s: float, windows: int, max_call_s: float):
    """The same windows with ``time.perf_counter`` for a CPU backend (the first call is the warm-up)."""
    wall0 = time.time()
    t0 = time.perf_counter()
    out = launch()
    first = time.perf_counter() - t0
    rec = {"first_call_ms": first * 1e3}
    if first > max_call_s:
        rec.update({"timing": "single-call", "ms": first * 1e3, "windows_ms_per_call": [first * 1e3],
                    "window_s": [first], "launches_per_window": [1], "host_ms_per_call": first * 1e3,
                    "host_bound": False, "span": [wall0, time.time()],
                    "note": f"first call {first:.3f} s > --max-call-s {max_call_s}: not timed in windows"})
        return out, rec
    n = max(1, min(MAX_LAUNCHES, math.ceil(window_s / max(first, 1e-7) * 1.02)))
    kept, short = [], []
    wall1 = time.time()
    for _ in range(3 * windows):
        if len(kept) >= windows:
            break
        t0 = time.perf_counter()
        for _ in range(n):
            launch()
        t = time.perf_counter() - t0
        w = {"launches": n, "elapsed_s": t, "ms_per_call": t / n * 1e3, "host_ms_per_call": t / n * 1e3}
        (kept if t >= window_s else short).append(w)
        if t < window_s:
            n = max(n + 1, min(MAX_LAUNCHES, math.ceil(n * window_s / max(t, 1e-9) * 1.05)))
    rec["span"] = [wall1, time.time()]
    if not kept:
        kept = short[-windows:]
        rec["note"] = f"no window reached --window-s {window_s}; the last ones are used"
    elif len(kept) < windows:
        rec["note"] = f"only {len(kept)} of {windows} windows reached --window-s {window_s}"
    rec.update(_window_stats(kept))
    rec["host_ms_per_call"] = rec["ms"]
    rec["host_bound"] = None  # meaningless on the CPU
    rec["timing"] = "windows"
    rec["discarded_short_windows"] = short
    return out, rec


# ---------------------------------------------------------------- exactness


def _bits(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    return x.view(np.uint32) if x.dtype.itemsize == 4 else x.view(np.uint16)


def reference_rows(a, bt, plan, model, mode, sa, sb, out_dtype: str, rows: int) -> np.ndarray:
    """The reference's output bits of the first ``rows`` rows, full width, with the plan of the
    full shape (the split-K schedule depends on M, so cpemu.gemm on the rows alone could differ)."""
    fmt = FP8_FORMATS[FMT]
    a_ops = ref.decode(a[:rows], fmt)
    b_ops = ref.decode(bt, fmt)
    N = bt.shape[0]
    out = np.empty((rows, N), dtype=OUT_DTYPES[out_dtype])
    nan_bits = (mode.get("nan_bits") or {}).get(out_dtype)
    for rb, cb in ref.blocks(rows, N, model.L):
        acc = ref.accumulate(a_ops.rows(rb), b_ops.rows(cb), plan, model)
        y = ref.epilogue(acc, sa, sb, None, mode["epilogue"])
        out[rb, cb] = encode_output(y, out_dtype, nan_bits)
    return _bits(out)


def _sha256(x: np.ndarray) -> str:
    """sha256 of the raw output bytes (C order)."""
    return hashlib.sha256(np.ascontiguousarray(x).view(np.uint8)).hexdigest()


def compare(got: np.ndarray, want: np.ndarray, limit: int = 8) -> dict:
    """Bitwise comparison of two bit-pattern arrays (got's leading rows against want)."""
    if got.shape[1:] != want.shape[1:] or got.shape[0] < want.shape[0] or got.dtype != want.dtype:
        return {"ok": False, "mismatches": None, "error": f"shape/dtype {got.shape} {got.dtype} vs "
                                                          f"{want.shape} {want.dtype}"}
    g = got[: want.shape[0]]
    bad = g != want
    n = int(np.count_nonzero(bad))
    first = []
    if n:
        width = 8 if g.dtype.itemsize == 4 else 4
        for idx in np.argwhere(bad)[:limit]:
            i = tuple(int(v) for v in idx)
            first.append({"at": list(i), "got": f"0x{int(g[i]):0{width}x}", "want": f"0x{int(want[i]):0{width}x}"})
    return {"ok": n == 0, "compared": int(want.size), "mismatches": n, "first_mismatches": first}


# ---------------------------------------------------------------- the run


class Bench:
    def __init__(self, opts: dict, record: dict, out_path: str):
        self.o = opts
        self.rec = record
        self.out_path = out_path
        self.failures: list[str] = []
        self.warnings: list[str] = []
        self.best_rate: dict = {}  # kernel -> best MAC/s so far (to predict call times)
        self.cp = None
        self.stream = None
        self.torch = None
        self.torch_stream = None
        self.torch_device = None
        self.sampler: ClockSampler | None = None
        self.sm_count = None
        self.t_start = time.perf_counter()
        self.done = 0
        self.total = 0

    # -------------------------------------------------------- output
    def write(self, complete: bool):
        self.rec["complete"] = complete
        self.rec["elapsed_s"] = time.perf_counter() - self.t_start
        self.rec["finished_utc" if complete else "updated_utc"] = _utc()
        if self.sampler is not None:
            self.rec["clock"]["samples"] = self.sampler.snapshot()
            self.rec["clock"]["errors"] = list(self.sampler.errors)
            self.rec["clock"]["error"] = self.sampler.error
        self.rec["failures"] = list(self.failures)
        self.rec["warnings"] = list(self.warnings)
        write_json(self.rec, self.out_path)

    def progress(self, label: str):
        el = time.perf_counter() - self.t_start
        line = f"[{self.done}/{self.total}] {_hms(el)} {label}"
        if sys.stderr.isatty():
            click.echo("\r" + line[:150].ljust(150), nl=False, err=True)
        else:
            click.echo(line, err=True)

    def log(self, msg: str):
        if sys.stderr.isatty():
            click.echo("\r" + " " * 150 + "\r", nl=False, err=True)
        click.echo(msg, err=True)

    def fail(self, msg: str):
        self.failures.append(msg)
        self.log("FAIL: " + msg)

    def warn(self, msg: str):
        self.warnings.append(msg)
        self.log("WARNING: " + msg)

    # -------------------------------------------------------- derived figures
    def figures(self, r: dict, macs: int, clock: dict | None):
        ms = r.get("ms")
        r["tmacs"] = macs / (ms / 1e3) / 1e12 if ms else None
        r["clock"] = clock
        if ms and clock and clock.get("sm_mhz_median") and self.sm_count:
            r["mac_per_clock_per_sm"] = macs / (ms / 1e3) / (clock["sm_mhz_median"] * 1e6) / self.sm_count
        else:
            r["mac_per_clock_per_sm"] = None

    def clock_of(self, span):
        if self.sampler is None or not span:
            return None
        return self.sampler.summary(span[0], span[1])


def _utc():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (bytes, bytearray)):
        return x.decode(errors="replace")
    return str(x)


def _loaded_libs(fragment: str) -> list[str]:
    """Paths of the shared objects mapped in this process whose file name contains ``fragment``."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and fragment in os.path.basename(parts[-1]) and parts[-1] not in out:
                    out.append(parts[-1])
    except OSError:
        pass
    return out


def cublaslt_info() -> dict:
    """The libcublasLt torch loaded (after its first FP8 matmul) and its cublasLtGetVersion()."""
    import ctypes

    info = {"loaded": _loaded_libs("libcublasLt.so"), "version": None}
    for path in info["loaded"][:1]:
        try:
            fn = ctypes.CDLL(path).cublasLtGetVersion
            fn.restype, fn.argtypes = ctypes.c_size_t, []
            info["version"] = int(fn())
        except Exception as e:  # noqa: BLE001
            info["error"] = f"{type(e).__name__}: {e}"
    return info


def _device_info(cp) -> dict:
    """Name, SM count, compute capability, PCI bus id, driver/runtime of cupy's current device."""
    dev = cp.cuda.Device()
    info = {"index": int(dev.id)}
    try:
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
    except Exception as e:  # noqa: BLE001
        props, info["properties_error"] = {}, str(e)
    name = props.get("name")
    info["name"] = name.decode(errors="replace") if isinstance(name, (bytes, bytearray)) else name
    sm = None
    try:
        sm = int(dev.attributes["MultiProcessorCount"])
        info["sm_count_source"] = "cupy Device.attributes['MultiProcessorCount']"
    except Exception:  # noqa: BLE001
        try:
            sm = int(cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrMultiProcessorCount, dev.id))
            info["sm_count_source"] = "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)"
        except Exception:  # noqa: BLE001
            if props.get("multiProcessorCount"):
                sm = int(props["multiProcessorCount"])
                info["sm_count_source"] = "getDeviceProperties()['multiProcessorCount']"
    info["sm_count"] = sm
    for key, fn in (("compute_capability", lambda: dev.compute_capability),
                    ("pci_bus_id", lambda: dev.pci_bus_id),
                    ("cuda_driver_version", lambda: cp.cuda.runtime.driverGetVersion()),
                    ("cuda_runtime_version", lambda: cp.cuda.runtime.runtimeGetVersion()),
                    ("total_memory_bytes", lambda: props.get("totalGlobalMem")),
                    ("l2_cache_bytes", lambda: props.get("l2CacheSize"))):
        try:
            info[key] = fn()
        except Exception as e:  # noqa: BLE001
            info[key] = None
            info[key + "_error"] = str(e)
    return info


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--kernels", default=None,
              help="Comma list of backends (cpemu.backends.LADDER names: cuda-tiled, cuda-simple, reference, ...). "
                   "Default: every available CUDA backend of the ladder (not reference).")
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
              help="the reference backend is skipped above this M*N*K")
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
    model, mode = prof.instruction, prof.mode("tensorwise")

    native_source = ctx.get_parameter_source("native")
    native_auto = native_source is None or native_source.name == "DEFAULT"

    record = {
        "tool": TOOL, "tool_version": TOOL_VERSION,
        "command_line": shlex.join([os.path.basename(sys.executable)] + sys.argv),
        "command_line_explicit": None,
        "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in ctx.params.items()},
        "started_utc": _utc(), "complete": False,
        "host": {"hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
                 "cpu_count": os.cpu_count()},
        "packages": package_versions(), "git": git_state(), "code": code_fingerprint(),
        "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CPEMU_CUDA_FROM_SOURCE", "CPEMU_THREADS")},
        "reference_threads": _reference_threads(),
        "profile": {"name": prof.name, "status": prof.status, "instruction": model.to_json()},
        "config": {"a_format": FMT, "b_format": FMT, "scales": "unit tensorwise (cpemu.cases scale='unit')",
                   "fast_accum": fast_accum, "out_dtype": out_dtype, "seed": seed,
                   "shapes": [{"label": s, "N": n, "K": k} for s, n, k in shape_list], "M": m_list,
                   "data": [{"label": lbl, "cpemu_cases_kind": kind} for lbl, kind in data_list],
                   "data_notes": {"gauss40": "N(0, 40^2) rounded to e4m3 (RNE, clipped to +-448)",
                                  "adversarial": "cpemu.cases 'spread': per row one element in each 32 K-elements "
                                                 "(same position for all rows of the operand) of magnitude "
                                                 "U(64, 448), the rest N(0, 2^-6): every T-FDPA step aligns to a "
                                                 "large exponent and truncates the small products (maximal "
                                                 "truncation and exponent spread)"},
                   "window_s": window_s, "windows": windows, "check_rows": check_rows,
                   "max_call_s": max_call_s, "max_check_call_s": max_check_call_s,
                   "reference_max_macs": reference_max_macs, "api_max_ms": api_max_ms},
        "timing_method": {
            "cuda": "cupy CUDA events on one non-blocking cupy stream around back-to-back launches; first call, "
                    "warm-up >= min(1 s, window_s) in growing batches calibrating launches per window, then >= "
                    "`windows` windows each >= window_s; ms = median over windows of window time / launches",
            "cuda_call": "direct: cpemu.cuda.kernels.gemm_cuda(name, a_dev, bt_dev, 'e4m3', 'e4m3', plan, model, "
                         "mode, scale_a_dev, scale_b_dev, None, out_dtype) with plan = profile.plan(M, N, K, "
                         "fast_accum, 'tensorwise', 'e4m3', 'e4m3', out_dtype), as cpemu.gemm calls it; `api` "
                         "(where the direct call < api_max_ms): cpemu.gemm(a_dev, bt_dev.T, a_format='e4m3', "
                         "b_format='e4m3', profile=..., scale_a=..., scale_b=..., out_dtype=..., fast_accum=..., "
                         "backend=name) on the same cupy arrays",
            "native": "torch._scaled_mm on the same stream (torch.cuda.ExternalStream of the cupy stream), the "
                      "same events and windows",
            "reference": "cpemu.gemm(numpy operands, backend='reference'), time.perf_counter, first call then "
                         "windows",
            "tmacs": "M*N*K / (ms/1e3) / 1e12",
            "mac_per_clock_per_sm": "M*N*K / seconds / (median SM clock during the windows, Hz) / SM count"},
        "device": None, "clock": {"source": None, "note": None, "fields": list(CLOCK_FIELDS),
                                  "period_s": CLOCK_PERIOD_S, "samples_format": "[unix_time, sm_mhz, power_w, "
                                                                                "temp_c]", "samples": []},
        "validation": {}, "results": [], "native": [], "exactness": [], "skipped": [], "operands": [],
    }
    bench = Bench(ctx.params, record, out_path)

    # -------------------------------------------------------- which backends
    if kernel_list is None:
        from cpemu.backends import available

        kernel_list, why_not = [], {}
        for name in LADDER:
            if name == "reference":
                continue
            ok, why = available(name)
            (kernel_list.append(name) if ok else why_not.__setitem__(name, why))
        record["default_kernels_unavailable"] = why_not
        if not kernel_list:
            click.echo("no CUDA backend of cpemu is available here:", err=True)
            for n, why in why_not.items():
                click.echo(f"  {n}: {why}", err=True)
            click.echo("(use --kernels reference for the CPU backend)", err=True)
            ctx.exit(2)
    record["kernels"] = kernel_list
    p = ctx.params
    record["command_line_explicit"] = shlex.join(
        ["python", TOOL, "--kernels", ",".join(kernel_list), "--profile", str(profile)]
        + [x for lbl, _, _ in shape_list for x in ("--shape", lbl)]
        + ["--M", ",".join(map(str, m_list)), "--data", ",".join(lbl for lbl, _ in data_list),
           "--fast-accum" if fast_accum else "--no-fast-accum", "--out-dtype", out_dtype,
           "--window-s", repr(window_s), "--windows", str(windows), "--out", str(out_path),
           "--native" if p["native"] else "--no-native", "--seed", str(seed), "--check-rows", str(check_rows),
           "--max-call-s", repr(max_call_s), "--max-check-call-s", repr(max_check_call_s),
           "--reference-max-macs", repr(reference_max_macs), "--api-max-ms", repr(api_max_ms)])
    cuda_names = [n for n in kernel_list if n != "reference"]
    unavailable = {}
    if cuda_names:
        from cpemu.backends import available

        for n in cuda_names:
            ok, why = available(n)
            if not ok:
                unavailable[n] = why
                bench.fail(f"{n}: requested but cannot run here: {why}")
    runnable_cuda = [n for n in cuda_names if n not in unavailable]
    record["kernels_unavailable"] = unavailable

    # -------------------------------------------------------- native baseline
    native_on, native_why = False, None
    if native or native_auto:
        try:
            import torch

            if not torch.cuda.is_available():
                native_why = "torch is importable but CUDA is not available to it"
            elif not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
                native_why = f"torch {torch.__version__} has no _scaled_mm / float8_e4m3fn"
            else:
                native_on = True
                bench.torch = torch
        except Exception as e:  # noqa: BLE001
            native_why = f"torch not importable: {type(e).__name__}: {e}"
    else:
        native_why = "--no-native"
    if native_on and native_why is None:
        record["native_setting"] = {"on": True, "reason": "--native" if not native_auto else "auto: torch with CUDA"}
    else:
        record["native_setting"] = {"on": False, "reason": native_why}
        if native and not native_auto:
            bench.fail(f"--native asked for but unavailable: {native_why}")

    # -------------------------------------------------------- device, clock sampler
    need_gpu = bool(runnable_cuda) or native_on
    if need_gpu:
        try:
            import cupy as cp
        except Exception as e:  # noqa: BLE001 - only the native baseline can get here without cupy
            need_gpu, native_on = False, False
            record["native_setting"] = {"on": False, "reason": f"cupy (for the stream and events) not importable: "
                                                               f"{type(e).__name__}: {e}"}
            bench.warn(record["native_setting"]["reason"])
    if need_gpu:
        bench.cp = cp
        bench.stream = cp.cuda.Stream(non_blocking=True)
        info = _device_info(cp)
        bench.sm_count = info.get("sm_count")
        info["cupy"] = cp.__version__
        if bench.torch is not None:
            t = bench.torch
            info["torch"] = t.__version__
            info["torch_cuda"] = getattr(t.version, "cuda", None)
            try:
                info["torch_device_name"] = t.cuda.get_device_name(info["index"])
            except Exception as e:  # noqa: BLE001
                info["torch_device_name"] = f"error: {e}"
            bench.torch_device = torch_device(t, info["index"])
            bench.torch_stream = t.cuda.ExternalStream(bench.stream.ptr, device=bench.torch_device)
            try:  # one small call first, so that no timed first call pays for loading cuBLASLt
                x = t.zeros((16, 32), dtype=t.uint8, device=bench.torch_device).view(t.float8_e4m3fn)
                y = t.zeros((16, 32), dtype=t.uint8, device=bench.torch_device).view(t.float8_e4m3fn)
                one = t.ones((), dtype=t.float32, device=bench.torch_device)
                tdt = {"bfloat16": t.bfloat16, "float16": t.float16, "float32": t.float32}[out_dtype]
                with t.cuda.stream(bench.torch_stream), bench.stream:
                    t._scaled_mm(x, y.t(), one, one, out_dtype=tdt, use_fast_accum=fast_accum)
                    bench.stream.synchronize()
                t.cuda.synchronize(bench.torch_device)
            except Exception as e:  # noqa: BLE001
                native_on = False
                bench.torch = None
                record["native_setting"] = {"on": False, "reason": f"a first small torch._scaled_mm failed: "
                                                                   f"{type(e).__name__}: {e}"}
                bench.warn(record["native_setting"]["reason"])
        record["device"] = info
    exe = find_nvidia_smi()
    if exe is None:
        record["clock"]["note"] = ("nvidia-smi not found on PATH: the SM clock, power and temperature were not "
                                   "sampled; clock fields and mac_per_clock_per_sm are null")
        if need_gpu:
            bench.warn(record["clock"]["note"])
    else:
        gpus, err = nvidia_smi_gpus(exe)
        record["clock"]["nvidia_smi_gpus"] = gpus
        index = None
        if err:
            record["clock"]["note"] = f"nvidia-smi --query-gpu failed: {err}"
        want = _pci_key((record["device"] or {}).get("pci_bus_id") or "")
        for g in gpus:
            if want is not None and _pci_key(g.get("pci.bus_id", "")) == want:
                index = g.get("index")
        if index is None and len(gpus) == 1:
            index = gpus[0].get("index")
        if index is None and gpus:
            index = str((record["device"] or {}).get("index", 0))
            record["clock"]["note"] = (f"the cupy device's PCI bus id was not found among nvidia-smi's GPUs; "
                                       f"sampling nvidia-smi GPU index {index}")
        record["clock"]["nvidia_smi_index"] = index
        if record["device"] is not None:
            for g in gpus:
                if g.get("index") == index:
                    record["device"]["driver_version"] = g.get("driver_version")
                    record["device"]["nvidia_smi"] = g
        if gpus:
            s = ClockSampler(exe, index)
            if s.start():
                bench.sampler = s
                record["clock"]["source"] = " ".join(s._cmd())
            else:
                record["clock"]["note"] = f"nvidia-smi sampling failed: {s.error}; clock fields are null"
                bench.warn(record["clock"]["note"])
        elif need_gpu:
            bench.warn(record["clock"]["note"] or "nvidia-smi lists no GPU; clock fields are null")

    # -------------------------------------------------------- validation of the CUDA backends
    if runnable_cuda:
        from cpemu import backends

        for n in runnable_cuda:
            try:
                with bench.stream:
                    ok, why = backends.validate(n, prof)
            except Exception as e:  # noqa: BLE001
                ok, why = False, f"{type(e).__name__}: {e}"
            record["validation"][n] = {"ok": bool(ok), "detail": why}
            if not ok:
                bench.fail(f"{n}: backends.validate failed: {why}")

    bench.total = len(shape_list) * len(data_list) * len(m_list) * (len(kernel_list) + (1 if native_on else 0))
    dv = record["device"] or {}
    bench.log(f"{len(shape_list)} shape(s) x {len(data_list)} data x {len(m_list)} M; kernels {','.join(kernel_list)}; "
              f"native {'on' if native_on else 'off'}; device {dv.get('name', 'none (CPU)')}"
              + (f", {dv.get('sm_count')} SMs" if dv else "")
              + f"; SM clock {'sampled' if bench.sampler is not None else 'not sampled'}; writing {out_path}")
    bench.write(False)
    interrupted = False
    try:
        for label, N, K in shape_list:
            for data_label, kind in data_list:
                for M in m_list:
                    try:
                        run_config(bench, prof, model, mode, label, N, K, data_label, kind, M, kernel_list,
                                   runnable_cuda, native_on, fast_accum, out_dtype, seed, check_rows, window_s,
                                   windows, max_call_s, max_check_call_s, reference_max_macs, api_max_ms)
                    except Exception as e:  # noqa: BLE001 - e.g. out of memory: recorded, the run goes on
                        record.setdefault("config_errors", []).append(
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
    record["interrupted"] = interrupted
    bench.write(not interrupted)
    bench.log("")
    print_table(bench)
    click.echo(f"wrote {out_path}")
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


def _skip(bench, base: dict, what: str, reason: str):
    r = dict(base, status="skipped", reason=reason)
    bench.rec["skipped"].append({k: base.get(k) for k in ("kernel", "shape", "data", "M")} | {"reason": reason})
    bench.log(f"skip {what}: {reason}")
    return r


def run_config(bench: Bench, prof, model, mode, label, N, K, data_label, kind, M, kernel_list, runnable_cuda,
               native_on, fast_accum, out_dtype, seed, check_rows, window_s, windows, max_call_s,
               max_check_call_s, reference_max_macs, api_max_ms):
    cp = bench.cp
    macs = M * N * K
    case = Case(M, N, K, data=kind, seed=seed, a_format=FMT, b_format=FMT, fast_accum=fast_accum,
                out_dtype=out_dtype)
    where = {"shape": label, "N": N, "K": K, "data": data_label, "M": M}
    tag = f"{label} {data_label} M={M}"
    steps = len(kernel_list) + (1 if native_on else 0)
    try:
        plan = prof.plan(M, N, K, fast_accum, "tensorwise", FMT, FMT, out_dtype)
    except UnsupportedShape as e:
        for n in kernel_list + (["native"] if native_on else []):
            bench.rec["results" if n != "native" else "native"].append(
                _skip(bench, dict(where, kernel=n, macs=macs), f"{n} {tag}", f"UnsupportedShape: {e}"))
        bench.done += steps
        return
    if not native_on and not any(_may_run(bench, n, macs, runnable_cuda, reference_max_macs, max_check_call_s)
                                 for n in kernel_list):
        for n in kernel_list:  # every backend skips this configuration: no operands needed
            r, _ = run_kernel(bench, prof, model, mode, plan, n, dict(where, kernel=n, macs=macs, case_id=case.id),
                              None, None, None, None, {}, macs, fast_accum, out_dtype, window_s, windows,
                              max_call_s, max_check_call_s, reference_max_macs, api_max_ms, runnable_cuda, tag)
            bench.rec["results"].append(r)
            bench.rec["exactness"].append(dict(where, kernel=n, status=r.get("status"), reason=r.get("reason")))
            bench.done += 1
        return
    bench.progress(f"{tag}: generating operands")
    t0 = time.perf_counter()
    a, bt, sa, sb, _ = operands(case)
    gen_s = time.perf_counter() - t0
    bench.rec["operands"].append(dict(where, case=case.to_json(), generate_s=gen_s,
                                      sha256=sha256_arrays(a, bt, sa, sb, None),
                                      plan={"slices": [list(s) for s in plan.slices], "promotion": plan.promotion}))
    rows = min(check_rows, M)
    want = None
    if rows:
        bench.progress(f"{tag}: reference rows")
        t0 = time.perf_counter()
        want = reference_rows(a, bt, plan, model, mode, sa.reshape(()), sb.reshape(()), out_dtype, rows)
        bench.rec["operands"][-1]["reference_rows_s"] = time.perf_counter() - t0

    dev = {}
    if runnable_cuda or native_on:
        with bench.stream:
            dev["a"] = cp.asarray(a)
            dev["bt"] = cp.asarray(bt)
            dev["sa"] = cp.asarray(sa.reshape(1).astype(np.float32))
            dev["sb"] = cp.asarray(sb.reshape(1).astype(np.float32))
        bench.stream.synchronize()

    outputs: dict = {}
    results: dict = {}
    for name in kernel_list:
        bench.progress(f"{tag}: {name}")
        base = dict(where, kernel=name, macs=macs, case_id=case.id)
        try:
            r, out = run_kernel(bench, prof, model, mode, plan, name, base, a, bt, sa, sb, dev, macs,
                                fast_accum, out_dtype, window_s, windows, max_call_s, max_check_call_s,
                                reference_max_macs, api_max_ms, runnable_cuda, tag)
        except Exception as e:  # noqa: BLE001 - a failing kernel is recorded and the run goes on
            r, out = dict(base, status="error", error=f"{type(e).__name__}: {e}",
                          traceback=traceback.format_exc()[-4000:]), None
            bench.fail(f"{name} {tag}: {type(e).__name__}: {e}")
        if out is not None:
            outputs[name] = out
            r["output_sha256"] = _sha256(out)
            if r.get("tmacs"):
                bench.best_rate[name] = max(bench.best_rate.get(name, 0.0), r["tmacs"] * 1e12)
        results[name] = r
        bench.rec["results"].append(r)
        bench.done += 1
        if r.get("status") == "ok":
            bench.log(f"{name:12s} {tag:28s} {r['ms']:11.4f} ms  {r['tmacs']:.4g} TMAC/s"
                      + (f"  {r['mac_per_clock_per_sm']:.3g} MAC/clk/SM" if r.get("mac_per_clock_per_sm") else "")
                      + (" (single call)" if r.get("timing") == "single-call" else "")
                      + (" (host-bound)" if r.get("host_bound") else ""))

    # native baseline
    if native_on:
        bench.progress(f"{tag}: native torch._scaled_mm")
        base = dict(where, kernel="native", macs=macs, case_id=case.id)
        try:
            nr, nout = run_native(bench, base, a, bt, sa, sb, macs, fast_accum, out_dtype, window_s, windows,
                                  max_call_s)
        except Exception as e:  # noqa: BLE001
            nr, nout = dict(base, status="error", error=f"{type(e).__name__}: {e}",
                            traceback=traceback.format_exc()[-4000:]), None
            bench.warn(f"native {tag}: {type(e).__name__}: {e}")
        if nout is not None:
            nr["output_sha256"] = _sha256(nout)
            against = "cuda-simple" if "cuda-simple" in outputs else next(iter(outputs), None)
            if against is not None:
                c = compare(nout, outputs[against])
                nr["matches_cpemu"] = dict(c, against=against)
                if not c["ok"]:
                    bench.warn(f"native torch._scaled_mm differs from cpemu ({against}, profile {prof.name}) on "
                               f"{tag}: {c['mismatches']} of {c['compared']} outputs (first: "
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
            bench.log(f"{'native':12s} {tag:28s} {nr['ms']:11.4f} ms  {nr['tmacs']:.4g} TMAC/s"
                      + (f"  {nr['mac_per_clock_per_sm']:.3g} MAC/clk/SM" if nr.get("mac_per_clock_per_sm") else ""))

    # exactness: every kernel's full output against cuda-simple's, or cuda-tiled's where
    # cuda-simple did not run (cuda-tiled itself equals cuda-simple wherever both ran)
    base_name = "cuda-simple" if "cuda-simple" in outputs else ("cuda-tiled" if "cuda-tiled" in outputs else None)
    simple = outputs.get(base_name) if base_name else None
    for name in kernel_list:
        r = results[name]
        ex = dict(where, kernel=name)
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
                bench.fail(f"{name} {tag}: first {rows} rows differ from the reference: {c['mismatches']} outputs, "
                           f"first {c['first_mismatches'][:3]}")
        if name != base_name:
            if simple is not None:
                c = compare(got, simple)
                ex["vs_cuda_simple"] = dict(c, against=base_name)
                if not c["ok"]:
                    bench.fail(f"{name} {tag}: full output differs from {base_name}: {c['mismatches']} outputs, "
                               f"first {c['first_mismatches'][:3]}")
            else:
                sr = results.get("cuda-simple")
                ex["vs_cuda_simple"] = {"ok": None, "reason": "cuda-simple not selected" if sr is None else
                                        f"cuda-simple {sr.get('status')}: {sr.get('reason') or sr.get('error')}"}
        api = r.get("api") or {}
        if "matches_direct" in api:
            ex["api_vs_direct"] = api["matches_direct"]
            if not api["matches_direct"]["ok"]:
                bench.fail(f"{name} {tag}: cpemu.gemm output differs from gemm_cuda's: "
                           f"{api['matches_direct']['mismatches']} outputs")
        ex["ok"] = all(ex[k]["ok"] is not False for k in ("vs_reference_rows", "vs_cuda_simple", "api_vs_direct")
                       if k in ex)
        bench.rec["exactness"].append(ex)

    del dev, outputs
    if cp is not None:
        bench.stream.synchronize()
        try:
            cp.get_default_memory_pool().free_all_blocks()
            if bench.torch is not None:
                bench.torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass


def _may_run(bench, name, macs, runnable_cuda, reference_max_macs, max_check_call_s) -> bool:
    """False when run_kernel would skip ``name`` without running it (the caps, unavailability)."""
    if name == "reference":
        return macs <= reference_max_macs
    if name not in runnable_cuda:
        return False
    rate = bench.best_rate.get(name)
    return not (rate and macs / rate > max_check_call_s)


def run_kernel(bench, prof, model, mode, plan, name, base, a, bt, sa, sb, dev, macs, fast_accum, out_dtype,
               window_s, windows, max_call_s, max_check_call_s, reference_max_macs, api_max_ms, runnable_cuda,
               tag):
    """Time one backend on one configuration: (record, host output bits or None)."""
    if name == "reference":
        if macs > reference_max_macs:
            return _skip(bench, base, f"reference {tag}", f"M*N*K = {macs:.3g} > --reference-max-macs "
                                                          f"{reference_max_macs:.3g}"), None
        fmt = FP8_FORMATS[FMT]
        A, B = a.view(fmt.np_dtype), bt.view(fmt.np_dtype).T

        def launch():
            return cpemu.gemm(A, B, profile=prof, scale_a=sa.reshape(()), scale_b=sb.reshape(()),
                              out_dtype=out_dtype, fast_accum=fast_accum, backend="reference")

        out, r = time_host(launch, window_s=window_s, windows=windows, max_call_s=max_call_s)
        r = dict(base, status="ok", call="cpemu.gemm (numpy, backend='reference')", **r)
        span = r.pop("span", None)
        bench.figures(r, macs, bench.clock_of(span))
        r["mac_per_clock_per_sm"] = None  # a CPU backend: no SM
        r["span_unix"] = span
        return r, _bits(np.asarray(out))
    if name not in runnable_cuda:
        why = bench.rec["kernels_unavailable"].get(name, "not available")
        return _skip(bench, base, f"{name} {tag}", f"backend cannot run here: {why}"), None
    rate = bench.best_rate.get(name)
    if rate and macs / rate > max_check_call_s:
        return _skip(bench, base, f"{name} {tag}",
                     f"predicted {macs / rate:.1f} s per call (at its best rate so far, {rate / 1e12:.3g} TMAC/s) "
                     f"> --max-check-call-s {max_check_call_s}"), None
    cp, stream = bench.cp, bench.stream
    from cpemu.cuda import kernels

    a_dev, bt_dev = dev["a"], dev["bt"]

    def api_launch():
        return cpemu.gemm(a_dev, bt_dev.T, a_format=FMT, b_format=FMT, profile=prof.name if not prof.base_dir
                          else prof, scale_a=sa.reshape(()), scale_b=sb.reshape(()), out_dtype=out_dtype,
                          fast_accum=fast_accum, backend=name)

    if name in kernels.DIRECT:
        def launch():
            return kernels.gemm_cuda(name, a_dev, bt_dev, FMT, FMT, plan, model, mode, dev["sa"], dev["sb"], None,
                                     out_dtype)
        call = "direct: cpemu.cuda.kernels.gemm_cuda"
    else:
        launch, call = api_launch, "api: cpemu.gemm (no direct launcher for this backend)"
    warmup_s = min(1.0, window_s)
    with stream:
        out, r = time_device(cp, stream, launch, window_s=window_s, windows=windows, max_call_s=max_call_s,
                             warmup_s=warmup_s)
        stream.synchronize()
        r = dict(base, status="ok", call=call, **r)
        span = r.pop("span", None)
        r["span_unix"] = span
        bench.figures(r, macs, bench.clock_of(span))
        if name == "cuda-tiled" and bench.sm_count:  # the geometry gemm_cuda picks for this shape on this GPU
            r["tiled_module"] = kernels.tiled_module_for(base["M"], base["N"], bench.sm_count)
        if name == kernels.TENSOR_CORE:
            from cpemu.cuda import tensorcore

            try:
                r["algorithm"] = tensorcore.describe(base["M"], base["N"], base["K"], FMT, FMT, out_dtype, fast_accum,
                                                     False, "tensorwise", plan.splits,
                                                     ada=model.name == tensorcore.ADA_MODEL)
            except Exception as e:  # noqa: BLE001 - a record, never a failure
                r["algorithm"] = {"error": f"{type(e).__name__}: {e}"}
        if launch is not api_launch and r["timing"] == "windows" and r["ms"] < api_max_ms:
            aout, ar = time_device(cp, stream, api_launch, window_s=window_s, windows=windows,
                                   max_call_s=max_call_s, warmup_s=warmup_s)
            stream.synchronize()
            aspan = ar.pop("span", None)
            ar["span_unix"] = aspan
            ar["call"] = "api: cpemu.gemm on cupy arrays"
            bench.figures(ar, macs, bench.clock_of(aspan))
            n_bad = int(cp.count_nonzero(aout != out)) if aout.shape == out.shape and aout.dtype == out.dtype \
                else None
            ar["matches_direct"] = {"ok": n_bad == 0, "mismatches": n_bad}
            ar["overhead_ms_per_call"] = ar["ms"] - r["ms"]
            r["api"] = ar
            del aout
        elif launch is not api_launch:
            r["api"] = {"status": "not timed", "reason": f"direct call {r['ms']:.3g} ms >= --api-max-ms {api_max_ms} "
                                                         f"or single-call timing"}
        stream.synchronize()
        host = out.get(stream=stream)
        stream.synchronize()
    return r, _bits(host)


def torch_device(torch, index: int):
    """The torch device of cupy's current device."""
    return torch.device("cuda", index)


def run_native(bench, base, a, bt, sa, sb, macs, fast_accum, out_dtype, window_s, windows, max_call_s):
    torch, cp, stream = bench.torch, bench.cp, bench.stream
    devname = bench.torch_device
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[out_dtype]
    ta = torch.from_numpy(np.ascontiguousarray(a)).to(devname).view(torch.float8_e4m3fn)
    tbt = torch.from_numpy(np.ascontiguousarray(bt)).to(devname).view(torch.float8_e4m3fn)
    tb = tbt.t()  # (K, N) column-major, as torch._scaled_mm wants
    tsa = torch.from_numpy(np.array(sa, dtype=np.float32).reshape(())).to(devname)
    tsb = torch.from_numpy(np.array(sb, dtype=np.float32).reshape(())).to(devname)
    torch.cuda.synchronize(devname)

    def launch():
        return torch._scaled_mm(ta, tb, tsa, tsb, out_dtype=tdt, use_fast_accum=fast_accum)

    with torch.cuda.stream(bench.torch_stream), stream:
        out, r = time_device(cp, stream, launch, window_s=window_s, windows=windows, max_call_s=max_call_s,
                             warmup_s=min(1.0, window_s))
        stream.synchronize()
    r = dict(base, status="ok", call=f"torch._scaled_mm(a, b, scale_a, scale_b, out_dtype={tdt}, "
                                     f"use_fast_accum={fast_accum})", **r)
    span = r.pop("span", None)
    r["span_unix"] = span
    bench.figures(r, macs, bench.clock_of(span))
    ibits = torch.int32 if out.element_size() == 4 else torch.int16
    host = out.view(ibits).cpu().numpy()
    host = host.view(np.uint32 if host.dtype.itemsize == 4 else np.uint16)
    return r, np.ascontiguousarray(host)


def print_table(bench: Bench):
    rec = bench.rec
    kernels = rec.get("kernels") or []
    res = {(r["kernel"], r["shape"], r["data"], r["M"]): r for r in rec["results"]}
    nat = {(r["shape"], r["data"], r["M"]): r for r in rec["native"]}
    exact = {}  # "NO" on any mismatch; "yes" when every output was also compared in full; else "rows"
    for e in rec["exactness"]:
        k = (e["shape"], e["data"], e["M"])
        if "ok" not in e:
            continue
        full = e["kernel"] == "cuda-simple" or (e.get("vs_cuda_simple") or {}).get("ok") is True
        now = "NO" if not e["ok"] else ("yes" if full else "rows")
        prev = exact.get(k, "yes")
        exact[k] = "NO" if "NO" in (prev, now) else ("rows" if "rows" in (prev, now) else "yes")
    keys = list(dict.fromkeys((r["shape"], r["data"], r["M"]) for r in rec["results"] + rec["native"]))
    if not keys:
        click.echo("no results")
        return

    def cell(r):
        if r is None:
            return "-"
        if r.get("status") != "ok":
            return r.get("status", "?")
        s = f"{r['tmacs']:.3g}"
        if r.get("mac_per_clock_per_sm"):
            s += f" ({r['mac_per_clock_per_sm']:.3g})"
        if r.get("timing") == "single-call":
            s += "*"
        if r.get("host_bound"):
            s += "h"
        return s

    has_native = bool(rec["native"])
    head = ["shape", "data", "M"] + [f"{k} TMAC/s" for k in kernels] + (["native TMAC/s"] if has_native else []) \
        + ([f"{k}/native" for k in kernels if k != "reference"] if has_native else []) + ["exact"]
    rows = []
    for k in keys:
        row = [k[0], k[1], str(k[2])] + [cell(res.get((n,) + k)) for n in kernels]
        if has_native:
            nr = nat.get(k)
            row.append(cell(nr))
            for n in kernels:
                if n == "reference":
                    continue
                v = (res.get((n,) + k) or {}).get("vs_native")
                row.append(f"{v:.3g}" if v else "-")
        row.append(exact.get(k, "-"))
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    click.echo("TMAC/s (MAC per clock per SM); * single call (not windowed), h host-bound (launch overhead). "
               "exact: yes = outputs equal the reference's first rows and cuda-simple's full output; rows = only the "
               "reference rows were compared (no cuda-simple output).")


if __name__ == "__main__":
    main()
