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
* ``skipped``: the reference backend on a call above ``--reference-max-mac``.

Totals count statuses per backend and per region: ``model-like`` or ``random`` shapes,
``split`` or ``unsplit`` (see :func:`split_region`), ``outside-profile`` (a feature the
profile does not record, drawn on purpose: native should refuse it, and cpemu must too).
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
import math
import os
import subprocess
import sys
import time
from collections import Counter

import click
import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import cpemu  # noqa: E402

TOOL, VERSION = "live_parity", 1
DROPIN = "torch"  # the backend name of cpemu.torch.scaled_mm in the record
FAILURES = ("mismatched", "error", "answered-refused")
STATUSES = ("matched", "mismatched", "refused", "error", "both-refused", "answered-refused", "skipped")
FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
DEFAULT_DOMAIN = {"M": [1, 16384], "N": [16, 16384], "K": [16, 16384]}

# Token counts of decode and prefill, and the (N, K) of the linear layers of public models:
# fused q/k/v, attention output, fused gate+up, gate or up alone, down; Evo 2's FP8 projections.
TOKEN_RANGES = ((1, 16), (32, 512), (1024, 8192))
MODEL_NK = {
    "llama3-8b": ((6144, 4096), (4096, 4096), (28672, 4096), (14336, 4096), (4096, 14336)),
    "llama3-70b": ((10240, 8192), (8192, 8192), (57344, 8192), (28672, 8192), (8192, 28672)),
    "llama3-405b": ((18432, 16384), (16384, 16384), (106496, 16384), (53248, 16384), (16384, 53248)),
    "llama3.2-1b": ((3072, 2048), (2048, 2048), (16384, 2048), (8192, 2048), (2048, 8192)),
    "llama2-13b": ((15360, 5120), (5120, 5120), (27648, 5120), (13824, 5120), (5120, 13824)),
    "qwen2.5-7b": ((4608, 3584), (3584, 3584), (37888, 3584), (18944, 3584), (3584, 18944)),
    "qwen2.5-72b": ((10240, 8192), (8192, 8192), (59136, 8192), (29568, 8192), (8192, 29568)),
    "gemma2-9b": ((8192, 3584), (3584, 4096), (28672, 3584), (14336, 3584), (3584, 14336)),
    "phi3-mini": ((9216, 3072), (3072, 3072), (16384, 3072), (8192, 3072), (3072, 8192)),
    "deepseek-v3": ((36864, 7168), (18432, 7168), (7168, 18432), (4096, 7168), (7168, 2048), (1536, 7168)),
    "evo2": ((5760, 1920), (12288, 4096), (24576, 8192)),
}


# --------------------------------------------------------------------------- drawing

def _domain(profile, scaling: str) -> dict:
    dom = (profile.data["modes"][scaling].get("split_k") or {}).get("domain")
    return dom or DEFAULT_DOMAIN


def in_domain(dom: dict, M: int, N: int, K: int) -> bool:
    """Whether the profile records the schedule of (M, N, K) (its ranges, or an extra (N, K) pair)."""
    def inside(ax, v):
        lo, hi = dom.get(ax, DEFAULT_DOMAIN[ax])
        return lo <= v <= hi

    nk = (inside("N", N) and inside("K", K)) or [N, K] in [list(x) for x in dom.get("extra_NK", ())]
    return inside("M", M) and nk


H200_BOUND = {"k_per_split": 2560, "bytes_per_partial": 4, "n_align": 32, "workspace_bytes": 2 ** 20,
              "workspace_reserve": 16}


def split_region(profile, scaling: str, M: int, N: int, K: int) -> bool:
    """Where cuBLASLt may split K: the profile's mode has a split-K rule and its bound (the profile's
    ``params.bound``, else the one measured on the H200 with torch's 1 MiB workspace),
    u = min(ceil(K/2560) - 1, floor((2^20 - 16) / (4 M ceil32(N)))), allows 2 slices or more.
    A label for the tallies only."""
    sk = profile.data["modes"][scaling].get("split_k") or {}
    if sk.get("kind", "none") == "none":
        return False
    b = {**H200_BOUND, **((sk.get("params") or {}).get("bound") or {})}
    n = -(-N // b["n_align"]) * b["n_align"]
    u = min(-(-K // b["k_per_split"]) - 1,
            (b["workspace_bytes"] - b["workspace_reserve"]) // (b["bytes_per_partial"] * M * n))
    return u >= 2


def _log_int(rng, lo: int, hi: int, step: int = 1) -> int:
    """An integer log-uniform in [lo, hi], a multiple of ``step``."""
    v = math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))
    return int(min(hi, max(lo, v // step * step)))


def _m_top(dom: dict, N: int, K: int, caps: tuple) -> int:
    """The largest M of the domain with M*N*K <= max_mac and the operands and an FP32 output
    ((M + N) * K + 4 * M * N bytes) within max_bytes; ``caps`` = (max_mac, max_bytes)."""
    max_mac, max_bytes = caps
    return min(dom.get("M", DEFAULT_DOMAIN["M"])[1], max_mac // (N * K), (max_bytes - N * K) // (K + 4 * N))


def _model_shape(rng, dom: dict, caps: tuple):
    """(M, N, K, source) of a linear layer of a public model at a decode or prefill token count."""
    pairs = [(m, nk) for m, nks in MODEL_NK.items() for nk in nks
             if in_domain(dom, 1, *nk) and _m_top(dom, *nk, caps) >= 1]
    if not pairs:
        return None
    model, (N, K) = pairs[rng.integers(len(pairs))]
    lo, hi = TOKEN_RANGES[rng.integers(len(TOKEN_RANGES))]
    M = int(rng.integers(lo, hi + 1))
    if model == "evo2":
        M = -(-M // 16) * 16  # Evo 2 pads its tokens to a multiple of 16
    return max(1, min(M, _m_top(dom, N, K, caps))), N, K, model


def _random_shape(rng, dom: dict, caps: tuple):
    """(M, N, K, "random"): log-uniform over the domain, N and K multiples of 16, within ``caps``."""
    (mlo, _), (nlo, nhi), (klo, khi) = (dom.get(ax, DEFAULT_DOMAIN[ax]) for ax in "MNK")
    for _ in range(1000):
        N = _log_int(rng, max(16, nlo), nhi, 16)
        K = _log_int(rng, max(16, klo), khi, 16)
        top = _m_top(dom, N, K, caps)
        if top >= max(1, mlo):
            return _log_int(rng, max(1, mlo), top), N, K, "random"
    raise ValueError(f"--max-mac / --max-bytes: {caps} leave no shape of the domain {dom}")


def _scales(rng, scaling: str) -> dict:
    """How the call's scales are drawn (the values come from the call's seed, see :func:`operands`)."""
    if scaling == "rowwise":
        return {"kind": "random", "log2_range": [-8, 4]}
    if rng.random() < 0.2:
        return {"kind": "unit"}
    return {"kind": "random", "log2_range": [-8, 4]}


def _outside(rng, profile, sig: dict) -> str | None:
    """Make ``sig`` use a feature the profile does not record (native should refuse it); its name."""
    mode = profile.data["modes"][sig["scaling"]]
    options = []
    if ["e5m2", "e5m2"] not in [list(p) for p in profile.data["formats"]]:
        options.append("e5m2 x e5m2")
    if mode["bias_dtypes"].get("float32") is None:
        options.append("bias with float32 output")
    if "float16" in mode["out_dtypes"]:
        options.append("bfloat16 bias with float16 output")
    if not options:
        return None
    what = options[rng.integers(len(options))]
    if what == "e5m2 x e5m2":
        sig["a_format"] = sig["b_format"] = "e5m2"
    elif what == "bias with float32 output":
        sig["out_dtype"], sig["bias"] = "float32", "bfloat16"
    else:
        sig["out_dtype"], sig["bias"] = "float16", "bfloat16"
    return what


def _split_shape(rng, profile, scaling: str, dom: dict, caps: tuple):
    """A random shape inside the split region (None after 1000 tries, or where the mode never splits)."""
    for _ in range(1000 if split_region(profile, scaling, 1, 16, dom.get("K", DEFAULT_DOMAIN["K"])[1]) else 0):
        shape = _random_shape(rng, dom, caps)
        if split_region(profile, scaling, *shape[:3]):
            return shape
    return None


def draw_call(rng, profile, index: int, *, model_share: float = 0.5, split_share: float = 0.15,
              outside_share: float = 0.05, max_mac: int = 2 ** 40, max_bytes: int = 2 ** 30) -> dict:
    """One call's signature, JSON-ready; its operands come from ``signature["seed"]``."""
    modes = sorted(profile.data["modes"], key=lambda m: m != "tensorwise")  # tensorwise first
    scaling = modes[0] if len(modes) == 1 or rng.random() < 0.65 else modes[1 + rng.integers(len(modes) - 1)]
    dom = _domain(profile, scaling)
    u, caps = rng.random(), (max_mac, max_bytes)
    shape = _model_shape(rng, dom, caps) if u < model_share else \
        _split_shape(rng, profile, scaling, dom, caps) if u < model_share + split_share else None
    M, N, K, source = shape or _random_shape(rng, dom, caps)
    mode = profile.data["modes"][scaling]
    a_format, b_format = profile.data["formats"][rng.integers(len(profile.data["formats"]))]
    out_dtype = mode["out_dtypes"][rng.integers(len(mode["out_dtypes"]))]
    bias = mode["bias_dtypes"].get(out_dtype) if rng.random() < 0.3 else None
    sig = {"index": index, "M": M, "N": N, "K": K, "source": source, "a_format": a_format, "b_format": b_format,
           "out_dtype": out_dtype, "scaling": scaling, "scales": _scales(rng, scaling), "bias": bias,
           "fast_accum": bool(rng.random() < 0.5),
           "data": ("codes", "gauss", "nan")[rng.choice(3, p=[0.3, 0.65, 0.05])],
           "seed": int(rng.integers(2 ** 63))}
    sig["outside"] = _outside(rng, profile, sig) if rng.random() < outside_share else None
    sig["model_like"] = source != "random"
    sig["split_region"] = split_region(profile, scaling, M, N, K)
    return sig


def draw_calls(profile, calls: int, seed: int, **kw):
    """``calls`` signatures from one seeded generator (the same seed draws the same calls)."""
    rng = np.random.default_rng(seed)
    for i in range(calls):
        yield draw_call(rng, profile, i, **kw)


# --------------------------------------------------------------------------- operands

_FINITE = {f: np.isfinite(np.arange(256, dtype=np.uint8).view(dt).astype(np.float32)) for f, dt in FP8.items()}


def _gauss_table(fmt: str, sigma: float) -> np.ndarray:
    """65,536 codes whose uniform choice is N(0, sigma^2) rounded to ``fmt`` (saturating), to 2^-16:
    each finite value's share is the normal's mass between the midpoints to its neighbours."""
    codes = np.flatnonzero(_FINITE[fmt] & (np.arange(256) != 0x80)).astype(np.uint8)
    vals = codes.view(FP8[fmt]).astype(np.float64)
    order = np.argsort(vals)
    codes, vals = codes[order], vals[order]
    mids = (vals[1:] + vals[:-1]) / 2
    cdf = 0.5 * (1 + np.vectorize(math.erf)(mids / (sigma * math.sqrt(2))))
    return codes[np.searchsorted(cdf, (np.arange(65536) + 0.5) / 65536)]


def _codes(gen, rng, shape, fmt: str, data: str, device: str):
    """uint8 FP8 codes drawn by torch on ``device``: any finite code ("codes"), N(0, sigma^2) values
    ("gauss", sigma log-uniform in [2^-6, 2^7] from ``rng``, rounded to the format, saturating), or
    gauss with 0.1 % NaN ("nan")."""
    import torch

    if data == "codes":
        c = torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.uint8)
        finite = torch.from_numpy(_FINITE[fmt]).to(device)
        return torch.where(finite[c.long()], c, torch.zeros_like(c))
    table = torch.from_numpy(_gauss_table(fmt, 2.0 ** rng.uniform(-6, 7))).to(device)
    c = table[torch.randint(0, 65536, shape, generator=gen, device=device)]
    if data == "nan":
        c[torch.rand(shape, generator=gen, device=device) < 1e-3] = 0x7F
    return c


class Operands:
    """One call's inputs, drawn from its seed.

    ``codes["a"]`` (M, K) and ``codes["bt"]`` (N, K) are uint8 FP8 codes drawn by torch on ``device``
    (on a GPU they are made where native runs); ``bt`` is the (N, K) weight whose transpose is
    torch's column-major ``b``. ``scale_a`` / ``scale_b`` (float32, shape () or (M, 1) / (1, N))
    and ``bias`` (None or (N,) uint16 bit patterns of ``sig["bias"]``) are numpy arrays.
    """

    def __init__(self, sig: dict, device: str = "cpu"):
        import torch

        rng = np.random.default_rng(sig["seed"])
        gen = torch.Generator(device=device)
        gen.manual_seed(sig["seed"])
        M, N, K = sig["M"], sig["N"], sig["K"]
        self.sig, self.device, self._host, self._torch = sig, device, {}, None
        self.codes = {"a": _codes(gen, rng, (M, K), sig["a_format"], sig["data"], device),
                      "bt": _codes(gen, rng, (N, K), sig["b_format"], sig["data"], device)}
        sh_a, sh_b = ((M, 1), (1, N)) if sig["scaling"] == "rowwise" else ((), ())
        if sig["scales"]["kind"] == "unit":
            sa, sb = np.ones(sh_a, np.float32), np.ones(sh_b, np.float32)
        else:
            lo, hi = sig["scales"]["log2_range"]
            sa = np.exp2(rng.uniform(lo, hi, size=sh_a)).astype(np.float32)
            sb = np.exp2(rng.uniform(lo, hi, size=sh_b)).astype(np.float32)
        self.scale_a, self.scale_b = np.asarray(sa, np.float32), np.asarray(sb, np.float32)
        self.bias = None
        if sig["bias"]:
            dt = np.float16 if sig["bias"] == "float16" else ml_dtypes.bfloat16
            vals = rng.standard_normal(N) * 2.0 ** rng.uniform(-4, 8)
            self.bias = vals.astype(np.float32).astype(dt).view(np.uint16)

    def host(self, name: str) -> np.ndarray:
        """A numpy copy of ``codes[name]`` (made once)."""
        if name not in self._host:
            self._host[name] = self.codes[name].cpu().numpy()
        return self._host[name]

    def torch_args(self) -> tuple:
        """(a, b, scale_a, scale_b, kwargs) of ``torch._scaled_mm`` on the operands' device (made once)."""
        if self._torch is None:
            import torch

            sig, dev = self.sig, self.device
            dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
            kw = {"out_dtype": getattr(torch, sig["out_dtype"]), "use_fast_accum": sig["fast_accum"]}
            if self.bias is not None:
                kw["bias"] = torch.from_numpy(self.bias.view(np.int16)).to(dev).view(getattr(torch, sig["bias"]))
            self._torch = (self.codes["a"].view(dt[sig["a_format"]]), self.codes["bt"].view(dt[sig["b_format"]]).t(),
                           torch.from_numpy(self.scale_a).to(dev), torch.from_numpy(self.scale_b).to(dev), kw)
        return self._torch


# --------------------------------------------------------------------------- comparison and tallies

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
    return {"type": type(e).__name__, "message": " ".join(str(e).split())[:2000]}


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
    return ["all", "model-like" if sig["model_like"] else "random", "split" if sig["split_region"] else "unsplit"]


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
    return {reg: {"calls": r["calls"], "native": dict(r["native"]),
                  "backends": {n: {s: c[s] for s in STATUSES if c[s]} for n, c in r["backends"].items()}}
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
        if name == "reference" and sig["M"] * sig["N"] * sig["K"] > reference_max_mac:
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
            "profile_match": devicematch.match(profile.data, found)}


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
              help="Largest M*N*K run on the reference backend (the CPU).")
@click.option("--device", default="cuda", show_default=True,
              help="torch device of the native calls and the drop-in ('cpu' runs torch's CPU kernel: a dry run).")
@click.option("--only", default=None,
              help="Comma-separated call indices: run only these of the draw (same seed and options re-run them).")
def main(calls, seed, profile_name, backend_spec, out, max_seconds, model_share, split_share, outside_share,
         max_mac, max_bytes, reference_max_mac, device, only):
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
                          "reference_max_mac": reference_max_mac, "device": device, "only": only},
              "backend_status": st}
    sigs = draw_calls(profile, calls, seed, model_share=model_share, split_share=split_share,
                      outside_share=outside_share, max_mac=max_mac, max_bytes=max_bytes)
    total = calls
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
