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

With ``meta["store"] == "k-law"`` the runs are not along the grid but along its K-law classes
(:func:`stored_index`): the answer depends on K only through its 128-wide block and its
alignment (16, 32, 64 and more; :mod:`cpemu.recording.splitk_enum`), so a column is stored as
the answers of the 16-aligned K of every block, then the 32-aligned, then the 64-aligned. The
alternation of the classes along K disappears from the runs, and the table is about ten times
smaller. :func:`write_table` stores so only where every column obeys the law.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources

import numpy as np

__all__ = ["NONE", "SAME", "MARK_ASKED", "MARK_DERIVED", "MARK_CHECKED", "pair_key", "column_runs", "default_bases", "stored_index", "write_table", "load_complete", "lookup"]

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


_BLOCK, _CLASSES = 128, (16, 32, 64)


def stored_index(meta: dict) -> np.ndarray | None:
    """For each K of the grid, its index in a stored column (None: stored along the grid).

    K-law order: class c (alignment 16, 32, 64+) of block b is at ``c * blocks + b``."""
    if meta.get("store") != "k-law":
        return None
    k = meta["k0"] + meta["k_step"] * np.arange(meta["nk"], dtype=np.int64)
    block = (k - 1) // _BLOCK
    b0 = (meta["k0"] - 1) // _BLOCK
    nb = int(block[-1]) - b0 + 1
    cls = np.searchsorted(_CLASSES, np.minimum(k & -k, _CLASSES[-1]))
    return cls * nb + (block - b0)


def _k_law_ready(meta: dict) -> bool:
    """Whether every stored slot of the K-law order is the answer of a K of the grid."""
    if meta["k_step"] != 16 or (meta["k0"] - 16) % _BLOCK or (meta["k0"] + meta["k_step"] * meta["nk"] - 16) % _BLOCK:
        return False
    idx = stored_index(dict(meta, store="k-law"))
    return len(np.unique(idx)) == idx.max() + 1


def column_runs(col: np.ndarray) -> np.ndarray:
    """[end, value, end, value, ...] of a column."""
    change = np.nonzero(col[1:] != col[:-1])[0] + 1
    ends = np.concatenate((change, [len(col)]))
    return np.stack((ends, col[np.concatenate(([0], change))]), 1).ravel()


def expand_runs(runs) -> np.ndarray:
    """The column of its runs [end, value, end, value, ...] (:func:`column_runs`, a part file's runs)."""
    r = np.asarray(runs, np.int64)
    return np.repeat(r[1::2], np.diff(np.concatenate(([0], r[0::2]))))


#: per pair and law (``law_fast``, ``law_k``): how its answers were found
MARK_ASKED, MARK_DERIVED, MARK_CHECKED = 0, 1, 2
_MARK = {None: MARK_ASKED, "derived": MARK_DERIVED, "checked": MARK_CHECKED}


def write_table(path: str, meta: dict, pairs: dict, configs: list, marks: dict | None = None) -> dict:
    """Write ``pairs`` ({(M, N): {combo key: [end, config id, end, config id, ...]}}: the runs along
    the K grid, each ending before K index ``end``; ``NONE`` = no algorithm) with differences against
    ``meta["base"]`` (set to :func:`default_bases` when absent); returns the sizes written.

    ``marks``: {(M, N): {"fast": None | "derived" | "checked", "k": ...}}, how the recorder used
    the fast-accumulation law and the K law on the pair (absent: neither), stored as ``law_fast``
    and ``law_k`` (:data:`MARK_ASKED`, :data:`MARK_DERIVED`, :data:`MARK_CHECKED`)."""
    combos = meta["combos"]
    meta.setdefault("base", default_bases(combos))
    if len(configs) >= SAME:
        raise ValueError(f"write_table: {len(configs)} configurations do not fit 16-bit ids")
    keys = sorted(pairs, key=lambda mn: pair_key(*mn))
    # configurations in sorted order, so that a table's bytes do not depend on the order of its merges
    order = sorted(range(len(configs)), key=lambda i: tuple(configs[i]))
    renumber = np.arange(NONE + 1, dtype=np.uint16)  # ids and NONE fit 16 bits: a quarter of the memory
    renumber[order] = np.arange(len(configs))
    configs = [configs[i] for i in order]
    def grid_cols(mn):  # the pair's columns along the grid (expanded one pair at a time: O(one pair) memory)
        cols = []
        for key in combos:
            r = pairs[mn][key]
            if r[-2] != meta["nk"]:
                raise ValueError(f"write_table: the runs of {mn} {key} end at {r[-2]}, not at the grid's end")
            cols.append(renumber[expand_runs(r)])
        return cols

    def runs(idx, first):  # per combination, each pair's runs; None if a column breaks the K law (idx)
        parts = {j: [] for j in range(len(combos))}
        for mn in keys:
            cols = grid_cols(mn)
            if idx is not None:
                if any((col != col[first][idx]).any() for col in cols):
                    return None
                cols = [col[first] for col in cols]
            for j, col in enumerate(cols):
                b = meta["base"][j]
                parts[j].append(column_runs(col if b < 0 else np.where(col == cols[b], SAME, col)))
        return parts

    parts = None
    if meta.get("store") == "k-law":
        idx = stored_index(meta) if _k_law_ready(meta) else None
        parts = None if idx is None else runs(idx, np.unique(idx, return_index=True)[1])
        if parts is None:
            meta["store"] = "grid"  # some column breaks the law (or the grid does not fit it)
    if parts is None:
        parts = runs(None, None)
    marks = marks or {}
    arrays = {"pairs": np.array([pair_key(*mn) for mn in keys], np.int64),
              "configs": np.asarray(configs, np.int32).reshape(len(configs), len(meta["fields"])),
              **{f"law_{law}": np.array([_MARK[marks.get(mn, {}).get(law)] for mn in keys], np.uint8)
                 for law in ("fast", "k")}}
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
        self.index = stored_index(self.meta)
        self.pairs = z["pairs"]
        self.configs = z["configs"]
        self.split_col = self.meta["fields"].index("splitk_num")
        self.combo = {k: j for j, k in enumerate(self.meta["combos"])}
        self.runs = {j: (z[f"off{j}"], z[f"end{j}"], z[f"cfg{j}"]) for j in range(len(self.meta["combos"]))}
        zeros = np.zeros(len(self.pairs), np.uint8)
        self.marks = {law: z[f"law_{law}"] if f"law_{law}" in z.files else zeros for law in ("fast", "k")}

    def column(self, p: int, j: int) -> np.ndarray:
        """Configuration ids of pair index ``p``, combination ``j``, at every K of the grid (NONE: no algorithm)."""
        off, end, cfg = self.runs[j]
        lo, hi = int(off[p]), int(off[p + 1])
        col = np.repeat(cfg[lo:hi], np.diff(np.concatenate(([0], end[lo:hi].astype(np.int64)))))
        if self.index is not None:
            col = col[self.index]
        b = self.meta["base"][j]
        return col if b < 0 else np.where(col == SAME, self.column(p, b), col)

    def pair_index(self, M: int, N: int) -> int | None:
        """The index of (M, N) among the table's pairs (for :meth:`column`), or None where it holds none."""
        k = pair_key(M, N)
        p = int(np.searchsorted(self.pairs, k))
        return p if p < len(self.pairs) and self.pairs[p] == k else None

    def holds(self, M: int, N: int, K: int) -> bool:
        """Whether the table holds (M, N, K): the pair recorded and K a point of its grid."""
        i, r = divmod(K - self.meta["k0"], self.meta["k_step"])
        return not r and 0 <= i < self.meta["nk"] and self.pair_index(M, N) is not None

    def config(self, M: int, N: int, K: int, key: str):
        """The configuration row for the call, ``"x"`` (no algorithm) or None (not recorded)."""
        m = self.meta
        j = self.combo.get(key)
        i, r = divmod(K - m["k0"], m["k_step"])
        if j is None or r or not 0 <= i < m["nk"]:
            return None
        p = self.pair_index(M, N)
        if p is None:
            return None
        if self.index is not None:
            i = int(self.index[i])
        c = SAME
        while c == SAME:
            off, end, cfg = self.runs[j]
            lo, hi = int(off[p]), int(off[p + 1])
            c = int(cfg[lo + int(np.searchsorted(end[lo:hi], i, side="right"))])
            j = m["base"][j]
        return "x" if c == NONE else self.configs[c]


@lru_cache(maxsize=None)
def load_complete(name: str, base_dir: str | None = None) -> _Table:
    try:
        if base_dir is None:
            with resources.files("cpemu.profile_data").joinpath(name).open("rb") as f:
                with np.load(f, allow_pickle=False) as z:
                    return _Table(z)
        with np.load(os.path.join(base_dir, name), allow_pickle=False) as z:
            return _Table(z)
    except (OSError, ValueError, KeyError, TypeError, EOFError, AttributeError) as e:
        raise ValueError(f"profile: complete split-K table {name!r} (complete_file) is not readable: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None


def lookup(name: str, base_dir: str | None, M: int, N: int, K: int, key: str):
    """The configuration from the complete table as {field: value}, ``"x"`` (no algorithm) or None (not recorded)."""
    table = load_complete(name, base_dir)
    row = table.config(M, N, K, key)
    if row is None or isinstance(row, str):
        return row
    return dict(zip(table.meta["fields"], (int(v) for v in row)))
