"""Record cuBLASLt's split-K choice for torch._scaled_mm over many shapes, compactly.

Uses the query of tools/cublaslt_heuristic.py (descriptors configured exactly as torch
2.11 configures them; its ``torch-log`` mode checks that against torch's own calls)
and stores, per option combination, one character per shape: the split-K count
(``1``-``9``, then letters for 10+), or ``x`` where the heuristic returns no algorithm.

    python tools/splitk_table.py record --grid wide --grid dense-splitk --combos all --out grid.json
    python tools/splitk_table.py record --random 40000 --seed 1 --combos main --out heldout.json
    python tools/splitk_table.py record --evo2 --combos evo2 --out evo2.json
"""

from __future__ import annotations

import tempfile
import time

import click
import numpy as np

from cpemu.recording import cublaslt_heuristic as ch
from cpemu.recording.splitk_query import DIGITS

PAIRS = (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"))
OUTS = ("bfloat16", "float16", "float32")


def combos(name: str) -> list[dict]:
    """Option combinations (everything except the shape) that torch 2.11 accepts."""
    allc = []
    for a, b in PAIRS:
        for out in OUTS:
            for fast in (True, False):
                for bias in ((False,) if out == "float32" else (False, True)):
                    for scale in ("tensorwise", "rowwise"):
                        allc.append(dict(a_dtype=a, b_dtype=b, out_dtype=out, fast_accum=fast, bias=bias,
                                         scale_mode=scale))
    if name == "all":
        return allc
    if name == "main":  # what Transformer Engine and most torch users call
        return [c for c in allc if c["a_dtype"] == c["b_dtype"] == "e4m3" and not c["bias"]
                and c["out_dtype"] in ("bfloat16", "float32")]
    if name == "evo2":
        return [c for c in allc if c["a_dtype"] == c["b_dtype"] == "e4m3" and c["out_dtype"] == "bfloat16"
                and c["scale_mode"] == "tensorwise"]
    raise click.BadParameter(f"unknown combo set {name!r}")


def random_shapes(n: int, seed: int, region: str) -> list[tuple[int, int, int]]:
    """Log-uniform random shapes, M in 1..16384, N and K multiples of 16 in 16..16384."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        M = int(round(2 ** rng.uniform(0, 14)))
        N = 16 * max(1, int(round(2 ** rng.uniform(0, 10))))
        K = 16 * max(1, int(round(2 ** rng.uniform(0, 10))))
        if region == "split":  # where the heuristic may split K
            K = 16 * int(rng.integers(5120 // 16, 16384 // 16 + 1))
            if M >= 4096 or M * N >= 1 << 19:
                continue
        out.append((min(M, 16384), min(N, 16384), min(K, 16384)))
    return out


@click.group()
def cli():
    """Compact split-K tables from cuBLASLt's heuristic."""


@cli.command()
@click.option("--grid", "grids", multiple=True, type=click.Choice(sorted(ch.GRIDS)))
@click.option("--random", "n_random", type=int, default=0)
@click.option("--seed", type=int, default=0)
@click.option("--region", type=click.Choice(["all", "split"]), default="all")
@click.option("--evo2", is_flag=True, help="Every M in 1..16384 for N=24576, K=8192 (Evo 2 40B).")
@click.option("--shape", "extra", multiple=True, help="M,N,K")
@click.option("--combos", "combo_set", default="main", type=click.Choice(["all", "main", "evo2"]))
@click.option("--out", "out_path", required=True)
def record(grids, n_random, seed, region, evo2, extra, combo_set, out_path):
    shapes: list[tuple[int, int, int]] = []
    for g in grids:
        shapes += ch.grid_shapes(g)
    if n_random:
        shapes += random_shapes(n_random, seed, region)
    if evo2:
        shapes += [(m, 24576, 8192) for m in range(1, 16385)]
    for s in extra:
        shapes.append(tuple(int(x) for x in s.split(",")))
    shapes = list(dict.fromkeys(shapes))
    doc = query_table(shapes, combos(combo_set))
    ch._write_json_atomic(out_path, doc)
    click.echo(f"[splitk] wrote {out_path}: {len(shapes)} shapes x {len(doc['combos'])} combos in {doc['seconds']}s",
               err=True)


def query_table(shapes, cs, progress=None) -> dict:
    """Ask the heuristic (top-1, as torch asks) for every shape x option combination."""
    rt = ch.Runtime()
    with tempfile.TemporaryDirectory() as wd:
        ws, ws_source, _ = ch.resolve_workspace("auto", rt.info, wd, None, 300.0)
    rt.open_handle()
    ptrs = rt.pointers(max(16384, max(s[0] for s in shapes)), max(24576, max(s[1] for s in shapes)))
    t0 = time.time()
    table, schemes = [], set()
    total = len(cs) * len(shapes)
    for ci, c in enumerate(cs):
        chars = []
        for (M, N, K) in shapes:
            row = ch.query_case(rt.lt, rt.handle, ch.Case(M, N, K, **c), ptrs, ws, 1)
            if row["status"] != "OK":
                chars.append("x")
                continue
            s = int(row["splitk_num"])
            if s > 1:
                schemes.add(int(row["reduction_scheme"]))
            chars.append(DIGITS[s])
        table.append("".join(chars))
        done = (ci + 1) * len(shapes)
        if progress:
            progress(done, total)
        else:
            click.echo(f"[splitk] {done}/{total} {time.time() - t0:.0f}s", err=True)
    rt.close()
    return {"tool": "cpemu.recording.splitk_table", "query": "cpemu.recording.cublaslt_heuristic.query_case "
                                                            "(torch 2.11 configuration)",
            "runtime": {k: rt.info.get(k) for k in ("cublaslt_version", "library_path", "torch_version",
                                                     "device_name", "sm_count", "compute_capability")},
            "workspace_bytes": ws, "workspace_source": ws_source, "reduction_schemes_when_split": sorted(schemes),
            "combos": cs, "shapes": shapes, "splits": table, "seconds": round(time.time() - t0, 1)}

if __name__ == "__main__":
    cli()
