"""The complete split-K table: every K of a grid for each recorded (M, N) pair, stored as runs.

One ``.npz`` file (numpy, compressed), read lazily the first time a shape needs it:

* ``meta`` (JSON text): ``k0``, ``k_step``, ``nk`` (the K grid ``k0 + i * k_step``, ``i < nk``),
  ``combos`` (the option keys ``a,b,out,fast|promo``), ``fields`` (the names of the
  configuration columns) and provenance;
* ``pairs``: the recorded (M, N) pairs as sorted keys ``M << 20 | N``; a pair is there only
  when every K of the grid and every combination were recorded;
* ``configs``: the distinct algorithm configurations (tile, stages, cluster, split count, ...);
* per combination ``j``: ``off<j>`` (runs of pair ``p`` are ``off[p]:off[p+1]``), ``end<j>``
  (the K index where each run ends, exclusive) and ``cfg<j>`` (its configuration, ``NONE``
  where the heuristic returns no algorithm).

Along K the answer changes rarely (a few runs per pair), which is what makes it compact.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources

import numpy as np

__all__ = ["NONE", "pair_key", "write_table", "load_complete", "lookup"]

NONE = 0xFFFF  # no algorithm
_N_BITS = 20


def pair_key(M: int, N: int) -> int:
    return (int(M) << _N_BITS) | int(N)


def write_table(path: str, meta: dict, pairs: dict, configs: list) -> dict:
    """Write ``pairs`` ({(M, N): {combo key: [end, config id, end, config id, ...]}}: the runs along
    the K grid, each ending before K index ``end``); returns the sizes written."""
    keys = sorted(pairs, key=lambda mn: pair_key(*mn))
    arrays = {"pairs": np.array([pair_key(*mn) for mn in keys], np.int64),
              "configs": np.asarray(configs, np.int32).reshape(len(configs), len(meta["fields"]))}
    runs_total = 0
    for j, key in enumerate(meta["combos"]):
        runs = [pairs[mn][key] for mn in keys]
        off = np.cumsum([0] + [len(r) // 2 for r in runs])
        flat = np.fromiter((v for r in runs for v in r), np.int64, count=2 * int(off[-1]))
        if flat.size and (flat[0::2].max() > meta["nk"] or flat[1::2].max() > NONE):
            raise ValueError("write_table: a run ends past the K grid or a config id exceeds 16 bits")
        arrays[f"off{j}"] = off.astype(np.int32)
        arrays[f"end{j}"] = flat[0::2].astype(np.uint16)
        arrays[f"cfg{j}"] = flat[1::2].astype(np.uint16)
        runs_total += int(off[-1])
    tmp = path + ".tmp.npz"
    np.savez_compressed(tmp, meta=json.dumps(meta), **arrays)
    os.replace(tmp, path)
    return {"pairs": len(keys), "runs": runs_total, "configs": len(configs), "bytes": os.path.getsize(path)}


class _Table:
    def __init__(self, z):
        self.meta = json.loads(str(z["meta"]))
        self.pairs = z["pairs"]
        self.configs = z["configs"]
        self.split_col = self.meta["fields"].index("splitk_num")
        self.combo = {k: j for j, k in enumerate(self.meta["combos"])}
        self.runs = {j: (z[f"off{j}"], z[f"end{j}"], z[f"cfg{j}"]) for j in range(len(self.meta["combos"]))}

    def config(self, M: int, N: int, K: int, key: str):
        """The configuration row for the call, ``"x"`` (no algorithm) or None (not recorded)."""
        m = self.meta
        j = self.combo.get(key)
        i, r = divmod(K - m["k0"], m["k_step"])
        if j is None or r or not 0 <= i < m["nk"]:
            return None
        k = pair_key(M, N)
        p = int(np.searchsorted(self.pairs, k))
        if p == len(self.pairs) or self.pairs[p] != k:
            return None
        off, end, cfg = self.runs[j]
        lo, hi = int(off[p]), int(off[p + 1])
        c = int(cfg[lo + int(np.searchsorted(end[lo:hi], i, side="right"))])
        return "x" if c == NONE else self.configs[c]


@lru_cache(maxsize=None)
def load_complete(name: str, base_dir: str | None = None) -> _Table:
    if base_dir is None:
        with resources.files("cpemu.profile_data").joinpath(name).open("rb") as f:
            with np.load(f) as z:
                return _Table(z)
    with np.load(os.path.join(base_dir, name)) as z:
        return _Table(z)


def lookup(name: str, base_dir: str | None, M: int, N: int, K: int, key: str):
    """The split count from the complete table, ``"x"`` (no algorithm) or None (not recorded)."""
    row = load_complete(name, base_dir).config(M, N, K, key)
    if row is None or isinstance(row, str):
        return row
    return int(row[load_complete(name, base_dir).split_col])
