"""Shapes and option combinations to ask cuBLASLt's heuristic about.

The built-in grids, shapes from a JSON file or the command line, and the cases
(:class:`cpemu.cuda.cublaslt.Case`) made from them with the options torch accepts.
"""
from __future__ import annotations

import json
import re

import click

from cpemu.cuda.cublaslt import Case

OUT_DTYPE_ALIASES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
                     "half": "float16", "float16": "float16", "fp32": "float32",
                     "float": "float32", "float32": "float32"}
IN_DTYPE_PAIRS = ("e4m3,e4m3", "e4m3,e5m2", "e5m2,e4m3")
SCALE_MODES = ("tensorwise", "rowwise")

# ---------------------------------------------------------------------------
# Built-in grids
# ---------------------------------------------------------------------------
_WIDE_M = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
           2048, 3072, 4096, 6144, 8192, 12288, 16384]
_WIDE_NK = [16, 32, 64, 128, 256, 512, 1024, 1920, 2048, 4096, 5760, 8192, 12288, 16384]
_DENSE_M = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 320, 384, 512]
_DENSE_N = [16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
_DENSE_K = [512, 1024, 1536, 1920, 2048, 2560, 3072, 4096, 5120, 5760, 6144, 8192, 10240,
            12288, 14336, 16384]
EVO2_NK = [(5760, 1920), (12288, 4096)]  # (N, K) of the Evo 2 projections in scope
_SMOKE = [(m, n, k) for m in (1, 16, 128, 1024, 8192) for n, k in EVO2_NK] + [
    (16, 16, 32), (64, 256, 16384), (32, 128, 8192), (4096, 4096, 4096)]

GRIDS = {
    "smoke": "Evo 2 (N,K) pairs at five M plus four probes (14 shapes).",
    "wide": "M in 24 values 1..16384, N and K in 14 values 16..16384 incl. 1920/5760/12288.",
    "dense-splitk": "small M (1..512) x small N (16..2048) x large K (512..16384).",
}


def grid_shapes(name: str) -> list[tuple[int, int, int]]:
    """Shapes (M, N, K) of a built-in grid, in a stable order."""
    if name == "smoke":
        return list(_SMOKE)
    if name == "wide":
        return [(m, n, k) for m in _WIDE_M for n in _WIDE_NK for k in _WIDE_NK]
    if name == "dense-splitk":
        return [(m, n, k) for m in _DENSE_M for n in _DENSE_N for k in _DENSE_K]
    raise click.BadParameter(f"unknown grid {name!r}; known: {', '.join(GRIDS)}")


def load_shapes_file(path: str) -> list[tuple[int, int, int]]:
    """A JSON list of [M, N, K] triples or of {"M":..,"N":..,"K":..} objects."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict) and "shapes" in data:
        data = data["shapes"]
    out = []
    for item in data:
        if isinstance(item, dict):
            m, n, k = item["M"], item["N"], item["K"]
        else:
            m, n, k = item
        m, n, k = int(m), int(n), int(k)
        if min(m, n, k) <= 0:
            raise click.BadParameter(f"non-positive shape {item!r} in {path}")
        out.append((m, n, k))
    return out


# ---------------------------------------------------------------------------
# Cases from shapes and options
# ---------------------------------------------------------------------------
def build_cases(shapes, in_dtypes, out_dtypes, fast_accum, bias, scale_modes,
                include_invalid: bool) -> tuple[list[Case], int]:
    """Every shape x option combination; returns (cases, how many torch would reject and were skipped)."""
    fa = [False, True] if fast_accum is None else [bool(fast_accum)]
    bs = {"none": [False], "present": [True], "both": [False, True]}[bias]
    outs = list(dict.fromkeys(OUT_DTYPE_ALIASES[o.lower()] for o in out_dtypes))
    scale_modes = list(dict.fromkeys(scale_modes))
    in_dtypes = list(dict.fromkeys(in_dtypes))
    cases, skipped = [], 0
    for (m, n, k) in shapes:
        for pair in in_dtypes:
            a_t, b_t = pair.split(",")
            for o in outs:
                for f in fa:
                    for bb in bs:
                        for sm in scale_modes:
                            c = Case(m, n, k, a_t, b_t, o, f, bb, sm)
                            if c.torch_rejects() and not include_invalid:
                                skipped += 1
                                continue
                            cases.append(c)
    return cases, skipped


def gather_shapes(shapes_file, grid, shape_opts) -> list[tuple[int, int, int]]:
    """Shapes from --shapes-file, --grid and --shape, in that order, without repeats."""
    shapes: list[tuple[int, int, int]] = []
    if shapes_file:
        shapes += load_shapes_file(shapes_file)
    if grid:
        shapes += grid_shapes(grid)
    for s in shape_opts or ():
        parts = [int(x) for x in re.split(r"[,x ]+", s.strip()) if x]
        if len(parts) != 3:
            raise click.BadParameter(f"--shape wants M,N,K; got {s!r}")
        shapes.append(tuple(parts))
    if not shapes:
        raise click.UsageError("give --shapes-file, --grid or --shape")
    seen, out = set(), []
    for s in shapes:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out
