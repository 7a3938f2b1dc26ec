"""The ``cpemu`` command line: ``cpemu info``, ``cpemu gemm``, ``cpemu verify``.

* ``cpemu info`` -- the shipped profiles (device, library, verification status,
  instruction model, recorded scaling modes and output dtypes), the backends of this
  build and the devices they could run on. ``--json`` for machine-readable output.
* ``cpemu gemm`` -- one emulated ``torch._scaled_mm`` on operands from ``.npy`` files
  or on a built-in Evo 2 projection shape (the default: ``--demo evo2-1b`` at M = 16);
  prints the schedule, the sha256 of the output bytes, the speed and, for a demo, whether
  the output is the H200's recorded one (``--recorded`` runs the recorded call).
* ``cpemu verify TRUTH_DIR`` -- recompute every case of a GPU truth recording and
  compare bits; exits non-zero on any mismatch or error.

Errors of the emulator (``ValueError`` and its subclasses: bad arguments, a feature
the profile does not record, a shape outside its recorded schedule) are reported as
one ``Error: ...`` line, never as a traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import sys
import time
from collections import Counter

import click
import jsonschema
import numpy as np

from .api import BACKENDS, gemm as _gemm
from .cases import EVO2_SHAPES
from .formats import FP8_FORMATS, OUT_DTYPES
from .profile import DEFAULT_PROFILE, Profile, get_profile, profiles
from . import cli_gemm as _g
from .progress import Progress

__all__ = ["main"]

STATUSES = ("match", "mismatch", "rejected-both", "error")


# --------------------------------------------------------------------------- helpers

def _one_line(e: BaseException) -> str:
    if isinstance(e, jsonschema.ValidationError):
        path = "/".join(str(p) for p in e.absolute_path)
        msg = f"schema validation failed at '{path}': {e.message}"
    else:
        msg = str(e) or type(e).__name__
    return " ".join(msg.split())


@contextlib.contextmanager
def _clean_errors():
    """Turn the emulator's errors into click's one-line ``Error: ...``."""
    try:
        yield
    except click.ClickException:
        raise
    except (ValueError, jsonschema.ValidationError, OSError) as e:
        raise click.ClickException(_one_line(e)) from e


def _resolve_profile(spec: str | None) -> Profile:
    """A shipped profile by name, or a profile JSON file (validated against the schema)."""
    if spec is None:
        spec = DEFAULT_PROFILE
    return get_profile(spec)


def _cuda_status() -> dict:
    """cupy and the CUDA devices it sees (never raises)."""
    st = {"cupy": None, "devices": [], "reason": None}
    try:
        cupy = importlib.import_module("cupy")
    except ImportError:
        st["reason"] = "cupy is not installed (pip install 'cpemu[cuda12]' or 'cpemu[cuda13]')"
        return st
    except Exception as e:  # a broken install
        st["reason"] = f"cupy failed to import: {_one_line(e)}"
        return st
    try:
        st["cupy"] = getattr(cupy, "__version__", "?")
        n = int(cupy.cuda.runtime.getDeviceCount())
        for i in range(n):
            p = cupy.cuda.runtime.getDeviceProperties(i)
            name = p.get("name", b"?")
            st["devices"].append({
                "index": i,
                "name": name.decode(errors="replace") if isinstance(name, bytes) else str(name),
                "compute_capability": f"{p.get('major', '?')}.{p.get('minor', '?')}",
                "sm_count": p.get("multiProcessorCount"),
                "memory_gib": round(p.get("totalGlobalMem", 0) / 2 ** 30, 1),
            })
        if n == 0:
            st["reason"] = "cupy is installed but sees no CUDA device"
    except Exception as e:  # no driver, no device, broken install: all mean "not available"
        st["reason"] = f"cupy is installed but CUDA is not usable: {_one_line(e)}"
    return st


def _backends(cuda: dict) -> list[dict]:
    """Each backend of the ladder: available here, validated for each shipped profile, or why not."""
    from .backends import LADDER, available, validate
    from .profile import DEFAULT_PROFILE, get_profile

    out = []
    for name in LADDER:
        ok, why = available(name)
        row = {"name": name, "available": ok, "detail": why, "validated": None}
        if name == "reference":
            row["detail"] = f"numpy {np.__version__} on the CPU (integer T-FDPA model, the specification)"
            row["validated"] = True
        elif ok:
            per = {}
            for pname in profiles():
                try:
                    v_ok, v_why = validate(name, get_profile(pname))
                except Exception as e:  # noqa: BLE001 - info must not crash
                    v_ok, v_why = False, f"{type(e).__name__}: {e}"
                per[pname] = {"validated": bool(v_ok), "validation": v_why}
            row["profiles"] = per
            default = per.get(DEFAULT_PROFILE, {"validated": False, "validation": "default profile missing"})
            row["validated"], row["validation"] = default["validated"], default["validation"]
        out.append(row)
    return out


def _cpu_info() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"machine": platform.machine(), "processor": platform.processor() or None,
            "cpu_count": os.cpu_count(), "usable_cpus": usable}


def _profile_info(name: str) -> dict:
    p = get_profile(name)
    d = p.data
    ins = d["instruction"]
    modes = {}
    for scaling, m in d["modes"].items():
        modes[scaling] = {"kernel": m["kernel"], "out_dtypes": list(m["out_dtypes"]),
                          "bias_dtypes": dict(m["bias_dtypes"]),
                          "promotion_interval": m["promotion_interval"],
                          "split_k": m["split_k"]["kind"], "epilogue": m["epilogue"]["order"],
                          "domain": m["split_k"].get("domain")}
    ver = d["verification"]
    return {"name": p.name, "arch": d["arch"], "device": d["device"], "library": d["library"],
            "caller": d["caller"], "summary": d["summary"],
            "verification": {"status": ver["status"], "method": ver["method"], "truth": ver.get("truth"),
                             "counts": dict(ver["counts"])},
            "instruction": {k: ins[k] for k in ("name", "L", "F", "rounding", "e_zero")},
            "formats": [list(f) for f in d["formats"]], "modes": modes,
            "default": p.name == DEFAULT_PROFILE}


# --------------------------------------------------------------------------- group

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cpemu")
def main():
    """cpemu: bit-exact emulation of the FP8 matrix products (torch._scaled_mm)
    of named NVIDIA GPUs, on the CPU."""


# --------------------------------------------------------------------------- info

@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info(as_json):
    """Shipped profiles, backends and devices."""
    profs, bad = [], []
    for name in profiles():
        try:
            profs.append(_profile_info(name))
        except Exception as e:  # a broken profile file must not hide the others
            bad.append({"name": name, "error": _one_line(e)})
    cuda = _cuda_status()
    report = {"cpemu": _version(), "default_profile": DEFAULT_PROFILE, "profiles": profs,
              "invalid_profiles": bad, "backends": _backends(cuda),
              "devices": {"cpu": _cpu_info(), "cuda": cuda["devices"]},
              "device_match": _device_match(cuda, [p["name"] for p in profs])}
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        _print_info(report, cuda)
    if bad:
        sys.exit(1)


def _device_match(cuda: dict, names: list[str]) -> dict:
    """What this machine is (GPU 0, cuBLASLt, torch) and, per shipped profile, whether it matches."""
    from . import devicematch

    found = devicematch.detect(cuda)
    return {"detected": found,
            "profiles": {n: devicematch.match(get_profile(n).data, found) for n in names}}


def _print_device_match(dm: dict):
    from .devicematch import cublaslt_text, verdict_text

    echo, found = click.echo, dm["detected"]
    gpu = found["gpu"]
    echo("This device (a profile gives its GPU's own bits where it matches):")
    echo(f"  GPU:      {gpu['name']}, {gpu['sm_count'] or '?'} SMs (found by {found['found_by']})" if gpu else
         f"  GPU:      no GPU found ({found['no_gpu_reason']})")
    echo("  cuBLASLt: " + (f"{cublaslt_text(found['cublaslt'])}, {found['cublaslt_source']}"
                            if found["cublaslt"] is not None else f"not found ({found['cublaslt_source']})"))
    echo(f"  torch:    {found['torch'] or 'not installed'}")
    for name, m in dm["profiles"].items():
        echo(f"  {name}: {verdict_text(m)}")


def _version() -> str:
    from . import __version__

    return __version__


def _print_info(r: dict, cuda: dict):
    echo = click.echo
    echo(f"cpemu {r['cpemu']}")
    echo("")
    echo(f"Profiles ({len(r['profiles'])}; default {r['default_profile']}):")
    if not r["profiles"]:
        echo("  (none shipped)")
    for p in r["profiles"]:
        v, ins = p["verification"], p["instruction"]
        echo(f"  {p['name']}{'  [default]' if p['default'] else ''}")
        echo(f"    arch {p['arch']}, device {p['device']}")
        echo(f"    library {p['library']}, caller {p['caller']}")
        counts = ", ".join(f"{k} {c}" for k, c in v["counts"].items()) or "-"
        echo(f"    verification: {v['status']} ({v['method']}); counts: {counts}")
        echo(f"    instruction: {ins['name']}: L={ins['L']} F={ins['F']} rounding={ins['rounding']} "
             f"e_zero={ins['e_zero']}")
        echo(f"    formats (a x b): {', '.join(a + 'x' + b for a, b in p['formats'])}")
        for scaling, m in p["modes"].items():
            bias = ", ".join(f"{o}:{b}" for o, b in m["bias_dtypes"].items() if b) or "none"
            echo(f"    mode {scaling}: out {', '.join(m['out_dtypes'])}; bias {bias}; "
                 f"split-K {m['split_k']}; promotion every {m['promotion_interval']} steps; "
                 f"epilogue {m['epilogue']}")
            if m["domain"]:
                echo("      domain: " + ", ".join(f"{ax} {m['domain'][ax][0]}..{m['domain'][ax][1]}"
                                                   for ax in "MNK" if ax in m["domain"]))
                ns = m["domain"].get("no_split")
                if ns:
                    echo("      beyond it, where nothing can split: " + ", ".join(f"{ax} {ns[ax][0]}..{ns[ax][1]}"
                                                                          for ax in "MNK"))
    for b in r["invalid_profiles"]:
        echo(f"  {b['name']}: INVALID: {b['error']}")
    echo("")
    echo("Backends:")
    for b in r["backends"]:
        state = "available" if b["available"] else "not available"
        echo(f"  {b['name']:<12} {state}{': ' + b['detail'] if b['detail'] else ''}")
        for pname, v in (b.get("profiles") or {}).items():
            echo(f"    {pname}: " + ("validated on this device" if v["validated"] else
                                    f"NOT validated on this device ({v['validation']})"))
    echo("")
    cpu = r["devices"]["cpu"]
    echo("Devices:")
    echo(f"  cpu: {cpu['usable_cpus']} usable of {cpu['cpu_count']} CPUs ({cpu['machine']})")
    if r["devices"]["cuda"]:
        for d in r["devices"]["cuda"]:
            echo(f"  cuda:{d['index']}: {d['name']} (sm {d['compute_capability']}, {d['memory_gib']} GiB)")
    else:
        echo(f"  cuda: none ({cuda['reason'] or 'no device'})")
    echo("")
    _print_device_match(r["device_match"])


# --------------------------------------------------------------------------- gemm

@main.command()
@click.option("--a", "a_path", type=click.Path(exists=True, dir_okay=False),
              help="A (M, K): .npy of uint8 FP8 codes.")
@click.option("--b", "b_path", type=click.Path(exists=True, dir_okay=False),
              help="B (K, N), or (N, K) with --b-transposed: .npy of uint8 FP8 codes.")
@click.option("--a-format", type=click.Choice(sorted(FP8_FORMATS)), default=None,
              help="FP8 format of A's codes (default e4m3).")
@click.option("--b-format", type=click.Choice(sorted(FP8_FORMATS)), default=None,
              help="FP8 format of B's codes (default e4m3).")
@click.option("--b-transposed", is_flag=True, help="The B file holds B transposed, (N, K) (torch's column-major b).")
@click.option("--demo", type=click.Choice(list(EVO2_SHAPES)), default=None,
              help="Built-in Evo 2 FP8 projection shape (the default when no --a/--b are given).")
@click.option("--M", "--m", "m_rows", type=int, default=None, help="Rows of A for --demo (default 16).")
@click.option("--seed", type=int, default=0, show_default=True, help="Data seed for --demo.")
@click.option("--recorded", is_flag=True,
              help="Run the demo's call as the H200 recorded it (M = 16, the recorded seed, random FP32 tensor "
                   "scales drawn from it) and compare the output with the recording.")
@click.option("--profile", "profile_spec", default=None,
              help=f"Profile name or path to a profile JSON file (default {DEFAULT_PROFILE}).")
@click.option("--scale-a", type=float, default=1.0, show_default=True, help="Tensorwise scale of A.")
@click.option("--scale-b", type=float, default=1.0, show_default=True, help="Tensorwise scale of B.")
@click.option("--out-dtype", type=click.Choice(sorted(OUT_DTYPES)), default="bfloat16", show_default=True)
@click.option("--fast-accum/--no-fast-accum", default=True, show_default=True,
              help="torch's use_fast_accum.")
@click.option("--backend", default="auto", show_default=True, help=f"auto or one of {', '.join(BACKENDS)}.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Save the result (.npy).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def gemm(a_path, b_path, a_format, b_format, b_transposed, demo, m_rows, seed, recorded, profile_spec, scale_a,
         scale_b, out_dtype, fast_accum, backend, out_path, as_json):
    """One emulated torch._scaled_mm: out = (A @ B) * scale_a * scale_b.

    With no operands, runs the evo2-1b demo (M=16, N=5760, K=1920) on the CPU. Long work draws a
    progress line with an estimate on stderr (on a terminal).
    """
    notes: list[str] = []
    case = None
    with _clean_errors():
        if out_path and not os.path.isdir(os.path.dirname(os.path.abspath(out_path))):
            raise click.ClickException(f"--out: the folder of {out_path} does not exist (checked before computing)")
        prof = _resolve_profile(profile_spec)
        if a_path is not None or b_path is not None:
            if recorded:
                raise click.UsageError("--recorded applies to --demo only")
            A, B, source = _g.file_operands(a_path, b_path, a_format, b_format, b_transposed, demo, m_rows)
            sa, sb = _g.scale(scale_a, "scale_a", notes), _g.scale(scale_b, "scale_b", notes)
        else:
            case = _g.demo_call(demo, m_rows, seed, recorded, a_format, b_format, fast_accum, out_dtype, scale_a,
                                scale_b)
            _g.check_before_inputs(prof, case, backend)
            A, B, sa, sb = _g.demo_operands(case, scale_a, scale_b, notes)
            source = f"demo {demo or 'evo2-1b'} (gauss40 data, seed {case.seed}" + \
                (", the H200's recorded call)" if recorded else ")")
        call = _g.gemm_call(prof, A, B, fast_accum, out_dtype)
        t0 = time.perf_counter()
        y = _gemm(A, B, profile=prof, scale_a=sa, scale_b=sb, out_dtype=out_dtype, fast_accum=fast_accum,
                  backend=backend, progress=True)
        elapsed = time.perf_counter() - t0
        saved = _g.save(out_path, y) if out_path else None
    from .backends import select

    plan = None if call is None else call.plan
    rec = _g.gemm_record(source, A, B, y, prof, select(backend, prof, call), out_dtype, fast_accum, sa, sb, plan,
                         elapsed, out_path, notes + ([saved] if saved else []))
    if case is not None:
        from .demo import verdict

        rec["h200"] = verdict(case, prof.name, rec["manifest_sha256"])
    if as_json:
        click.echo(json.dumps(rec, indent=1))
    else:
        _g.print_gemm(rec, prof, plan, y)
    if (rec.get("h200") or {}).get("equal") is False:
        sys.exit(1)


# --------------------------------------------------------------------------- verify

@main.command()
@click.argument("truth_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--profile", "profile_spec", default=None,
              help="Profile name or JSON file (default: the profile the manifest names).")
@click.option("--backend", default="auto", show_default=True)
@click.option("--show", type=int, default=10, show_default=True, help="How many mismatches/errors to list.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
@click.option("--jobs", default=1, show_default=True, type=click.IntRange(min=1),
              help="Processes (each call's host backend also uses CPEMU_THREADS threads).")
def verify(truth_dir, profile_spec, backend, show, as_json, jobs):
    """Recompute a GPU truth recording (TRUTH_DIR/manifest.json) and compare bits.

    Exits 1 on any mismatch or error.
    """
    from .truth import load_manifest, verify_folder

    if backend not in ("auto",) + BACKENDS:
        raise click.BadParameter(f"must be 'auto' or one of {', '.join(BACKENDS)}", param_hint="--backend")
    with _clean_errors():
        man = load_manifest(truth_dir, verify_files=False)
        prof = _resolve_profile(profile_spec or man["profile"])
        total = len(man["cases"])
        seen = Counter()
        t0 = time.perf_counter()
        work = {c["id"]: c["M"] * c["N"] * c["K"] for c in man["cases"]}  # products: the estimate's unit
        line = Progress(sum(work.values()), "cpemu verify")

        def tally() -> str:
            return f"{sum(seen.values())}/{total} cases: " + ", ".join(f"{s} {seen[s]}" for s in STATUSES)

        def progress(r):
            seen[r.status] += 1
            line.add(work.get(r.case_id, 0), tally())

        with line:
            results, counts = verify_folder(truth_dir, profile=prof, backend=backend, progress=progress, jobs=jobs)
        click.echo(f"  {tally()}  ({time.perf_counter() - t0:.0f} s)", err=True)
    totals = Counter(r.status for r in results)
    features = sorted({f for f, _ in counts})
    table = {f: {s: counts[(f, s)] for s in STATUSES} for f in features}
    failed = [r for r in results if r.status in ("mismatch", "error")]
    if as_json:
        click.echo(json.dumps({"truth": truth_dir, "profile": prof.name, "cases": total,
                               "totals": {s: totals[s] for s in STATUSES}, "features": table,
                               "failures": [{"case": r.case_id, "status": r.status, "mismatches": r.mismatches,
                                             "detail": r.detail} for r in failed]}, indent=1))
    else:
        echo = click.echo
        echo(f"truth:   {truth_dir} ({total} cases, recorded for {man['profile']})")
        echo(f"profile: {prof.name}")
        w = max([len("feature")] + [len(f) for f in features])
        echo(f"{'feature':<{w}}  " + "  ".join(f"{s:>13}" for s in STATUSES))
        for f in features:
            echo(f"{f:<{w}}  " + "  ".join(f"{table[f][s]:>13}" for s in STATUSES))
        echo(f"{'TOTAL':<{w}}  " + "  ".join(f"{totals[s]:>13}" for s in STATUSES))
        for r in failed[:show]:
            what = f"{r.mismatches} element(s) differ" if r.status == "mismatch" else "error"
            echo(f"{r.status.upper()} {r.case_id}: {what}: {r.detail}")
        if len(failed) > show:
            echo(f"... and {len(failed) - show} more")
    if failed:
        sys.exit(1)


# --------------------------------------------------------------------------- record

@main.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the recordings, the profile and the report (a rerun resumes).")
@click.option("--base-profile", default="hopper-h200-torch", show_default=True,
              help="Profile whose instruction model and schedule the new one starts from "
                   "(e.g. ada-rtx4060-torch on an RTX 4060).")
@click.option("--name", default=None, help="Profile name (arch-device-torch); derived from the GPU by default.")
@click.option("--suite", "suites", multiple=True, help="Truth suites to record (default: all).")
@click.option("--heldout", default=3000, show_default=True, help="Random held-out shapes per sample for the split-K check.")
@click.option("--jobs", default=os.cpu_count() or 1, show_default=True,
              help="Processes for the final verification and the complete split-K record.")
@click.option("--complete-splitk", "complete_seconds", type=click.FloatRange(0, min_open=True), default=None,
              help="Also record the complete split-K table for this many seconds (a rerun continues it).")
@click.option("--complete-rowbias", "rowbias_seconds", type=click.FloatRange(0, min_open=True), default=None,
              help="Also record, for this many seconds, where the heuristic has an algorithm for rowwise scales "
                   "with bias and fast accumulation where K can split (a rerun continues it).")
def record(out_dir, base_profile, name, suites, heldout, jobs, complete_seconds, rowbias_seconds):
    """Record this GPU's torch._scaled_mm numerics into a new profile and truth folder.

    Needs an NVIDIA GPU and torch. Writes OUT/profile/<name>.json (+ its split-K table),
    OUT/truth (recordings with a manifest), OUT/raw (everything asked), OUT/report.json.
    Use the profile with `--profile OUT/profile/<name>.json` or `cpemu.gemm(profile=path)`.
    """
    from .cases import SUITES
    from .recording.record import record as run_record

    def progress(label):
        """A callback ``(done, total)`` drawing a progress line with an estimate (on a terminal)."""
        lines: dict = {}

        def cb(done, total):
            line = lines.get(total) or lines.setdefault(total, Progress(total, f"record {label}"))
            line.update(done, f"{done}/{total}")
            if done >= total:
                line.close()
        return cb

    try:
        import torch

        if not torch.cuda.is_available():
            raise click.ClickException("cpemu record needs a CUDA GPU visible to torch (torch.cuda.is_available() "
                                       "is False)")
    except ImportError as e:
        raise click.ClickException("cpemu record needs torch with CUDA: pip install torch") from e
    with _clean_errors():
        rep = run_record(out_dir, base_profile, name, tuple(suites) or SUITES, heldout,
                         echo=lambda m: click.echo(m, err=True), progress=progress, jobs=jobs,
                         complete_seconds=complete_seconds, rowbias_seconds=rowbias_seconds)
    click.echo(f"profile {rep['profile']}: {rep['status']}; truth {rep['truth']['cases']} calls "
               f"({rep['truth']['rejected']} rejected by torch); split-K laws hold on "
               f"{sum(c['queries'] for c in rep['split_k_rule']['checks'].values())} heuristic answers")
    for a in rep.get("attempts", []):
        click.echo(f"  schedule {a['candidate'] or 'of the base profile'}: {a['status']}")
    click.echo(f"report: {os.path.join(out_dir, 'report.json')}")
    if rep["status"] != "recorded":
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
