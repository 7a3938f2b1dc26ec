"""How often a cheap bound would decide a Hopper T-FDPA step's e_max (cuda-tiled's pass 1).

cuda-tiled computes, per output and step, e_max = max(e_a + e_b over the step's nonzero
products, exponent of c) (pass 1, about 12 % of its instructions). The accumulator sets e_max
in most steps, so pass 1 could be skipped wherever a bound proves it: the largest exponent
among the step's codes of row i of A (EA) plus that of column j of B (EB) is at least every
product's e_a + e_b, so EA + EB <= exponent of c gives e_max = exponent of c. A GPU can only
skip the work for whole threads (8 x 4 outputs in cuda-tiled) or warps (16 x 64), so the
rates that matter are those of all outputs of a thread or a warp at once.

The second block of rates is the ceiling of any such rule: the pairs where the products'
own largest e_a + e_b (exact, per output) is at most the exponent of c, i.e. where pass 1
changes nothing.

Runs the reference (cpemu.reference.tfdpa) over the full K of a 64 x 256 block of each Evo 2
shape's operands from cpemu.cases (the generator of tools/bench_kernels.py; seed 0 here). Usage:
    python benchmarks/cpu/emax_bound_rates.py > benchmarks/cpu/emax_bound_rates.txt
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from cpemu import reference as ref  # noqa: E402
from cpemu.cases import Case, operands  # noqa: E402
from cpemu.formats import FP8_FORMATS  # noqa: E402
from cpemu.profile import get_profile  # noqa: E402

BM, BN = 64, 256
THREAD = (8, 4)   # cuda-tiled's outputs per thread (rows, columns)
WARP = (16, 64)   # a warp's outputs: 2 x 16 threads


def rates(data: str, N: int, K: int):
    model = get_profile("hopper-h200-torch").instruction
    A, Bt = operands(Case(M=BM, N=N, K=K, data=data, seed=0))[:2]
    fmt = FP8_FORMATS["e4m3"]
    a = ref.decode(np.asarray(A).view(np.uint8)[:BM], fmt)
    b = ref.decode(np.asarray(Bt).view(np.uint8)[:BN], fmt)
    c = np.zeros((BM, BN), np.float32)
    per = {rule: {"output": [], "thread": [], "warp": []} for rule in ("bound", "exact")}
    for k in range(0, K, model.L):
        ks = slice(k, k + model.L)
        ek_a = np.where(a.m[:, ks] != 0, a.e_nz[:, ks], -1000)
        ek_b = np.where(b.m[:, ks] != 0, b.e_nz[:, ks], -1000)
        ea, eb = ek_a.max(axis=1), ek_b.max(axis=1)
        # exponent of c as cuda-tiled takes it (cpt_c_exp: subnormals and zero at -126)
        ce = np.maximum((c.view(np.uint32) >> 23) & 0xFF, 1).astype(np.int32) - 127
        e_prod = (ek_a[:, None, :] + ek_b[None, :, :]).max(axis=2)  # the products' own e_max
        for rule, ok in (("bound", (ea[:, None] + eb[None, :]) <= ce), ("exact", e_prod <= ce)):
            per[rule]["output"].append(ok.mean())
            for name, (r, q) in (("thread", THREAD), ("warp", WARP)):
                per[rule][name].append(ok.reshape(BM // r, r, BN // q, q).all(axis=(1, 3)).mean())
        c = ref.tfdpa(c, a.rows((slice(None), ks)), b.rows((slice(None), ks)), model)
    return {rule: {n: float(np.mean(v)) for n, v in d.items()} for rule, d in per.items()}, K // model.L


def main():
    runs = [(label, shape, *rates(data, N, K)) for data, label in (("gauss40", "gauss40"), ("spread", "adversarial"))
            for shape, (N, K) in (("1B", (5760, 1920)), ("7B", (12288, 4096)))]
    for rule, title in (("bound", "EA + EB <= exponent of c"),
                        ("exact", "the products' own e_max <= exponent of c (the ceiling of any rule)")):
        print(f"fraction of (unit, step) pairs with {title}")
        print("data         shape  steps  outputs  threads (8x4)  warps (16x64)")
        for label, shape, r, steps in runs:
            print(f"{label:12s} {shape:5s}  {steps:5d}  {r[rule]['output']:.3f}    {r[rule]['thread']:.3f}          "
                  f"{r[rule]['warp']:.3f}")


if __name__ == "__main__":
    main()
