"""Designed GEMM cases: deterministic operands from seeds, for truth recordings and tests.

A :class:`Case` names everything ``torch._scaled_mm`` is called with; :func:`operands`
regenerates its inputs bit for bit from the seed (numpy PCG64), and truth manifests
store the sha256 of the regenerated inputs so that a change of generator is caught
before any output is compared.

Data kinds (``Case.data``):

* ``uniform``   -- uniformly random finite codes (every exponent equally likely);
* ``gaussS``    -- N(0, S**2) rounded to the format (RNE), clipped to its largest finite
                   value; S is 1 or 40 (N(0, 1600), Transformer-Engine-like activations)
                   or ``gauss-tiny`` (S = 2**-7: subnormal-heavy);
* ``sparse``    -- 90 % zeros, the rest uniform codes;
* ``loguniform``-- magnitudes 2**U over the whole range of the format, random signs;
* ``cancel``    -- K-pairs whose products cancel exactly except for a few perturbed
                   terms: sums near zero, heavy truncation;
* ``spread``    -- adversarial for truncation: one large element per 32-block, the rest
                   small, so most products lose bits below e_max;
* ``nan``       -- uniform codes with a few NaN codes (and Inf for e5m2).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import ml_dtypes
import numpy as np

from .formats import FP8_FORMATS

__all__ = ["Case", "operands", "DATA_KINDS", "sha256_arrays", "suite", "SUITES", "EVO2_SHAPES"]

DATA_KINDS = ("uniform", "gauss1", "gauss40", "gauss-tiny", "sparse", "loguniform", "cancel", "spread", "nan")


@dataclass(frozen=True)
class Case:
    """One call of torch._scaled_mm: shapes, formats, data, options, seed."""

    M: int
    N: int
    K: int
    data: str = "uniform"
    seed: int = 0
    a_format: str = "e4m3"
    b_format: str = "e4m3"
    fast_accum: bool = True
    out_dtype: str = "bfloat16"
    scale: str = "unit"  # "unit", "tensor" (random FP32 scalars) or "rowwise" ((M,1), (1,N))
    bias: bool = False
    tags: tuple = field(default=(), compare=False)

    @property
    def id(self) -> str:
        return (f"{self.M}x{self.N}x{self.K}-{self.a_format}{self.b_format}-{self.data}-s{self.seed}"
                f"-{'fast' if self.fast_accum else 'promo'}-{self.out_dtype}-{self.scale}"
                f"{'-bias' if self.bias else ''}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["tags"] = list(self.tags)
        d["id"] = self.id
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Case":
        kw = {k: d[k] for k in ("M", "N", "K", "data", "seed", "a_format", "b_format",
                                "fast_accum", "out_dtype", "scale", "bias")}
        return cls(**kw, tags=tuple(d.get("tags", ())))


def _rng(case: Case, salt: str) -> np.random.Generator:
    # The seed sequence is derived from the case's inputs (not its options), so cases
    # that differ only in fast_accum / out_dtype share operands.
    key = f"{case.M}x{case.N}x{case.K}:{case.a_format}{case.b_format}:{case.data}:{case.seed}:{salt}"
    digest = hashlib.sha256(key.encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def _finite_codes(fmt_name: str) -> np.ndarray:
    sign, m, e, nan, inf = FP8_FORMATS[fmt_name].tables()
    return np.nonzero(~nan & ~inf)[0].astype(np.uint8)


def _to_codes(x: np.ndarray, fmt_name: str) -> np.ndarray:
    fmt = FP8_FORMATS[fmt_name]
    lim = float(ml_dtypes.finfo(fmt.np_dtype).max)
    return np.clip(x, -lim, lim).astype(np.float32).astype(fmt.np_dtype).view(np.uint8)


def _codes(rng: np.random.Generator, shape, kind: str, fmt_name: str) -> np.ndarray:
    fmt = FP8_FORMATS[fmt_name]
    finite = _finite_codes(fmt_name)
    if kind == "uniform":
        return rng.choice(finite, size=shape)
    if kind.startswith("gauss"):
        sigma = {"gauss1": 1.0, "gauss40": 40.0, "gauss-tiny": 2.0 ** -7}[kind]
        return _to_codes(rng.standard_normal(shape) * sigma, fmt_name)
    if kind == "sparse":
        c = rng.choice(finite, size=shape)
        return np.where(rng.random(shape) < 0.9, np.uint8(0), c).astype(np.uint8)
    if kind == "loguniform":
        lo = fmt.emin - fmt.frac_bits
        hi = float(np.log2(float(ml_dtypes.finfo(fmt.np_dtype).max)))
        mag = np.exp2(rng.uniform(lo, hi, size=shape))
        return _to_codes(np.where(rng.random(shape) < 0.5, -mag, mag), fmt_name)
    if kind == "spread":
        small = rng.standard_normal(shape) * 2.0 ** -3
        big = rng.choice([-1.0, 1.0], size=shape) * rng.uniform(64, 448 if fmt_name == "e4m3" else 4096, size=shape)
        pick = (np.arange(shape[-1]) % 32 == rng.integers(0, 32))[None, :] if len(shape) == 2 else False
        return _to_codes(np.where(pick, big, small), fmt_name)
    if kind == "nan":
        c = rng.choice(finite, size=shape)
        specials = [0x7F, 0xFF] if fmt_name == "e4m3" else [0x7E, 0xFE, 0x7C, 0xFC]
        hit = rng.random(shape) < 0.002
        return np.where(hit, rng.choice(np.array(specials, dtype=np.uint8), size=shape), c).astype(np.uint8)
    raise ValueError(f"unknown data kind {kind!r}; expected one of {DATA_KINDS}")


#: Kinds drawn with one random number per element, in order: their rows can be drawn a block at
#: a time with the same bits (numpy's Generator continues its stream across calls).
_ROWWISE_KINDS = ("uniform", "gauss1", "gauss40", "gauss-tiny")
#: Elements drawn at once for a large operand of those kinds (bounds the float64 temporaries).
GEN_CHUNK = 1 << 22


def _codes_in_rows(rng: np.random.Generator, shape, kind: str, fmt_name: str) -> np.ndarray:
    """:func:`_codes`, drawn GEN_CHUNK elements at a time where the kind allows it (same bits)."""
    rows, K = shape
    if kind not in _ROWWISE_KINDS or rows * K <= GEN_CHUNK:
        return _codes(rng, shape, kind, fmt_name)
    out = np.empty(shape, dtype=np.uint8)
    step = max(1, GEN_CHUNK // max(1, K))
    for i in range(0, rows, step):
        out[i:i + step] = _codes(rng, (min(step, rows - i), K), kind, fmt_name)
    return out


def operands(case: Case):
    """Regenerate the inputs of ``case``.

    Returns ``(a, bt, scale_a, scale_b, bias)``: ``a`` (M, K) and ``bt`` (N, K) uint8
    codes (``bt`` is B transposed: torch's column-major operand), ``scale_a``/``scale_b``
    float32 arrays of shape () or (M, 1) / (1, N), ``bias`` None or (N,) uint16 bf16 bits
    (float16 bits when ``out_dtype`` is float16).
    """
    M, N, K = case.M, case.N, case.K
    if case.data == "cancel":
        a = _codes(_rng(case, "a"), (M, K), "gauss40", case.a_format)
        bt = _codes(_rng(case, "b"), (N, K), "gauss40", case.b_format)
        a[:, 1::2] = a[:, 0::2]
        neg = bt[:, 0::2] ^ np.uint8(0x80)
        bt[:, 1::2] = neg
        r = _rng(case, "perturb")
        pa = r.random((M, K)) < 0.03
        a = np.where(pa, _codes(r, (M, K), "gauss1", case.a_format), a).astype(np.uint8)
    else:
        a = _codes_in_rows(_rng(case, "a"), (M, K), case.data, case.a_format)
        bt = _codes_in_rows(_rng(case, "b"), (N, K), case.data, case.b_format)
    rs = _rng(case, "scale")
    if case.scale == "unit":
        sa = np.array(1.0, np.float32)
        sb = np.array(1.0, np.float32)
    elif case.scale == "tensor":
        sa = np.exp2(rs.uniform(-8, 4)).astype(np.float32)
        sb = np.exp2(rs.uniform(-8, 4)).astype(np.float32)
        sa, sb = np.array(sa, np.float32), np.array(sb, np.float32)
    elif case.scale == "rowwise":
        sa = np.exp2(rs.uniform(-8, 4, size=(M, 1))).astype(np.float32)
        sb = np.exp2(rs.uniform(-8, 4, size=(1, N))).astype(np.float32)
    else:
        raise ValueError(f"unknown scale kind {case.scale!r}")
    bias = None
    if case.bias:
        vals = _rng(case, "bias").standard_normal(N) * 4.0
        dt = np.float16 if case.out_dtype == "float16" else ml_dtypes.bfloat16
        bias = vals.astype(np.float32).astype(dt).view(np.uint16)
    return a, bt, sa, sb, bias


def sha256_arrays(*arrays) -> str:
    """sha256 over the raw bytes (C order) of arrays, None skipped, with shapes and dtypes."""
    h = hashlib.sha256()
    for x in arrays:
        if x is None:
            h.update(b"none")
            continue
        x = np.ascontiguousarray(x)
        h.update(json.dumps([list(x.shape), x.dtype.str]).encode())
        h.update(x.tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- suites

EVO2_SHAPES = {"evo2-1b": (5760, 1920), "evo2-7b": (12288, 4096), "evo2-40b": (24576, 8192)}

#: Shapes around cuBLASLt's split-K region (small M*N, long K), fp32 output.
SPLITK_PROBE_SHAPES = [(M, N, K) for M in (1, 16, 64) for N in (16, 64, 256)
                       for K in (2048, 4096, 8192, 16384)] + [(32, 512, 8192), (16, 64, 16384), (128, 128, 16384)]


def suite(name: str) -> list[Case]:
    """The designed case sets recorded on a GPU (see tests/data/*/manifest.json)."""
    cases: list[Case] = []
    add = cases.append
    if name == "core":
        small = [(16, 16, 32), (1, 16, 16), (3, 16, 48), (17, 32, 80), (64, 64, 256), (100, 80, 1008),
                 (128, 128, 1024), (256, 192, 1920)]
        for i, (M, N, K) in enumerate(small):
            for data in (DATA_KINDS if M * N * K <= 2 ** 21 else ("uniform", "gauss40", "spread")):
                for fast in (True, False):
                    add(Case(M, N, K, data=data, seed=i, fast_accum=fast, out_dtype="float32", tags=("chain",)))
                    add(Case(M, N, K, data=data, seed=i, fast_accum=fast, out_dtype="bfloat16", tags=("chain",)))
            add(Case(M, N, K, data="gauss40", seed=i, out_dtype="float16", tags=("out-fp16",)))
            add(Case(M, N, K, data="loguniform", seed=i, out_dtype="float16", tags=("out-fp16",)))
    elif name == "epilogue":
        for i, (M, N, K) in enumerate([(64, 64, 256), (32, 128, 512), (48, 96, 1024)]):
            for out in ("float32", "bfloat16", "float16"):
                for fast in (True, False):
                    for data in ("gauss40", "loguniform"):
                        add(Case(M, N, K, data=data, seed=10 + i, fast_accum=fast, out_dtype=out,
                                 scale="tensor", tags=("scale",)))
                        add(Case(M, N, K, data=data, seed=10 + i, fast_accum=fast, out_dtype=out,
                                 bias=True, tags=("bias",)))
                        add(Case(M, N, K, data=data, seed=10 + i, fast_accum=fast, out_dtype=out,
                                 scale="tensor", bias=True, tags=("scale", "bias")))
                        add(Case(M, N, K, data=data, seed=10 + i, fast_accum=fast, out_dtype=out,
                                 scale="rowwise", tags=("rowwise",)))
                        add(Case(M, N, K, data=data, seed=10 + i, fast_accum=fast, out_dtype=out,
                                 scale="rowwise", bias=True, tags=("rowwise", "bias")))
    elif name == "formats":
        for i, (M, N, K) in enumerate([(16, 16, 32), (64, 64, 256), (128, 64, 1024)]):
            for af, bf in (("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")):
                for data in ("uniform", "gauss40", "loguniform", "nan"):
                    for fast in (True, False):
                        add(Case(M, N, K, data=data, seed=20 + i, a_format=af, b_format=bf, fast_accum=fast,
                                 out_dtype="float32", tags=("e5m2",)))
                add(Case(M, N, K, data="gauss1", seed=20 + i, a_format=af, b_format=bf, out_dtype="bfloat16",
                         scale="tensor", tags=("e5m2", "scale")))
    elif name == "splitk":
        for i, (M, N, K) in enumerate(SPLITK_PROBE_SHAPES):
            for fast in (True, False):
                add(Case(M, N, K, data="uniform", seed=30 + i, fast_accum=fast, out_dtype="float32",
                         tags=("splitk-probe",)))
            add(Case(M, N, K, data="gauss40", seed=30 + i, out_dtype="bfloat16", scale="tensor",
                     tags=("splitk-probe", "scale")))
            add(Case(M, N, K, data="gauss40", seed=30 + i, out_dtype="bfloat16", bias=True,
                     tags=("splitk-probe", "bias")))
    elif name == "splitk2":
        # Held back from the derivation of the split-K rule: uneven slice counts (4, 5),
        # large M, and K not a multiple of the 128-element K tile.
        shapes = [(48, 512, 16384), (48, 1024, 16384), (48, 1920, 16384), (1536, 16, 16384), (3072, 16, 8192),
                  (1, 12288, 16384), (1, 1920, 16384), (16, 4096, 16384), (1, 16, 14336), (80, 768, 16384),
                  (16, 64, 8208), (1, 256, 12304), (64, 64, 10256), (7, 48, 14352)]
        for i, (M, N, K) in enumerate(shapes):
            for fast in (True, False):
                add(Case(M, N, K, data="uniform", seed=70 + i, fast_accum=fast, out_dtype="float32",
                         tags=("splitk-heldout",)))
            add(Case(M, N, K, data="gauss40", seed=70 + i, out_dtype="bfloat16", scale="tensor",
                     tags=("splitk-heldout", "scale")))
            add(Case(M, N, K, data="loguniform", seed=70 + i, out_dtype="float32", scale="tensor",
                     tags=("splitk-heldout", "scale")))
    elif name == "evo2":
        for j, (tag, (N, K)) in enumerate(EVO2_SHAPES.items()):
            add(Case(16, N, K, data="gauss40", seed=40 + j, out_dtype="bfloat16", scale="tensor",
                     tags=("evo2", tag)))
            add(Case(1, N, K, data="spread", seed=40 + j, out_dtype="bfloat16", tags=("evo2", tag)))
    else:
        raise ValueError(f"unknown suite {name!r}; expected one of {SUITES}")
    return cases


SUITES = ("core", "epilogue", "formats", "splitk", "splitk2", "evo2")
