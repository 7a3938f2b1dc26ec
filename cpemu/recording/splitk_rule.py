"""Check a profile's split-K laws on recorded heuristic tables, and write its point table.

Inputs are tools/splitk_table.py or tools/cublaslt_heuristic.py outputs. The laws (see
cpemu/splitk.py), with ``u = split_bound(bound, M, N, K)``:

* ``bound``: the split count never exceeds ``max(u, 1)``;
* ``no-split``: where ``u <= 1`` the heuristic never splits;
* ``attained``: answers with ``s == u`` (support that the bound cannot be lowered);
* ``rowwise``: rowwise (outer-vector) scaling never splits;
* ``bias``: bias never changes the answer for K <= ``BIAS_K_MAX`` (checked on every pair of answers
  that differ only by it; above it, pairs that differ are counted as ``bias-differs-above``, not a law).

Each law's support and violations are counted per file; any violation is an error. The table
then holds every recorded tensorwise answer the laws leave open (``u >= 2``), keyed by shape
and option combination ``a,b,out,fast|promo``.

    python tools/build_splitk_rule.py --derive grid.json --check heldout_main.json ... \
        --out cpemu/profile_data/hopper-h200-torch.splitk.json
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter, defaultdict

import click

from ..splitk import combo_key as _key
from ..splitk import split_bound

BOUND = {"k_per_split": 2560, "bytes_per_partial": 4, "n_align": 32, "workspace_bytes": 1 << 20,
         "workspace_reserve": 16}
BIAS_K_MAX = 65536  # one answer in 247,805 pairs differed by bias, at K = 107696 (measured/large.npz)


def rows_of(path):
    """(combo, M, N, K, split) of a splitk_table.py file, a cublaslt_heuristic.py query file or a
    splitk_measure.py sample file (``.npz``); the split count in base 36 (upper case in .npz files, so that 33 is "X"),
    ``x`` where the heuristic returned no algorithm."""
    if path.endswith(".npz"):
        yield from _npz_rows(path)
        return
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        d = json.load(fh)
    if "rows" in d:
        for r in d["rows"]:
            c = {k: r[k] for k in ("a_dtype", "b_dtype", "out_dtype", "fast_accum", "bias", "scale_mode")}
            yield c, r["M"], r["N"], r["K"], (str(r["splitk_num"]) if r["status"] == "OK" else "x")
        return
    for ci, c in enumerate(d["combos"]):
        for (M, N, K), ch in zip(d["shapes"], d["splits"][ci]):
            yield c, M, N, K, ch


def _npz_rows(path):
    import numpy as np

    with np.load(path) as z:
        shapes, ids, configs = z["shapes"].tolist(), z["ids"], z["configs"]
        combos = json.loads(str(z["combos"]))
        col = json.loads(str(z["meta"]))["fields"].index("splitk_num")
    chars = np.array(["x"] + [np.base_repr(int(s), 36) for s in configs[:, col]])[ids + 1]
    for j, c in enumerate(combos):
        for (M, N, K), ch in zip(shapes, chars[:, j].tolist()):
            yield c, M, N, K, ch


def combo_key(c) -> str:
    return _key(c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"])


def law_counts(rows, bound: dict) -> tuple[Counter, Counter]:
    """(support, violations) of each law over ``rows`` ((combo, M, N, K, char) tuples)."""
    support, viol = Counter(), Counter()
    by_bias = defaultdict(dict)
    for c, M, N, K, ch in rows:
        if ch == "x":
            continue
        s, u = int(ch, 36), split_bound(bound, M, N, K)
        support["bound"] += 1
        viol["bound"] += s > max(u, 1)
        if u <= 1:
            support["no-split"] += 1
            viol["no-split"] += s != 1
        elif s == u and c["scale_mode"] == "tensorwise":
            support["attained"] += 1
        if c["scale_mode"] == "rowwise":
            support["rowwise"] += 1
            viol["rowwise"] += s != 1
        by_bias[(combo_key(c), c["scale_mode"], M, N, K)][c["bias"]] = s
    for key, v in by_bias.items():
        if len(v) == 2 and key[-1] <= BIAS_K_MAX:
            support["bias"] += 1
            viol["bias"] += v[True] != v[False]
        elif len(v) == 2:
            support["bias-above"] += 1
            support["bias-differs-above"] += v[True] != v[False]
    return support, +viol


@click.command()
@click.option("--derive", "derive_files", multiple=True, required=True, type=click.Path(exists=True))
@click.option("--check", "check_files", multiple=True, type=click.Path(exists=True))
@click.option("--out", "out_path", required=True)
def main(derive_files, check_files, out_path):
    try:
        build(derive_files, check_files, out_path)
    except ValueError as e:
        raise SystemExit(str(e))


def build(derive_files, check_files, out_path, bound: dict | None = None, echo=click.echo) -> dict:
    """Check the laws on every file, then write the point table of the open shapes.

    Returns the report; raises ValueError when a law is violated or two files disagree."""
    bound = dict(bound or BOUND)
    report = {"derived_from": [os.path.basename(f) for f in derive_files], "bound": bound, "checks": {}}
    files = list(derive_files) + list(check_files)
    for f in files:
        rows = list(rows_of(f))
        support, viol = law_counts(rows, bound)
        report["checks"][os.path.basename(f)] = {"queries": len(rows), "held_out": f in check_files,
                                                 "support": dict(support), "violations": dict(viol)}
        echo(f"{os.path.basename(f)}: {len(rows)} queries; law support {dict(support)}; "
             f"violations {dict(viol) or 'none'}")
        if viol:
            raise ValueError(f"split-K law violated in {f}: {dict(viol)}")
    table = defaultdict(dict)
    for f in files:
        for c, M, N, K, ch in rows_of(f):
            if c["scale_mode"] != "tensorwise" or ch == "x" or split_bound(bound, M, N, K) <= 1:
                continue
            key = combo_key(c)
            prev = table[key].get((M, N, K))
            if prev is not None and prev != ch:
                raise ValueError(f"inconsistent answers for {key} {(M, N, K)}: {prev} vs {ch}")
            table[key][(M, N, K)] = ch
    shapes = sorted({s for t in table.values() for s in t})
    index = {s: i for i, s in enumerate(shapes)}
    tables = {}
    for key, t in sorted(table.items()):
        chars = ["?"] * len(shapes)
        for s, ch in t.items():
            chars[index[s]] = ch
        tables[key] = "".join(chars)
    doc = {"about": "cuBLASLt split-K counts for recorded shapes the laws leave open (split bound >= 2), per "
                    "option combination 'a,b,out,fast|promo'; one character per shape of 'shapes' (base 36; "
                    "'?' = not recorded).",
           "rule": report, "shapes": shapes, "tables": tables}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    os.replace(tmp, out_path)
    echo(f"wrote {out_path}: {len(shapes)} shapes x {len(tables)} combos")
    return report


if __name__ == "__main__":
    main()
