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
  where the heuristic returns no algorithm, ``SAME`` where it equals the answer of the base
  combination ``meta["base"][j]``; -1: stored whole).

Runs along K and differences against a base combination (fast accumulation for the same
options without it, bf16 output for the other outputs, e4m3 x e4m3 for the other formats:
the closest pairs measured) keep it compact.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources

import numpy as np

__all__ = ["NONE", "SAME", "pair_key", "default_bases", "write_table", "load_complete", "lookup"]

NONE = 0xFFFF  # no algorithm
SAME = 0xFFFE  # as the base combination
_N_BITS = 20


def pair_key(M: int, N: int) -> int:
    return (int(M) << _N_BITS) | int(N)


def default_bases(keys: list[str]) -> list[int]:
    """The base of each combination ``a,b,out,fast|promo`` (index into ``keys``, -1: none)."""
    index = {k: j for j, k in enumerate(keys)}
    out = []
    for k in keys:
        a, b, o, f = k.split(",")
        if f == "promo":
            base = f"{a},{b},{o},fast"
        elif o != "bfloat16":
            base = f"{a},{b},bfloat16,fast"
        elif (a, b) != ("e4m3", "e4m3"):
            base = "e4m3,e4m3,bfloat16,fast"
        else:
            base = None
        out.append(index.get(base, -1))
    return out


def _runs(col: np.ndarray) -> np.ndarray:
    """[end, value, end, value, ...] of a column."""
    change = np.nonzero(col[1:] != col[:-1])[0] + 1
    ends = np.concatenate((change, [len(col)]))
    return np.stack((ends, col[np.concatenate(([0], change))]), 1).ravel()


def write_table(path: str, meta: dict, pairs: dict, configs: list) -> dict:
    """Write ``pairs`` ({(M, N): {combo key: [end, config id, end, config id, ...]}}: the runs along
    the K grid, each ending before K index ``end``; ``NONE`` = no algorithm) with differences against
    ``meta["base"]`` (set to :func:`default_bases` when absent); returns the sizes written."""
    combos = meta["combos"]
    meta.setdefault("base", default_bases(combos))
    if len(configs) >= SAME:
        raise ValueError(f"write_table: {len(configs)} configurations do not fit 16-bit ids")
    keys = sorted(pairs, key=lambda mn: pair_key(*mn))
    parts = {j: [] for j in range(len(combos))}
    for mn in keys:
        cols = []
        for key in combos:
            r = np.asarray(pairs[mn][key], np.int64)
            if r[-2] != meta["nk"]:
                raise ValueError(f"write_table: the runs of {mn} {key} end at {r[-2]}, not at the grid's end")
            cols.append(np.repeat(r[1::2], np.diff(np.concatenate(([0], r[0::2])))))
        for j, col in enumerate(cols):
            b = meta["base"][j]
            parts[j].append(_runs(col if b < 0 else np.where(col == cols[b], SAME, col)))
    arrays = {"pairs": np.array([pair_key(*mn) for mn in keys], np.int64),
              "configs": np.asarray(configs, np.int32).reshape(len(configs), len(meta["fields"]))}
    runs_total = 0
    for j, runs in parts.items():
        flat = np.concatenate(runs) if runs else np.zeros(0, np.int64)
        arrays[f"off{j}"] = np.cumsum([0] + [len(r) // 2 for r in runs]).astype(np.int32)
        arrays[f"end{j}"] = flat[0::2].astype(np.uint16)
        arrays[f"cfg{j}"] = flat[1::2].astype(np.uint16)
        runs_total += len(flat) // 2
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

    def column(self, p: int, j: int) -> np.ndarray:
        """Configuration ids of pair index ``p``, combination ``j``, at every K of the grid (NONE: no algorithm)."""
        off, end, cfg = self.runs[j]
        lo, hi = int(off[p]), int(off[p + 1])
        col = np.repeat(cfg[lo:hi], np.diff(np.concatenate(([0], end[lo:hi].astype(np.int64)))))
        b = self.meta["base"][j]
        return col if b < 0 else np.where(col == SAME, self.column(p, b), col)

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
        c = SAME
        while c == SAME:
            off, end, cfg = self.runs[j]
            lo, hi = int(off[p]), int(off[p + 1])
            c = int(cfg[lo + int(np.searchsorted(end[lo:hi], i, side="right"))])
            j = m["base"][j]
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
    """The configuration from the complete table as {field: value}, ``"x"`` (no algorithm) or None (not recorded)."""
    table = load_complete(name, base_dir)
    row = table.config(M, N, K, key)
    if row is None or isinstance(row, str):
        return row
    return dict(zip(table.meta["fields"], (int(v) for v in row)))
