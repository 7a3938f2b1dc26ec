"""Timed windows of back-to-back calls: CUDA events on one stream, or ``time.perf_counter`` on the CPU.

Both return ``(first_output, record)``. A first call longer than ``max_call_s`` is the result
(``timing: "single-call"``). Otherwise windows of ``n`` back-to-back calls are timed until
``windows`` of them last at least ``window_s`` (a shorter one is kept under
``discarded_short_windows`` and ``n`` raised); ``ms`` is the median of window time / calls.
The record's ``span`` is the wall-time span of the timed part, for the clock samples."""

from __future__ import annotations

import math
import statistics
import time

#: host_bound: the host time per call is at least this fraction of the GPU time per call.
HOST_BOUND = 0.9
#: Batches of at most this many launches never fill the driver's queue of pending launches.
QUEUE_SAFE_LAUNCHES = 128
MAX_LAUNCHES = 1_000_000


def _window_stats(kept: list[dict]) -> dict:
    ms = [w["ms_per_call"] for w in kept]
    return {"ms": statistics.median(ms), "windows_ms_per_call": ms, "window_s": [w["elapsed_s"] for w in kept],
            "launches_per_window": [w["launches"] for w in kept],
            "host_enqueue_ms_per_call": statistics.median(w["host_ms_per_call"] for w in kept)}


def _single_call(rec: dict, first: float, wall0: float, max_call_s: float, host_ms) -> dict:
    """The record of a first call too long to time in windows: its time is the result."""
    rec.update({"timing": "single-call", "ms": first * 1e3, "windows_ms_per_call": [first * 1e3],
                "window_s": [first], "launches_per_window": [1], "host_ms_per_call": host_ms,
                "host_bound": False, "span": [wall0, time.time()],
                "note": f"first call {first:.3f} s > --max-call-s {max_call_s}: not timed in windows"})
    return rec


def _windows(timed, n: int, window_s: float, windows: int) -> tuple[list[dict], list[dict]]:
    """At most ``3 * windows`` runs of ``timed(n) -> (seconds, host seconds)``, until ``windows``
    of them last at least ``window_s``: (kept windows, discarded short ones)."""
    kept, short = [], []
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
    return kept, short


def _windowed(rec: dict, wall1: float, kept: list, short: list, windows: int, window_s: float) -> None:
    """The span, a note on too few windows, and the median figures of the kept windows."""
    rec["span"] = [wall1, time.time()]
    if not kept:  # cannot happen unless MAX_LAUNCHES launches are shorter than a window
        kept = short[-windows:]
        rec["note"] = f"no window reached --window-s {window_s}; the last ones are used"
    elif len(kept) < windows:
        rec["note"] = f"only {len(kept)} of {windows} windows reached --window-s {window_s}"
    rec.update(_window_stats(kept))


def _warmup(timed, first: float, warmup_s: float) -> tuple[float, float | None, dict]:
    """Batches growing 4x until ``warmup_s`` of GPU time: (calibrated seconds per call, host
    seconds per call of the last queue-safe batch or None, the warm-up record)."""
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
    return per, host_per, {"batches_n_gpu_s_host_s": warm, "s": spent, "calibrated_ms_per_call": per * 1e3}


def time_device(cp, stream, launch, *, window_s: float, windows: int, max_call_s: float, warmup_s: float):
    """Event-timed windows of back-to-back ``launch()`` calls on ``stream``, after a warm-up of
    at least ``warmup_s`` in growing batches whose last batch calibrates the calls per window."""

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
        return out, _single_call(rec, first, wall0, max_call_s, None)
    per, host_per, rec["warmup"] = _warmup(timed, first, warmup_s)
    n = max(1, min(MAX_LAUNCHES, math.ceil(window_s / per * 1.02)))
    wall1 = time.time()
    kept, short = _windows(timed, n, window_s, windows)
    _windowed(rec, wall1, kept, short, windows, window_s)
    # Host time per call from a warm-up batch too short to fill the driver's launch queue (in
    # the windows a full queue makes enqueueing as slow as the GPU, whatever the host cost).
    rec["host_ms_per_call"] = host_per * 1e3 if host_per is not None else None
    rec["host_bound"] = bool(host_per is not None and host_per * 1e3 >= HOST_BOUND * rec["ms"])
    rec["timing"] = "windows"
    rec["discarded_short_windows"] = short
    return out, rec


def time_host(launch, *, window_s: float, windows: int, max_call_s: float):
    """The same windows with ``time.perf_counter`` for a CPU backend (the first call is the warm-up)."""

    def timed(n: int):
        t0 = time.perf_counter()
        for _ in range(n):
            launch()
        t = time.perf_counter() - t0
        return t, t

    wall0 = time.time()
    t0 = time.perf_counter()
    out = launch()
    first = time.perf_counter() - t0
    rec = {"first_call_ms": first * 1e3}
    if first > max_call_s:
        return out, _single_call(rec, first, wall0, max_call_s, first * 1e3)
    n = max(1, min(MAX_LAUNCHES, math.ceil(window_s / max(first, 1e-7) * 1.02)))
    wall1 = time.time()
    kept, short = _windows(timed, n, window_s, windows)
    _windowed(rec, wall1, kept, short, windows, window_s)
    rec["host_ms_per_call"] = rec["ms"]
    rec["host_bound"] = None  # meaningless on the CPU
    rec["timing"] = "windows"
    rec["discarded_short_windows"] = short
    return out, rec


def time_windows(cp, stream, launch, *, window_s: float, windows: int):
    """:func:`time_device` without the single-call cap, with a warm-up of min(1 s, ``window_s``):
    (first output, record without the wall-time span)."""
    out, rec = time_device(cp, stream, launch, window_s=window_s, windows=windows, max_call_s=float("inf"),
                           warmup_s=min(1.0, window_s))
    rec.pop("span", None)
    return out, rec
