"""Heuristic answers per second of the split-K recorders' two queriers, side by side, on one GPU.

    python tools/bench_querier.py --seconds 10 --out querier.json

Asks the same (M, N, K, combination) sequence (pairs of the complete record's plan, every K of
the grid) through :class:`cpemu.recording.splitk_query.Querier` and :class:`LeanQuerier`,
compares every answer, and writes the rates and the count of differences as JSON.
"""

from __future__ import annotations

import argparse
import json
import time

from cpemu.recording import splitk_enum as se
from cpemu.recording.splitk_query import LeanQuerier, Querier, probe_workspace


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="time per querier")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    ws, src = probe_workspace()
    plan = se.default_plan()
    pairs = se.pair_order(plan)[::997]
    seq = [(M, N, K, c) for M, N in pairs for c in plan["combos"] for K in se.k_grid(plan)]
    out = {"workspace_bytes": ws, "workspace_source": src, "queriers": {}}
    answers = {}
    for name, cls in (("Querier", Querier), ("LeanQuerier", LeanQuerier)):
        q = cls(ws)
        got, t0 = [], time.perf_counter()
        for M, N, K, c in seq:
            got.append(q.ask(M, N, K, c))
            if time.perf_counter() - t0 > args.seconds:
                break
        dt = time.perf_counter() - t0
        answers[name] = got
        out["queriers"][name] = {"answers": len(got), "seconds": round(dt, 3), "per_s": round(len(got) / dt, 1)}
    n = min(len(v) for v in answers.values())
    out["compared"] = n
    out["different"] = sum(a != b for a, b in zip(answers["Querier"][:n], answers["LeanQuerier"][:n]))
    out["speedup"] = round(out["queriers"]["LeanQuerier"]["per_s"] / out["queriers"]["Querier"]["per_s"], 2)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))
    return 1 if out["different"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
