"""Find which schedule and epilogue candidates reproduce recorded torch._scaled_mm outputs.

The experiment behind each rule of a profile: for every recorded case, recompute the
output with the reference arithmetic under each candidate (split-K count and slice
granularity, promotion interval, epilogue order) on a subset of the output, and list
the candidates that match bit for bit.

    python tools/fit_schedule.py DIR/splitk.json [--cols 16] [--rows 64] [--out fit.json]
"""

from __future__ import annotations

import json
from collections import Counter

import click
import numpy as np

from cpemu import reference as ref
from cpemu.call import Order
from cpemu.cases import Case, operands
from cpemu.formats import FP8_FORMATS, encode_output
from cpemu.instruction import INSTRUCTIONS
from cpemu.schedule import Plan, slices_for

ORDERS = tuple(o.value for o in Order)


def fit_case(rec, bits, model, splits_list, granularities, promotions, rows, cols):
    case = Case.from_json(rec)
    a, bt, sa, sb, bias = operands(case)
    r = slice(0, min(rows, case.M))
    c = slice(0, min(cols, case.N))
    A = ref.decode(a[r], FP8_FORMATS[case.a_format])
    B = ref.decode(bt[c], FP8_FORMATS[case.b_format])
    want = bits[r, c]
    sa_ = sa if sa.ndim == 0 else sa[r]
    sb_ = sb if sb.ndim == 0 else sb[:, c]
    b32 = None
    if bias is not None:
        b32 = bias.view(np.float16 if case.out_dtype == "float16" else __import__("ml_dtypes").bfloat16)[c].astype(np.float32)
    hits = []
    seen = {}
    for g in granularities:
        for s in splits_list:
            sl = slices_for(case.K, s, g)
            for p in ([None] if case.fast_accum else promotions):
                key = (sl, p)
                if key in seen:
                    acc = seen[key]
                else:
                    acc = seen[key] = ref.accumulate(A, B, Plan(sl, p), model)
                for order in ORDERS:
                    y = ref.epilogue(acc, sa_, sb_, b32, {"order": order})
                    got = encode_output(y, case.out_dtype).view(want.dtype)
                    if np.array_equal(got, want):
                        hits.append({"splits": s, "nslices": len(sl), "granularity": g, "promotion": p,
                                     "order": order})
    return hits


@click.command()
@click.argument("suite_json", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", default="hopper-sm90a-wgmma-fp8", type=click.Choice(sorted(INSTRUCTIONS)))
@click.option("--splits", default="1-16", help="candidate split counts, e.g. 1-16")
@click.option("--granularity", "grans", default="128", help="comma list of slice granularities (elements)")
@click.option("--promotion", "promos", default="4", help="comma list of promotion intervals (steps)")
@click.option("--rows", default=64, show_default=True)
@click.option("--cols", default=16, show_default=True)
@click.option("--tag", default=None, help="only cases with this tag")
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False))
def main(suite_json, model, splits, grans, promos, rows, cols, tag, out_path):
    """List, per recorded case, the schedule/epilogue candidates that reproduce its bits."""
    lo, hi = (int(x) for x in splits.split("-")) if "-" in splits else (int(splits), int(splits))
    splits_list = list(range(lo, hi + 1))
    granularities = [int(x) for x in grans.split(",")]
    promotions = [int(x) for x in promos.split(",")]
    m = INSTRUCTIONS[model]
    doc = json.load(open(suite_json))
    npz = np.load(suite_json[:-5] + ".npz")
    rows_out = []
    summary = Counter()
    for rec in doc["cases"]:
        if "error" in rec or (tag and tag not in rec.get("tags", [])):
            continue
        hits = fit_case(rec, npz[rec["id"]], m, splits_list, granularities, promotions, rows, cols)
        rows_out.append({"id": rec["id"], "M": rec["M"], "N": rec["N"], "K": rec["K"],
                         "fast_accum": rec["fast_accum"], "hits": hits})
        ss = sorted({h["nslices"] for h in hits})
        orders = sorted({h["order"] for h in hits})
        summary["matched" if hits else "unmatched"] += 1
        print(f"{rec['id']}: slices={ss} orders={orders}" if hits else f"{rec['id']}: NO CANDIDATE", flush=True)
    print(dict(summary))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
