"""Derive a profile's split-K rule from recorded heuristic tables, check it, write its table.

Inputs are tools/splitk_table.py outputs. The rule (see cpemu/splitk.py):

* no split-K when ``K <= k_max_nosplit`` or ``M*N >= mn_min_nosplit`` or the scaling is rowwise;
* otherwise the recorded answer for exactly this (M, N, K) and option combination
  (a/b formats, output dtype, fast accumulation; bias was found not to matter);
* otherwise the shape is refused.

The thresholds are derived from the ``--derive`` files only and checked against the
``--check`` files (held out); the table is then written from all files.

    python tools/build_splitk_rule.py --derive grid.json --check heldout_main.json ... \
        --out cpemu/profile_data/hopper-h200-torch.splitk.json
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter, defaultdict

import click


def rows_of(path):
    """(combo, M, N, K, split char) of a splitk_table.py file or a cublaslt_heuristic.py query file."""
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


def combo_key(c) -> str:
    return f"{c['a_dtype']},{c['b_dtype']},{c['out_dtype']},{'fast' if c['fast_accum'] else 'promo'}"


def predicates(k_max, mn_min):
    return {
        f"K<={k_max}": lambda c, M, N, K: K <= k_max,
        f"M*N>={mn_min}": lambda c, M, N, K: M * N >= mn_min,
        "rowwise": lambda c, M, N, K: c["scale_mode"] == "rowwise",
    }


@click.command()
@click.option("--derive", "derive_files", multiple=True, required=True, type=click.Path(exists=True))
@click.option("--check", "check_files", multiple=True, type=click.Path(exists=True))
@click.option("--mn-min", type=int, default=None,
              help="M*N threshold; default: the next power of two above the largest split M*N seen when deriving")
@click.option("--out", "out_path", required=True)
def main(derive_files, check_files, mn_min, out_path):
    try:
        build(derive_files, check_files, mn_min, out_path)
    except ValueError as e:
        raise SystemExit(str(e))


def build(derive_files, check_files, mn_min, out_path, echo=click.echo) -> dict:
    """Derive the thresholds from ``derive_files``, check them on all files, write the table file.

    Returns the rule report; raises ValueError when a threshold is violated or bias changes
    an answer."""
    split_rows = [r for f in derive_files for r in rows_of(f) if r[4] not in "1x"]
    all_k = sorted({r[3] for f in derive_files for r in rows_of(f)})
    if not split_rows:  # this library never split K on the grid: the rule covers the grid's K range
        min_split_k, max_mn = all_k[-1] + 1, 0
    else:
        min_split_k = min(r[3] for r in split_rows)
        max_mn = max(r[1] * r[2] for r in split_rows)
    k_max = max(k for k in all_k if k < min_split_k)  # largest K recorded below the first split
    if mn_min is None:
        mn_min = 1 << max_mn.bit_length() if max_mn else 1 << 62
    echo(f"derived from {len(derive_files)} file(s): split-K seen for K >= {min_split_k}, "
               f"largest K without split below it {k_max}; largest split M*N {max_mn} -> threshold {mn_min}")
    preds = predicates(k_max, mn_min)
    report = {"derived_from": [os.path.basename(f) for f in derive_files], "k_max_nosplit": k_max,
              "mn_min_nosplit": mn_min, "largest_split_mn_in_derivation": max_mn, "checks": {}}
    for f in list(derive_files) + list(check_files):
        support, viol, n = Counter(), Counter(), 0
        for c, M, N, K, ch in rows_of(f):
            n += 1
            for name, p in preds.items():
                if p(c, M, N, K):
                    support[name] += 1
                    if ch not in "1x":
                        viol[name] += 1
        report["checks"][os.path.basename(f)] = {"queries": n, "held_out": f in check_files,
                                                 "support": dict(support), "violations": dict(viol)}
        echo(f"{os.path.basename(f)}: {n} queries; predicate support {dict(support)}; "
                   f"violations {dict(viol) or 'none'}")
        if viol:
            raise ValueError(f"rule violated in {f}: {dict(viol)}")
    # Bias must not change the answer (checked on every file), then the table.
    by_bias = defaultdict(dict)
    table = defaultdict(dict)
    for f in list(derive_files) + list(check_files):
        for c, M, N, K, ch in rows_of(f):
            if c["scale_mode"] != "tensorwise":
                continue
            key = combo_key(c)
            by_bias[(key, M, N, K)][c["bias"]] = ch
            if any(p(c, M, N, K) for p in preds.values()) or ch == "x":
                continue
            prev = table[key].get((M, N, K))
            if prev is not None and prev != ch:
                raise ValueError(f"inconsistent answers for {key} {(M, N, K)}: {prev} vs {ch}")
            table[key][(M, N, K)] = ch
    bias_diff = sum(1 for v in by_bias.values() if len(v) == 2 and v[True] != v[False])
    if bias_diff:
        raise ValueError(f"bias changes the split-K answer for {bias_diff} shapes: key the table by bias")
    report["bias_invariance_pairs"] = sum(1 for v in by_bias.values() if len(v) == 2)
    shapes = sorted({s for t in table.values() for s in t})
    index = {s: i for i, s in enumerate(shapes)}
    tables = {}
    for key, t in sorted(table.items()):
        chars = ["?"] * len(shapes)
        for s, ch in t.items():
            chars[index[s]] = ch
        tables[key] = "".join(chars)
    doc = {"about": "cuBLASLt split-K counts for shapes outside the no-split predicates, per option combination "
                    "'a,b,out,fast|promo'; one character per shape of 'shapes' ('?' = not recorded).",
           "rule": report, "shapes": shapes, "tables": tables}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    os.replace(tmp, out_path)
    echo(f"wrote {out_path}: {len(shapes)} shapes x {len(tables)} combos; "
         f"bias-invariance checked on {report['bias_invariance_pairs']} pairs")
    return report


if __name__ == "__main__":
    main()
