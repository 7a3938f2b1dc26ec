"""The state of one ``tools/bench_kernels.py`` run: its settings, the record being written, the
GPU handles, the progress and the failures."""

from __future__ import annotations

import dataclasses
import sys
import time

import click

from benchkit.clocks import ClockSampler, rate_figures
from benchkit.provenance import utc
from benchkit.records import write_json


@dataclasses.dataclass(frozen=True)
class Settings:
    """The options of a run that every configuration uses."""

    fast_accum: bool
    out_dtype: str
    seed: int
    check_rows: int
    window_s: float
    windows: int
    max_call_s: float
    max_check_call_s: float
    reference_max_macs: float
    api_max_ms: float

    @classmethod
    def of(cls, params: dict) -> Settings:
        return cls(**{f.name: params[f.name] for f in dataclasses.fields(cls)})


def hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Bench:
    """One run: the settings, the profile, the backends, the record and what it has done."""

    def __init__(self, settings: Settings, prof, record: dict, out_path: str):
        self.s = settings
        self.prof = prof
        self.model, self.mode = prof.instruction, prof.mode("tensorwise")
        self.rec = record
        self.out_path = out_path
        self.failures: list[str] = []
        self.warnings: list[str] = []
        self.best_rate: dict = {}  # kernel -> best MAC/s so far (to predict call times)
        self.kernels: list[str] = []  # the backends of the run, in order
        self.runnable_cuda: list[str] = []  # its CUDA backends that can run here
        self.native_on = False
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
        self.rec["finished_utc" if complete else "updated_utc"] = utc()
        if self.sampler is not None:
            self.rec["clock"]["samples"] = self.sampler.snapshot()
            self.rec["clock"]["errors"] = list(self.sampler.errors)
            self.rec["clock"]["error"] = self.sampler.error
        self.rec["failures"] = list(self.failures)
        self.rec["warnings"] = list(self.warnings)
        write_json(self.rec, self.out_path)

    def progress(self, label: str):
        el = time.perf_counter() - self.t_start
        line = f"[{self.done}/{self.total}] {hms(el)} {label}"
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

    def skip(self, base: dict, what: str, reason: str) -> dict:
        """The record of a backend that is not run on a configuration (also listed under ``skipped``)."""
        r = dict(base, status="skipped", reason=reason)
        self.rec["skipped"].append({k: base.get(k) for k in ("kernel", "shape", "data", "M")} | {"reason": reason})
        self.log(f"skip {what}: {reason}")
        return r

    # -------------------------------------------------------- derived figures
    def figures(self, r: dict, macs: int, span):
        """TMAC/s, the clock during ``span`` (wall time) and MAC per clock per SM of a timed record."""
        r.update(rate_figures(macs, r.get("ms"), self.clock_of(span), self.sm_count))

    def clock_of(self, span):
        if self.sampler is None or not span:
            return None
        return self.sampler.summary(span[0], span[1])
