"""torch._scaled_mm against cpemu's reference on shapes the complete split-K table answers.

On a GPU host with torch: random finite e4m3 operands, unit scales; torch's output bytes are
compared with cpemu.gemm(backend="reference") computed on the CPU (one process per core).

    python tools/splitk_output_check.py --n 24 --out check.json
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import time

import click
import numpy as np

OUTS = ("float32", "bfloat16")


def _codes(rng, shape):
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = 0  # no NaN codes
    return c


def _cpemu(job):
    import ml_dtypes

    import cpemu

    (M, N, K), seed, fast, out = job
    rng = np.random.default_rng(seed)
    a, bt = _codes(rng, (M, K)).view(ml_dtypes.float8_e4m3fn), _codes(rng, (N, K)).view(ml_dtypes.float8_e4m3fn)
    y = cpemu.gemm(a, bt.T, out_dtype=out, fast_accum=fast, backend="reference")
    splits = cpemu.get_profile().plan(M, N, K, fast, out_dtype=out).splits
    return hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest(), splits


def _torch(job):
    import torch

    (M, N, K), seed, fast, out = job
    rng = np.random.default_rng(seed)
    a = torch.from_numpy(_codes(rng, (M, K))).cuda().view(torch.float8_e4m3fn)
    bt = torch.from_numpy(_codes(rng, (N, K))).cuda().view(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    y = torch._scaled_mm(a, bt.t(), scale_a=one, scale_b=one, out_dtype=getattr(torch, out), use_fast_accum=fast)
    y = y.cpu().contiguous()
    return hashlib.sha256(y.view(torch.int16 if y.element_size() == 2 else torch.int32).numpy().tobytes()).hexdigest()


def shapes(n: int, seed: int) -> list[tuple[int, int, int]]:
    """M = 1 shapes of the complete table: N up to 4608, K 5136..65536, N*K <= 2^25; the issue's examples."""
    rng = np.random.default_rng(seed)
    out = [(1, 4096, 14336), (1, 1536, 7168), (1, 16, 65536), (1, 256, 65536)]
    while len(out) < n:
        N, K = 16 * int(rng.integers(1, 289)), 16 * int(rng.integers(321, 4097))
        if N * K <= 1 << 25:
            out.append((1, N, K))
    return out


@click.command()
@click.option("--n", type=int, default=24)
@click.option("--seed", type=int, default=7)
@click.option("--jobs", type=int, default=16)
@click.option("--out", "out_path", required=True)
def main(n, seed, jobs, out_path):
    import torch

    jobs_ = [(s, seed + i, fast, out) for i, s in enumerate(shapes(n, seed)) for fast in (True, False) for out in OUTS]
    t0 = time.time()
    with mp.get_context("spawn").Pool(jobs) as pool:
        emu = pool.map(_cpemu, jobs_)
    native = [_torch(j) for j in jobs_]
    rows = [{"M": j[0][0], "N": j[0][1], "K": j[0][2], "fast_accum": j[2], "out_dtype": j[3], "splits": e[1],
             "match": e[0] == t, "sha256": t} for j, e, t in zip(jobs_, emu, native)]
    doc = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "seed": seed,
           "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0, 1),
           "matched": sum(r["match"] for r in rows), "calls": len(rows), "rows": rows}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    click.echo(f"{doc['matched']}/{doc['calls']} bit-exact; splits {sorted({r['splits'] for r in rows})}")


if __name__ == "__main__":
    main()
