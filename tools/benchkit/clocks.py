"""The SM clock, power and temperature during a benchmark, sampled with nvidia-smi."""

from __future__ import annotations

import math
import shutil
import statistics
import subprocess
import threading
import time

#: nvidia-smi sampling period (seconds) and the fields sampled.
CLOCK_PERIOD_S = 0.1
CLOCK_FIELDS = ("clocks.sm", "power.draw", "temperature.gpu")


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


def rate_figures(macs: int, ms: float | None, clock: dict | None, sm_count: int | None) -> dict:
    """TMAC/s, the clock and MAC per clock per SM of ``macs`` in ``ms`` per call, with the SM
    clock summary ``clock`` (:meth:`ClockSampler.summary`, or None) on ``sm_count`` SMs."""
    mhz = (clock or {}).get("sm_mhz_median")
    return {"tmacs": macs / (ms / 1e3) / 1e12 if ms else None, "clock": clock,
            "mac_per_clock_per_sm": macs / (ms / 1e3) / (mhz * 1e6) / sm_count if ms and mhz and sm_count else None}


def clock_record() -> dict:
    """The record's ``clock`` section before sampling starts."""
    return {"source": None, "note": None, "fields": list(CLOCK_FIELDS), "period_s": CLOCK_PERIOD_S,
            "samples_format": "[unix_time, sm_mhz, power_w, temp_c]", "samples": []}


def _smi_index(gpus: list[dict], device: dict | None) -> tuple[str | None, str | None]:
    """nvidia-smi's index of the cupy device (matched by PCI bus id; the only GPU; else the
    cupy index), and a note when the bus id was not found."""
    index, note = None, None
    want = _pci_key((device or {}).get("pci_bus_id") or "")
    for g in gpus:
        if want is not None and _pci_key(g.get("pci.bus_id", "")) == want:
            index = g.get("index")
    if index is None and len(gpus) == 1:
        index = gpus[0].get("index")
    if index is None and gpus:
        index = str((device or {}).get("index", 0))
        note = (f"the cupy device's PCI bus id was not found among nvidia-smi's GPUs; "
                f"sampling nvidia-smi GPU index {index}")
    return index, note


def start_sampling(record: dict, need_gpu: bool, warn) -> ClockSampler | None:
    """Find nvidia-smi and the device's GPU in it, record both in ``record["clock"]`` (and the
    driver in ``record["device"]``), and start a sampler; None without one. ``warn(msg)``
    reports what a GPU run misses."""
    clock = record["clock"]
    exe = find_nvidia_smi()
    if exe is None:
        clock["note"] = ("nvidia-smi not found on PATH: the SM clock, power and temperature were not "
                         "sampled; clock fields and mac_per_clock_per_sm are null")
        if need_gpu:
            warn(clock["note"])
        return None
    gpus, err = nvidia_smi_gpus(exe)
    clock["nvidia_smi_gpus"] = gpus
    if err:
        clock["note"] = f"nvidia-smi --query-gpu failed: {err}"
    index, note = _smi_index(gpus, record["device"])
    if note:
        clock["note"] = note
    clock["nvidia_smi_index"] = index
    if record["device"] is not None:
        for g in gpus:
            if g.get("index") == index:
                record["device"]["driver_version"] = g.get("driver_version")
                record["device"]["nvidia_smi"] = g
    if not gpus:
        if need_gpu:
            warn(clock["note"] or "nvidia-smi lists no GPU; clock fields are null")
        return None
    s = ClockSampler(exe, index)
    if s.start():
        clock["source"] = " ".join(s._cmd())
        return s
    clock["note"] = f"nvidia-smi sampling failed: {s.error}; clock fields are null"
    warn(clock["note"])
    return None
