"""Where cuBLASLt has an algorithm for rowwise scales with bias and fast accumulation: the findings a
measured sample (:mod:`.splitk_measure`, e.g. its ``rowbias`` or ``large`` set) gives, as JSON.

    python -m cpemu.recording.no_algorithm_report DIR/rowbias.npz

For each rowwise combination with bias and fast accumulation, inside the region where K can split
(the split bound >= 2; outside it the heuristic always has one), it reports:

* ``shapes``, ``with_algorithm``: how many shapes of the region, and how many have an algorithm;
* ``custom_option_law``: shapes where "an algorithm exactly where the answer without bias has
  ``custom_option`` != 0" fails (``violations``), and where the algorithm is not that answer
  (``other_answer``);
* ``n_min``, ``m_max``: the smallest N and the largest M with an algorithm;
* ``k_law``: (M, N) groups of one 128-wide K block and one alignment class (16, 32, 64+) whose
  shapes disagree on having an algorithm (``groups``, ``broken``): whether a record may ask one K of
  each, as the split-K record does.

and across the combinations, ``disagree``: per pair of them, the shapes of the region where one has
an algorithm and the other not. It is what a record of the region (``splitk_enum run --options
rowwise-bias``) needs to know: which N it must cover, and whether the K law holds for it.
"""

from __future__ import annotations

import json

import click
import numpy as np

from ..splitk import split_bound
from .splitk_enum import k_law_rep
from .splitk_rule import BOUND

__all__ = ["report"]


def _region(shapes: np.ndarray, bound: dict) -> np.ndarray:
    return np.array([split_bound(bound, int(M), int(N), int(K)) >= 2 for M, N, K in shapes], bool)


def _k_law(shapes: np.ndarray, has: np.ndarray) -> dict:
    """K-law groups (one pair, one representative K of :func:`.splitk_enum.k_law_rep`) of more than one
    shape, and those whose shapes disagree on having an algorithm."""
    key = np.array([(M, N, k_law_rep(int(K))) for M, N, K in shapes], np.int64).reshape(-1, 3)
    _, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.ravel()
    sizes, with_one = np.bincount(inv), np.bincount(inv, weights=has)
    many = sizes > 1
    return {"groups": int(many.sum()), "broken": int((many & (with_one > 0) & (with_one < sizes)).sum())}


def report(path: str, bound: dict | None = None) -> dict:
    """The findings of one measured file (module docstring)."""
    bound = dict(bound or BOUND)
    with np.load(path, allow_pickle=False) as d:
        combos = json.loads(str(d["combos"]))
        fields = json.loads(str(d["meta"]))["fields"]
        shapes, ids, configs = d["shapes"], d["ids"], d["configs"]
    custom = fields.index("custom_option")
    region = _region(shapes, bound)
    out, has_of = {"file": path, "region_shapes": int(region.sum()), "combos": {}}, {}
    for j, c in enumerate(combos):
        if c["scale_mode"] != "rowwise" or not c["bias"] or not c["fast_accum"]:
            continue
        twin = [i for i, t in enumerate(combos) if t == {**c, "bias": False}]
        key = f"{c['a_dtype']},{c['b_dtype']},{c['out_dtype']}"
        s, col = shapes[region], ids[region, j]
        has = col >= 0
        has_of[key] = has
        row = {"shapes": int(len(col)), "with_algorithm": int(has.sum()),
               "n_min": int(s[has, 1].min()) if has.any() else None,
               "m_max": int(s[has, 0].max()) if has.any() else None, "k_law": _k_law(s, has)}
        if len(twin) == 1:
            plain = ids[region, twin[0]]
            law = (plain >= 0) & (configs[np.maximum(plain, 0), custom] != 0)
            row["custom_option_law"] = {"violations": int((has != law).sum()),
                                        "other_answer": int((has & (col != plain)).sum())}
        out["combos"][key] = row
    keys = list(has_of)
    out["disagree"] = {f"{a} / {b}": int((has_of[a] != has_of[b]).sum())
                       for i, a in enumerate(keys) for b in keys[i + 1:]}
    return out


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
def main(paths):
    """Findings of measured samples (.npz of cpemu.recording.splitk_measure), as JSON."""
    click.echo(json.dumps([report(p) for p in paths], indent=1))


if __name__ == "__main__":
    main()
