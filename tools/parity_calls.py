"""The calls of tools/live_parity.py: shapes drawn over a profile's domain (model-like, random,
in the split region, outside the profile), their scales, and their FP8 operands drawn by torch."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from cpemu.splitk import beyond_complete, complete_names

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
    sig["beyond_record"] = sig["split_region"] and beyond_record(profile, scaling, N, K)
    return sig


def beyond_record(profile, scaling: str, N: int, K: int) -> bool:
    """Where (N, K) lies beyond every complete split-K table of the mode: outside the profile's
    recorded domain for shapes that can split (README: N and K up to 65536 there), refused as
    ``outside-domain``. A label for the tallies only."""
    params = (profile.data["modes"][scaling].get("split_k") or {}).get("params") or {}
    return bool(complete_names(params)) and bool(beyond_complete(params, profile.base_dir, N, K))


#: shapes above 16384 in each dimension where nothing can split (M * ceil32(N) > 131070, or K <= 5120):
#: the laws far out, against native outputs (Evo 2 at M = 32768; M, N or K up to 131072)
LARGE_SHAPES = ((32768, 24576, 8192), (32768, 12288, 4096), (32768, 5760, 1920), (131072, 1024, 256),
                (65536, 4096, 1024), (16, 106496, 4096), (64, 65536, 2048), (8, 16384, 65536),
                (256, 4096, 131072), (20000, 20000, 2048), (4096, 53248, 16384))
#: the options each large shape runs with: (scaling, out dtype, fast accumulation, formats)
LARGE_OPTIONS = (("tensorwise", "bfloat16", True, ("e4m3", "e4m3")), ("tensorwise", "float32", False, ("e4m3", "e5m2")),
                 ("rowwise", "bfloat16", True, ("e4m3", "e4m3")))


#: shapes above 131072 in some dimension where nothing can split (the bound u <= 1): the profile's
#: domain.no_split against native outputs (LM heads of 151,936 to 262,144 columns at decode and prefill,
#: Evo 2 shapes at M = 2^18 and 2^20, K = 2^18)
BEYOND_SHAPES = ((1, 151936, 4096), (16, 151936, 3584), (2048, 151936, 3584), (1, 262144, 2560), (8, 256000, 4608),
                 (262144, 4096, 4096), (1048576, 512, 2048), (163840, 5120, 4096), (4096, 4096, 262144))
DESIGNED = {"large": LARGE_SHAPES, "beyond": BEYOND_SHAPES}


def designed_calls(profile, seed: int, suite: str = "large", options=LARGE_OPTIONS):
    """Signatures of every shape x option of a designed suite (``DESIGNED[suite]``; gauss data, scales
    drawn from ``seed``); their source is ``designed-<suite>``."""
    rng = np.random.default_rng(seed)
    i = 0
    source = f"designed-{suite}"
    for M, N, K in DESIGNED[suite]:
        for scaling, out_dtype, fast, (fa, fb) in options:
            if scaling not in profile.data["modes"]:
                continue
            yield {"index": i, "M": M, "N": N, "K": K, "source": source, "a_format": fa, "b_format": fb,
                   "out_dtype": out_dtype, "scaling": scaling, "scales": _scales(rng, scaling), "bias": None,
                   "fast_accum": fast, "data": "gauss", "seed": int(rng.integers(2 ** 63)), "outside": None,
                   "model_like": True, "split_region": split_region(profile, scaling, M, N, K)}
            i += 1


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
