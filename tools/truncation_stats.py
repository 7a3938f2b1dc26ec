"""How often a T-FDPA step truncates its products, on benchmark data (CPU, numpy).

    python tools/truncation_stats.py [--shape evo2-1b --shape evo2-40b] [--M 16] [--N 256] \\
        [--data gauss40,adversarial] [--profile hopper-h200-torch,ada-rtx4060-torch] \\
        [--out benchmarks/truncation_stats.json]

For ``M`` rows and ``N`` columns of the shape's GEMM (operands from :func:`cpemu.cases.operands`,
e4m3, the full K of the shape, one fast-accumulation chain per output, as the profile's
instruction model computes it) every (output, step, product) is classified by what the step
does to it (cpemu.reference.tfdpa): a product ``P * 2**(E - fa - fb)`` keeps ``F`` fraction
bits below ``2**e_max``, so it drops ``e_max - E - (F - fa - fb)`` low bits when that is
positive:

* ``kept``: a nonzero product that loses no bit (all its bits lie on the step's grid);
* ``lost_bits``: a nonzero product with nonzero dropped bits: its contribution
  ``floor(P / 2**s)`` is not the exact product, so an exact emulator must compute it product
  by product (an integer MMA sums exact products only);
* ``to_zero``: the subset of ``lost_bits`` truncated to 0 entirely;
* ``zero``: a zero product.

Per (output, step) it also counts ``c_sets_emax``: the accumulator's exponent is at least
every product's, so the grid of that step is set by ``c``, which depends on every step before;
``bound_decides``: the row's and the column's largest exponents already bound every product by
``c``'s (the step's e_max is then known without pass 1); ``c_keeps_binade``: ``c`` and the step's
result are nonzero with the same sign and exponent; ``steady``: both that and ``c_sets_emax``, the
steps after which a biased accumulator (cuda-rzacc's) would need no rounding and no new base.
``thread_tiles_steady`` is the share of (8 x 4 outputs, step) tiles, one thread's outputs in
cuda-rzacc's large geometry, in which every output is steady (where M and N allow such tiles).
Writes JSON (the counts and fractions per profile and data kind, the options, the versions).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import sys

import click
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cpemu import reference as ref  # noqa: E402
from cpemu.cases import EVO2_SHAPES, Case, operands  # noqa: E402
from cpemu.formats import FP8_FORMATS  # noqa: E402
from cpemu.profile import get_profile  # noqa: E402

DATA_ALIASES = {"adversarial": "spread"}
#: one thread's outputs in cuda-rzacc's large geometry (rows, columns)
TILE = (8, 4)


def chain_stats(a_codes, bt_codes, model) -> dict:
    """Counts over one fast-accumulation chain per output (reference.chain, step by step)."""
    fmt = FP8_FORMATS["e4m3"]
    A, B = ref.decode(a_codes, fmt), ref.decode(bt_codes, fmt)
    M, K = a_codes.shape
    N = bt_codes.shape[0]
    S0 = model.F - 2 * fmt.frac_bits
    counts = dict(products=0, zero=0, kept=0, lost_bits=0, to_zero=0, steps=0, c_sets_emax=0, bound_decides=0,
                  c_keeps_binade=0, steady=0, thread_tiles=0, thread_tiles_steady=0)
    tiled = M % TILE[0] == 0 and N % TILE[1] == 0
    c = np.zeros((M, N), dtype=np.float32)
    for k in range(0, K, model.L):
        ks = slice(k, min(k + model.L, K))
        a, b = A.rows((slice(None), ks)), B.rows((slice(None), ks))
        P = a.m[:, None, :].astype(np.int64) * b.m[None, :, :]
        E = a.e_nz[:, None, :].astype(np.int64) + b.e_nz[None, :, :]
        _, cm, ce = ref._split_fp32(c, model.e_zero)
        pmax = np.where(P > 0, E, -10**6).max(axis=-1)
        e_max = np.maximum(pmax, ce)
        drop = e_max[..., None] - E - S0  # low bits of P dropped (<= 0: none)
        nz = P > 0
        lost = nz & (drop > 0) & ((P & ((1 << np.clip(drop, 0, 62)) - 1)) != 0)
        counts["products"] += P.size
        counts["zero"] += int((~nz).sum())
        counts["kept"] += int((nz & ~lost).sum())
        counts["lost_bits"] += int(lost.sum())
        counts["to_zero"] += int((nz & (drop > 0) & ((P >> np.clip(drop, 0, 62)) == 0)).sum())
        counts["steps"] += M * N
        sets = (cm > 0) & (ce >= pmax)
        counts["c_sets_emax"] += int(sets.sum())
        ea = np.where(a.m > 0, a.e_nz, -10**6).max(axis=-1).astype(np.int64)
        eb = np.where(b.m > 0, b.e_nz, -10**6).max(axis=-1).astype(np.int64)
        counts["bound_decides"] += int(((cm > 0) & (ea[:, None] + eb[None, :] <= ce)).sum())
        cs, _, _ = ref._split_fp32(c, model.e_zero)
        c = ref.tfdpa(c, a, b, model)
        cs2, cm2, ce2 = ref._split_fp32(c, model.e_zero)
        keeps = (cm > 0) & (cm2 > 0) & (ce2 == ce) & (cs2 == cs)
        steady = sets & keeps
        counts["c_keeps_binade"] += int(keeps.sum())
        counts["steady"] += int(steady.sum())
        if tiled:
            t = steady.reshape(M // TILE[0], TILE[0], N // TILE[1], TILE[1]).all(axis=(1, 3))
            counts["thread_tiles"] += t.size
            counts["thread_tiles_steady"] += int(t.sum())
    n = counts["products"]
    return {**counts, "fractions": {"zero": counts["zero"] / n, "kept": counts["kept"] / n,
                                    "lost_bits": counts["lost_bits"] / n, "to_zero": counts["to_zero"] / n,
                                    "lost_bits_of_nonzero": counts["lost_bits"] / max(1, n - counts["zero"]),
                                    "c_sets_emax_of_steps": counts["c_sets_emax"] / counts["steps"],
                                    "bound_decides_of_steps": counts["bound_decides"] / counts["steps"],
                                    "c_keeps_binade_of_steps": counts["c_keeps_binade"] / counts["steps"],
                                    "steady_of_steps": counts["steady"] / counts["steps"],
                                    "thread_tiles_steady": counts["thread_tiles_steady"] / max(1, counts["thread_tiles"])}}


@click.command()
@click.option("--shape", "shapes", multiple=True, default=("evo2-1b", "evo2-7b", "evo2-40b"), show_default=True,
              help="evo2-1b / evo2-7b / evo2-40b or NxK (repeatable)")
@click.option("--M", "M", default=16, show_default=True, type=int, help="rows (tokens) sampled")
@click.option("--N", "N", default=256, show_default=True, type=int, help="columns sampled")
@click.option("--data", "data_text", default="gauss40,adversarial", show_default=True)
@click.option("--profile", "profiles", default="hopper-h200-torch,ada-rtx4060-torch", show_default=True)
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--out", "out_path", default="truncation_stats.json", show_default=True)
def main(shapes, M, N, data_text, profiles, seed, out_path):
    """Classify every product of sampled Evo 2 outputs by what its T-FDPA step does to it."""
    out = {"tool": "tools/truncation_stats.py", "started_utc": datetime.datetime.now(datetime.timezone.utc)
           .isoformat(timespec="seconds"), "options": {"shapes": list(shapes), "M": M, "N": N, "data": data_text,
                                                       "profiles": profiles, "seed": seed},
           "host": {"platform": platform.platform(), "python": platform.python_version()},
           "packages": {p: importlib.metadata.version(p) for p in ("numpy", "ml_dtypes")}, "results": []}
    for shape in shapes:
        if shape in EVO2_SHAPES:
            _, K = EVO2_SHAPES[shape]
        else:
            try:
                _, K = (int(x) for x in shape.lower().split("x"))
            except ValueError:
                raise click.BadParameter(f"{shape!r}: expected evo2-1b/evo2-7b/evo2-40b or NxK",
                                         param_hint="--shape") from None
        for data in data_text.split(","):
            a, bt, *_ = operands(Case(M, N, K, data=DATA_ALIASES.get(data, data), seed=seed))
            for pname in profiles.split(","):
                model = get_profile(pname).instruction
                r = chain_stats(a, bt, model)
                out["results"].append({"shape": shape, "K": K, "data": data, "profile": pname,
                                       "instruction": model.name, **r})
                f = r["fractions"]
                click.echo(f"{shape:9s} {pname:22s} {data:12s} lost bits {f['lost_bits']:.3f} of products "
                           f"({f['lost_bits_of_nonzero']:.3f} of nonzero), to zero {f['to_zero']:.3f}, "
                           f"kept {f['kept']:.3f}, zero {f['zero']:.3f}; "
                           f"c sets e_max in {f['c_sets_emax_of_steps']:.3f} of steps, the bound decides it in "
                           f"{f['bound_decides_of_steps']:.3f}, c keeps its binade in {f['c_keeps_binade_of_steps']:.3f}, "
                           f"both in {f['steady_of_steps']:.3f}; every output of an 8 x 4 tile steady in "
                           f"{f['thread_tiles_steady']:.3f}")
    with open(out_path, "w") as fh:
        json.dump(out, fh, indent=1)
    click.echo(f"wrote {out_path}")


if __name__ == "__main__":
    main()
