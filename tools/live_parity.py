"""Live parity: fresh random calls, native ``torch._scaled_mm`` against cpemu on every backend, bit for bit.

On a machine with a GPU and torch, each call is drawn at random (seeded) over the profile's
domain (``--model-share`` of them linear layers of public models, ``--split-share`` inside the
split region, ``--outside-share`` with a feature the profile does not record), run natively, then through ``cpemu.gemm(..., backend=<name>)`` for each backend on
the same FP8 codes and through the torch drop-in ``cpemu.torch.scaled_mm`` (backend
``torch``). Outputs are compared as integer bit patterns. The JSON record holds, per call,
the signature, native's answer (the sha256 of its output bits, or the exception it raised)
and per backend one status:

* ``matched``: every output bit equals native's;
* ``mismatched``: the first differing index and both bit patterns in hex (a failure);
* ``refused``: cpemu raised one of its refusals (a ``ValueError``: ``UnsupportedShape``,
  ``ProfileFeatureError``, ...; for the drop-in also the ``RuntimeError``/``TypeError`` it
  raises where torch would): the type and message;
* ``error``: any other exception (a failure, also where native refused);
* ``both-refused``: native refused and cpemu refused too (for the drop-in, ``same_error``
  says whether type and message equal torch's);
* ``answered-refused``: native refused but cpemu answered (a failure);
* ``skipped``: a host backend (``reference``, ``cpu-fp32``) on a call above ``--reference-max-mac``.

Totals count statuses per backend and per region: ``model-like`` or ``random`` shapes,
``split`` or ``unsplit`` (see :func:`split_region`), ``outside-profile`` (a feature the
profile does not record, drawn on purpose: native should refuse it, and cpemu must too),
``beyond-record`` (a shape that can split with N or K beyond every complete split-K table: outside
the recorded domain, refused as ``outside-domain``) and ``inside-domain`` (every other call: where
cpemu must answer, or refuse only where native does).
The record also holds the device, the torch, CUDA, cuBLASLt and driver versions and the
cpemu commit. Exit status 1 on any failure. The record is rewritten every 25 calls, so a
killed run keeps what it ran; ``--max-seconds`` stops drawing when the time is up.

    python tools/live_parity.py --calls 2000 --seed 1 --max-seconds 540 --out live-parity-h200.json

The pure parts (drawing, operands, comparison, tallies, the run loop with any "native") run
on the CPU; tests/test_live_parity.py checks them with cpemu's reference as the native.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter

import click
import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cpemu  # noqa: E402
from cpemu.backends import on_host  # noqa: E402
from parity_calls import (  # noqa: E402,F401  (the calls; the tests reach them here too)
    BEYOND_SHAPES, DESIGNED, beyond_record, FP8, LARGE_OPTIONS, LARGE_SHAPES, MODEL_NK, TOKEN_RANGES, Operands, _codes, _domain,
    _gauss_table, designed_calls, draw_calls, in_domain, split_region,
)

TOOL, VERSION = "live_parity", 1
DROPIN = "torch"  # the backend name of cpemu.torch.scaled_mm in the record
FAILURES = ("mismatched", "error", "answered-refused")
STATUSES = ("matched", "mismatched", "refused", "error", "both-refused", "answered-refused", "skipped")


def bits(y) -> np.ndarray:
    """An output (numpy, any float dtype of 2 or 4 bytes) as unsigned integer bit patterns."""
    y = np.ascontiguousarray(y)
    return y.view(np.uint16 if y.dtype.itemsize == 2 else np.uint32)


def sha256(y) -> str:
    return hashlib.sha256(bits(y).tobytes()).hexdigest()


def first_difference(want: np.ndarray, got: np.ndarray) -> dict | None:
    """None when the bit patterns are equal, else where and how they first differ."""
    want, got = bits(want), bits(got)
    if want.shape != got.shape or want.dtype != got.dtype:
        return {"reason": f"shape/width differ: native {want.shape} {want.dtype}, cpemu {got.shape} {got.dtype}"}
    ne = want != got
    if not ne.any():
        return None
    idx = np.unravel_index(int(np.argmax(ne)), want.shape)
    w = 2 * want.dtype.itemsize
    return {"index": [int(i) for i in idx], "native": f"0x{int(want[idx]):0{w}x}", "cpemu": f"0x{int(got[idx]):0{w}x}",
            "differing": int(ne.sum())}


def _err(e: BaseException) -> dict:
    """The exception as JSON; a refusal of the profile (UnsupportedShape) also names its ``reason``."""
    out = {"type": type(e).__name__, "message": " ".join(str(e).split())[:2000]}
    if isinstance(getattr(e, "reason", None), str):
        out["reason"] = e.reason
    return out


def classify(name: str, native: dict, want, run) -> dict:
    """One backend's outcome on one call: ``run()`` gives cpemu's output or raises."""
    t0 = time.perf_counter()
    try:
        got = run()
    except Exception as e:  # noqa: BLE001 - every outcome is recorded
        out = {"seconds": time.perf_counter() - t0, "error": _err(e)}
        refusal = isinstance(e, ValueError) or (name == DROPIN and isinstance(e, (RuntimeError, TypeError)))
        if not refusal:
            out["status"] = "error"
        elif native["status"] == "refused":
            out["status"] = "both-refused"
            if name == DROPIN:
                out["same_error"] = out["error"] == native["error"]
        else:
            out["status"] = "refused"
        return out
    out = {"seconds": time.perf_counter() - t0}
    if native["status"] == "refused":
        out.update(status="answered-refused", sha256=sha256(got))
        return out
    diff = first_difference(want, got)
    out["status"] = "matched" if diff is None else "mismatched"
    if diff is not None:
        out["first_difference"] = diff
    return out


def regions(sig: dict) -> list[str]:
    """The tally regions of a call."""
    if sig.get("outside"):
        return ["all", "outside-profile"]
    split = "split" if sig["split_region"] else "unsplit"
    if sig.get("beyond_record"):  # can split, beyond the recorded domain: refused as outside-domain
        return ["all", "model-like" if sig["model_like"] else "random", split, "beyond-record"]
    return ["all", "inside-domain", "model-like" if sig["model_like"] else "random", split]


def tally(entries: list[dict]) -> dict:
    """``{region: {"calls": n, "native": {...}, "backends": {name: {status: n}}}}`` over the entries."""
    out: dict = {}
    for e in entries:
        for reg in regions(e["signature"]):
            r = out.setdefault(reg, {"calls": 0, "native": Counter(), "backends": {}})
            r["calls"] += 1
            r["native"][e["native"]["status"]] += 1
            for name, b in e["backends"].items():
                r["backends"].setdefault(name, Counter())[b["status"]] += 1
            why = next((b.get("error", {}).get("reason", "other") for b in e["backends"].values()
                        if b["status"] == "refused"), None)
            if why is not None:
                r.setdefault("refused_why", Counter())[why] += 1
    return {reg: {"calls": r["calls"], "native": dict(r["native"]),
                  "backends": {n: {s: c[s] for s in STATUSES if c[s]} for n, c in r["backends"].items()},
                  **({"refused_why": dict(r["refused_why"])} if "refused_why" in r else {})}
            for reg, r in out.items()}


def failures(entries: list[dict]) -> int:
    return sum(b["status"] in FAILURES for e in entries for b in e["backends"].values())


# --------------------------------------------------------------------------- runners

def gemm_runner(profile, backend: str):
    """``run(sig, ops)`` of ``cpemu.gemm`` with ``backend`` on numpy copies of the codes."""
    def run(sig, ops):
        bias = None
        if ops.bias is not None:
            bias = ops.bias.view(np.float16 if sig["bias"] == "float16" else ml_dtypes.bfloat16)
        return cpemu.gemm(ops.host("a").view(FP8[sig["a_format"]]), ops.host("bt").view(FP8[sig["b_format"]]).T,
                          profile=profile, scale_a=ops.scale_a, scale_b=ops.scale_b, bias=bias,
                          out_dtype=sig["out_dtype"], fast_accum=sig["fast_accum"], backend=backend)
    return run


def _torch_bits(y) -> np.ndarray:
    import torch

    return y.view(torch.int32 if y.element_size() == 4 else torch.int16).cpu().numpy().view(
        np.uint32 if y.element_size() == 4 else np.uint16)


def native(sig, ops) -> np.ndarray:
    """Native ``torch._scaled_mm`` on the operands' device: its output bit patterns (numpy)."""
    import torch

    a, b, sa, sb, kw = ops.torch_args()
    return _torch_bits(torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, **kw))


def dropin_runner(profile):
    """``run(sig, ops)`` of ``cpemu.torch.scaled_mm`` (backend auto) on the same torch tensors."""
    def run(sig, ops):
        import cpemu.torch as ct

        a, b, sa, sb, kw = ops.torch_args()
        return _torch_bits(ct.scaled_mm(a, b, sa, sb, kw.get("bias"), None, kw["out_dtype"], kw["use_fast_accum"],
                                        profile=profile))
    return run


# --------------------------------------------------------------------------- the run

def run_call(sig: dict, native, runners: dict, reference_max_mac: int, device: str = "cpu") -> dict:
    """Native, then each cpemu runner, on one call's operands (drawn on ``device``)."""
    ops = Operands(sig, device)
    t0 = time.perf_counter()
    try:
        want = native(sig, ops)
        nat = {"status": "answered", "sha256": sha256(want)}
    except Exception as e:  # noqa: BLE001 - torch refusing a call is a result
        want, nat = None, {"status": "refused", "error": _err(e)}
    nat["seconds"] = time.perf_counter() - t0
    entry = {"signature": sig, "native": nat, "backends": {}}
    for name, run in runners.items():
        if on_host(name) and sig["M"] * sig["N"] * sig["K"] > reference_max_mac:
            entry["backends"][name] = {"status": "skipped",
                                       "reason": f"M*N*K above --reference-max-mac {reference_max_mac}"}
            continue
        entry["backends"][name] = classify(name, nat, want, lambda: run(sig, ops))
    return entry


def _progress(entry: dict, done: int, total: int, seen: Counter, echo) -> None:
    s = entry["signature"]
    seen.update(b["status"] for b in entry["backends"].values())
    echo(f"[live-parity] {done}{f'/{total}' if total else ''} M={s['M']} N={s['N']} K={s['K']} {s['a_format']}x{s['b_format']} "
         f"{s['scaling']} {s['out_dtype']} fast={int(s['fast_accum'])} bias={s['bias'] or '-'}: "
         f"native {entry['native']['status']}; "
         + ", ".join(f"{n} {b['status']}" for n, b in entry["backends"].items())
         + "  | " + ", ".join(f"{k} {seen[k]}" for k in STATUSES if seen[k]))


def run_parity(signatures, native, runners: dict, *, header: dict, out: str | None = None,
               max_seconds: float | None = None, reference_max_mac: int = 2 ** 29, total: int | None = None,
               device: str = "cpu", echo=None, save_every: int = 25) -> tuple[dict, int]:
    """Run every call (until ``max_seconds``), write the record to ``out``; (record, exit status)."""
    t0, entries, seen, stopped = time.perf_counter(), [], Counter(), "calls"
    rec = dict(header)
    for sig in signatures:
        if max_seconds is not None and time.perf_counter() - t0 >= max_seconds:
            stopped = "max-seconds"
            break
        entries.append(run_call(sig, native, runners, reference_max_mac, device))
        if echo:
            _progress(entries[-1], len(entries), total or 0, seen, echo)
        if out and len(entries) % save_every == 0:
            _write(out, _finish(rec, entries, t0, "running"))
    rec = _finish(rec, entries, t0, stopped)
    if out:
        _write(out, rec)
    return rec, 1 if rec["failures"] else 0


def _finish(rec: dict, entries: list, t0: float, stopped: str) -> dict:
    return {**rec, "stopped": stopped, "complete": stopped != "running", "elapsed_s": time.perf_counter() - t0,
            "calls_run": len(entries), "failures": failures(entries), "totals": tally(entries), "calls": entries}


def _write(path: str, rec: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- environment and command

def _run_text(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip() or None
    except Exception:  # noqa: BLE001 - missing tool: recorded as None
        return None


def environment(profile) -> dict:
    """Device, software versions, the cpemu commit and the profile's match (after torch loaded cuBLASLt)."""
    import torch

    from cpemu import devicematch

    found = devicematch.detect()
    here = os.path.dirname(os.path.abspath(__file__))
    dirty = _run_text(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"])
    return {"device": found["gpu"], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cublaslt": found["cublaslt"], "cublaslt_library": found["cublaslt_source"],
            "driver": _run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            "cpemu": cpemu.__version__, "cpemu_commit": _run_text(["git", "-C", here, "rev-parse", "HEAD"]),
            "cpemu_tree_modified": bool(dirty), "python": sys.version.split()[0], "numpy": np.__version__,
            "cupy": getattr(sys.modules.get("cupy"), "__version__", None),
            "profile_match": devicematch.match(profile.data, found),
            # NVML's name of the card (the CUDA driver's may be another GPU's, under tools/as_h200.sh) and the
            # attributes such a shim reports in its place
            "nvidia_smi_gpu": _run_text(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]),
            "reported_attributes": {k: os.environ[k] for k in ("SPOOF_NAME", "SPOOF_ATTRS", "SPOOF_TOTAL_MEM")
                                    if k in os.environ} or None}


def _backends(spec: str, profile) -> tuple[dict, list]:
    """The runners named by --backends ("all": every available backend and the drop-in)."""
    from cpemu.backends import LADDER, status

    st = status(profile)
    names = [r["backend"] for r in st if r["available"]] + [DROPIN] if spec == "all" else spec.split(",")
    for n in names:
        if n not in LADDER + (DROPIN,):
            raise click.BadParameter(f"unknown backend {n!r}; known: {', '.join(LADDER + (DROPIN,))}, all",
                                     param_hint="--backends")
    runners = {n: dropin_runner(profile) if n == DROPIN else gemm_runner(profile, n) for n in names}
    return runners, st


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--calls", default=500, show_default=True, help="Calls to draw.")
@click.option("--seed", default=0, show_default=True, help="Seed of the draw.")
@click.option("--profile", "profile_name", default=cpemu.DEFAULT_PROFILE, show_default=True)
@click.option("--backends", "backend_spec", default="all", show_default=True,
              help="Comma-separated cpemu backends (and 'torch', the drop-in), or 'all'.")
@click.option("--out", default="live-parity.json", show_default=True, type=click.Path(dir_okay=False))
@click.option("--max-seconds", type=float, default=None, help="Stop drawing when this time is up.")
@click.option("--model-share", default=0.5, show_default=True, help="Share of model-like shapes.")
@click.option("--split-share", default=0.15, show_default=True,
              help="Share of random shapes drawn inside the split region.")
@click.option("--outside-share", default=0.05, show_default=True,
              help="Share of calls with a feature the profile does not record.")
@click.option("--max-mac", default=2 ** 40, show_default=True, help="Largest M*N*K drawn.")
@click.option("--max-bytes", default=2 ** 30, show_default=True,
              help="Largest (M + N) * K + 4 * M * N drawn (the operands and an FP32 output).")
@click.option("--reference-max-mac", default=2 ** 29, show_default=True,
              help="Largest M*N*K run on a host backend (reference, cpu-fp32: the CPU).")
@click.option("--device", default="cuda", show_default=True,
              help="torch device of the native calls and the drop-in ('cpu' runs torch's CPU kernel: a dry run).")
@click.option("--only", default=None,
              help="Comma-separated call indices: run only these of the draw (same seed and options re-run them).")
@click.option("--designed", type=click.Choice(list(DESIGNED)), default=None,
              help="Run a designed suite instead of a random draw: 'large' (shapes above 16384 in each "
                   "dimension where nothing splits, Evo 2 at M = 32768; tensorwise and rowwise) or 'beyond' "
                   "(above 131072 in some dimension where nothing splits: LM heads, M up to 2^20, K = 2^18).")
def main(calls, seed, profile_name, backend_spec, out, max_seconds, model_share, split_share, outside_share,
         max_mac, max_bytes, reference_max_mac, device, only, designed):
    """Native torch._scaled_mm against cpemu on fresh random calls; exit 1 on any failure."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise click.ClickException("live parity needs a CUDA GPU visible to torch (torch.cuda.is_available() "
                                   "is False)")
    profile = cpemu.get_profile(profile_name)
    runners, st = _backends(backend_spec, profile)
    header = {"tool": TOOL, "version": VERSION, "command": sys.argv, "profile": profile.name,
              "options": {"calls": calls, "seed": seed, "backends": list(runners), "max_seconds": max_seconds,
                          "model_share": model_share, "split_share": split_share,
                          "outside_share": outside_share, "max_mac": max_mac, "max_bytes": max_bytes,
                          "reference_max_mac": reference_max_mac, "device": device, "only": only,
                          "designed": designed},
              "backend_status": st}
    sigs = draw_calls(profile, calls, seed, model_share=model_share, split_share=split_share,
                      outside_share=outside_share, max_mac=max_mac, max_bytes=max_bytes)
    total = calls
    if designed:
        sigs = list(designed_calls(profile, seed, designed))
        total = calls = len(sigs)
    if only:
        try:
            keep = {int(i) for i in only.split(",")}
        except ValueError:
            raise click.BadParameter(f"must be comma-separated call indices, got {only!r}", param_hint="--only")
        sigs, total = (s for s in sigs if s["index"] in keep), len([i for i in keep if 0 <= i < calls])
    one = torch.ones((), device=device)  # torch loads its cuBLASLt: the environment names that library
    torch._scaled_mm(torch.zeros(16, 32, device=device).to(torch.float8_e4m3fn),
                     torch.zeros(16, 32, device=device).to(torch.float8_e4m3fn).t(), one, one,
                     out_dtype=torch.bfloat16)
    header["environment"] = environment(profile)
    rec, code = run_parity(sigs, native, runners, header=header, out=out, max_seconds=max_seconds,
                           reference_max_mac=reference_max_mac, total=total, device=device,
                           echo=lambda m: click.echo(m, err=True))
    for reg, r in rec["totals"].items():
        click.echo(f"{reg}: {r['calls']} calls; native {r['native']}; "
                   + "; ".join(f"{n} {c}" for n, c in r["backends"].items()), err=True)
    click.echo(f"{rec['calls_run']} calls in {rec['elapsed_s']:.0f} s, {rec['failures']} failures; record: {out}",
               err=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
