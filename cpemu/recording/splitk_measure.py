"""Dense samples of cuBLASLt's heuristic for the split-K laws and the table's granularity.

Sample sets (each asked for every option combination of ``--combos``):

* ``gran``: random (M, N) pairs of the split region, every K in steps of 16 from 2576 to
  16384: on which K steps, and for which options, the answer changes;
* ``large``: random shapes with M, N and K up to 2^17 and model shapes: the laws far out;
* ``deepk``: small M*N with K up to 2^18: whether the split count saturates;
* ``beyond``: shapes with M, N or K above the profiles' domain (2^17) and up to 2^20: LM heads
  (N = 151,936 to 262,144), long contexts (M up to 2^20) and deep K; the evidence a profile needs
  before it answers there (``domain.no_split``: the shapes where nothing can split).
* ``rowbias``: outer-vector (rowwise) scales with fast accumulation, with and without bias, on random
  (M, N) pairs of the split region at every K from 5136 to 65536 in steps of 16: where cuBLASLt has an
  algorithm with bias (torch raises where it has none), how that changes along K, M and N, and the
  ``custom_option`` of the answers without bias that tells it (``tests/test_no_algorithm.py``).

    python -m cpemu.recording.splitk_measure --sets gran,large,deepk --jobs 16 --out DIR

writes ``DIR/<set>.npz``: ``shapes`` (S, 3), ``ids`` (S, C) into ``configs`` (D, len(FIELDS))
(-1: no algorithm), ``combos`` and provenance as JSON text.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import click
import numpy as np

from .splitk_query import FIELDS, Querier, probe_workspace
from .splitk_table import combos as combo_set

_Q = None


def _init(ws, max_mn=1 << 17):
    global _Q
    _Q = Querier(ws, max_m=max_mn, max_n=max_mn)


def _work(task):
    shapes, cs = task
    out = np.full((len(shapes), len(cs), len(FIELDS)), -1, np.int64)
    for i, (M, N, K) in enumerate(shapes):
        for j, c in enumerate(cs):
            a = _Q.ask(int(M), int(N), int(K), c)
            if a is not None:
                out[i, j] = a
    return out, _Q.info()


def _ceil32(n):
    return -(-n // 32) * 32


def gran_shapes(rng, pairs=120):
    out = []
    while len(out) < pairs:
        M = int(round(2 ** rng.uniform(0, 11)))
        N = 16 * max(1, int(round(2 ** rng.uniform(0, 11))))
        if 4 * M * _ceil32(N) * 2 <= (1 << 20) - 16:
            out.append((M, N))
    return [(M, N, K) for M, N in out for K in range(2576, 16385, 16)]


def _log16(rng, hi_log2):
    return 16 * max(1, int(round(2 ** rng.uniform(0, hi_log2 - 4))))


MODEL_NK = [(106496, 53248), (53248, 106496), (24576, 8192), (8192, 24576), (28672, 8192), (8192, 28672),
            (57344, 8192), (16384, 53248), (65536, 65536), (131072, 16), (16, 131072)]


def large_shapes(rng, n=6000):
    out = []
    for _ in range(n):
        out.append((max(1, int(round(2 ** rng.uniform(0, 17)))), _log16(rng, 17), _log16(rng, 17)))
    for _ in range(n):  # the split region far out: K large, M * ceil32(N) small enough to split
        while True:
            M, N, K = max(1, int(round(2 ** rng.uniform(0, 12)))), _log16(rng, 17), 16 * int(rng.integers(320, 8193))
            if 8 * M * _ceil32(N) <= (1 << 20) - 16:
                break
        out.append((M, N, K))
    for N, K in MODEL_NK:
        for M in (1, 16, 256, 4096, 32768, 65536, 131072):
            out.append((M, N, K))
    return out


def deepk_shapes():
    return [(M, N, K) for M in (1, 2, 4, 8, 16, 32, 64) for N in (16, 32, 64, 128, 256, 512)
            for K in list(range(16384, 131073, 4096)) + [196608, 262144]]


#: the largest M, N and K of the ``beyond`` set
BEYOND_MAX = 1 << 20
#: where the profiles' recorded domain ends today
DOMAIN_MAX = 1 << 17
#: vocabulary widths of public LM heads above 2^17
LM_HEADS = (151936, 152064, 163840, 200064, 201088, 256000, 262144)


def beyond_shapes(rng, n=3000):
    """Shapes with M, N or K above :data:`DOMAIN_MAX` and none above :data:`BEYOND_MAX`."""
    out = [(M, N, K) for N in LM_HEADS for M in (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384)
           for K in (2048, 3072, 4096, 5120, 7168, 8192, 12288, 16384)]  # LM heads, decode to prefill
    long_nk = [(5760, 1920), (12288, 4096), (24576, 8192), (4096, 4096), (4096, 14336), (8192, 8192)]  # Evo 2, FFNs
    out += [(M, N, K) for M in (196608, 262144, 524288, BEYOND_MAX) for N, K in long_nk + MODEL_NK[:8]]  # long contexts
    out += [(M, N, K) for M in (1, 2, 16, 256, 4096) for N in (16, 256, 4096, 65536)
            for K in (196608, 262144, 393216, 524288, BEYOND_MAX)]  # deep K: the bound can exceed 1 here
    out = dict.fromkeys(out)
    fixed = len(out)
    while len(out) < fixed + n:  # random shapes, log-uniform in each dimension, each once
        M = max(1, int(round(2 ** rng.uniform(0, 20))))
        N, K = _log16(rng, 20), _log16(rng, 20)
        if max(M, N, K) > DOMAIN_MAX:
            out[(M, N, K)] = None
    return list(out)


#: the K of the ``rowbias`` set: every K of the complete record's grid (a step of 16 from 5136 to 65536)
ROWBIAS_K = range(5136, 65537, 16)


def rowbias_shapes(rng, wide=48, narrow=16):
    """(M, N) pairs where K can split at K = 65536 (the bound >= 2), ``wide`` of them with N >= 8192 (where the
    measured answers with bias had an algorithm) and ``narrow`` with N below, each at every K of ROWBIAS_K."""
    out = []
    while len(out) < wide + narrow:
        lo, hi = (13.0, 17.0) if len(out) < wide else (4.0, 13.0)
        N = 16 * max(1, int(round(2 ** rng.uniform(lo, hi) / 16)))
        m_max = ((1 << 20) - 16) // (8 * _ceil32(N))
        if m_max < 1:
            continue
        M = max(1, min(m_max, int(round(2 ** rng.uniform(0, np.log2(m_max))))))
        if (M, N) not in out:
            out.append((M, N))
    return [(M, N, K) for M, N in out for K in ROWBIAS_K]


SETS = {"gran": (gran_shapes, "tensorwise"), "large": (large_shapes, "all"), "deepk": (deepk_shapes, "tensorwise"),
        "beyond": (beyond_shapes, "all"), "rowbias": (rowbias_shapes, "rowwise-fast")}


def set_combos(cset: str) -> list[dict]:
    """The option combinations a set is asked for (its ``SETS`` entry): "all", "tensorwise" or "rowwise-fast"."""
    cs = combo_set("all")
    if cset == "tensorwise":
        return [c for c in cs if c["scale_mode"] == "tensorwise"]
    if cset == "rowwise-fast":
        return [c for c in cs if c["scale_mode"] == "rowwise" and c["fast_accum"]]
    return cs


def run_set(name, shapes, cs, ws, jobs, chunk=64, echo=print):
    tasks = [(shapes[i:i + chunk], cs) for i in range(0, len(shapes), chunk)]
    t0 = time.time()
    ctx = mp.get_context("spawn")
    parts, info = [], None
    max_mn = max(1 << 17, max(max(M, N) for M, N, _ in shapes))  # scale and bias vectors of every shape
    with ctx.Pool(jobs, initializer=_init, initargs=(ws, max_mn)) as pool:
        for k, (arr, info) in enumerate(pool.imap(_work, tasks)):
            parts.append(arr)
            if k % max(1, len(tasks) // 10) == 0:
                echo(f"[measure] {name}: {(k + 1) * chunk * len(cs)} queries, {time.time() - t0:.0f}s")
    raw = np.concatenate(parts)
    flat = raw.reshape(-1, len(FIELDS))
    configs, inv = np.unique(flat, axis=0, return_inverse=True)
    ids = inv.reshape(raw.shape[:2]).astype(np.int32)
    none = np.all(configs == -1, axis=1)
    if none.any():  # no algorithm: id -1
        bad = int(np.nonzero(none)[0][0])
        ids = np.where(ids == bad, -1, ids - (ids > bad))
        configs = configs[~none]
    secs = time.time() - t0
    echo(f"[measure] {name}: {ids.size} queries in {secs:.0f}s ({ids.size / secs:.0f}/s on {jobs} processes)")
    return ids, configs, info, secs


@click.command()
@click.option("--sets", default="gran,large,deepk", help="Comma-separated: gran, large, deepk, beyond, rowbias.")
@click.option("--jobs", type=int, default=16)
@click.option("--seed", type=int, default=21)
@click.option("--out", "out_dir", required=True)
def main(sets, jobs, seed, out_dir):
    names = sets.split(",")
    for name in names:
        if name not in SETS:
            raise click.BadParameter(f"{name!r} is not a sample set; the sets are {', '.join(SETS)}",
                                     param_hint="--sets")
    os.makedirs(out_dir, exist_ok=True)
    ws, ws_source = probe_workspace()
    for name in names:
        make, cset = SETS[name]
        rng = np.random.default_rng(seed)
        shapes = make(rng) if name != "deepk" else make()
        shapes = list(dict.fromkeys(shapes))
        cs = set_combos(cset)
        ids, configs, info, secs = run_set(name, shapes, cs, ws, jobs, echo=lambda m: click.echo(m, err=True))
        meta = {"set": name, "seed": seed, "fields": FIELDS, "workspace_bytes": ws, "workspace_source": ws_source,
                "runtime": info, "seconds": round(secs, 1), "jobs": jobs, "date": time.strftime("%Y-%m-%d"),
                "tool": "cpemu.recording.splitk_measure"}
        np.savez_compressed(os.path.join(out_dir, f"{name}.npz"), shapes=np.asarray(shapes, np.int32), ids=ids,
                            configs=configs.astype(np.int32), combos=json.dumps(cs), meta=json.dumps(meta))


if __name__ == "__main__":
    main()
