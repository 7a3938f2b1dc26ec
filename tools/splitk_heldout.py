"""Held-out check of the profile's split-K schedule against cuBLASLt's heuristic, on fresh random shapes.

On the GPU host: draws shapes at random over the profile's whole domain (log-uniform M, N and K,
N and K multiples of 16, a share drawn inside the split region) with a random option combination
each, asks the heuristic exactly as torch asks (:class:`cpemu.recording.splitk_query.LeanQuerier`),
and compares its split count with the profile's plan. Writes the counts (agree, refused by reason,
disagree; per region) and every disagreement as JSON; exit status 1 on any disagreement.

    python tools/splitk_heldout.py --shapes 200000 --seed 11 --jobs 16 --out heldout.json

``--no-heuristic`` (any machine, no GPU) draws the same shapes and counts only what the profile answers and
what it refuses, by reason: how much of a fresh draw a table still leaves open. It checks no answer.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections import Counter

import click
import numpy as np

import cpemu
from cpemu.recording.splitk_table import combos
from cpemu.schedule import UnsupportedShape, covered_k, slices_for
from cpemu.splitk import split_bound

def _log16(rng, hi: int) -> int:
    return 16 * max(1, min(hi // 16, int(round(2 ** rng.uniform(0, np.log2(hi / 16))))))


def draw(n: int, seed: int, profile, split_share: float = 0.3) -> list[tuple]:
    """``n`` (M, N, K, combination index) drawn over the profile's tensorwise domain."""
    rng = np.random.default_rng(seed)
    dom = profile.data["modes"]["tensorwise"]["split_k"]["domain"]
    bound = profile.data["modes"]["tensorwise"]["split_k"]["params"]["bound"]
    n_combo = len(combos("all"))
    out = []
    while len(out) < n:
        inside = rng.random() < split_share
        while True:  # a shape inside the split region is redrawn until it is
            M = max(1, min(dom["M"][1], int(round(2 ** rng.uniform(0, np.log2(dom["M"][1]))))))
            N, K = _log16(rng, dom["N"][1]), _log16(rng, dom["K"][1])
            if not inside or split_bound(bound, M, N, K) >= 2:
                break
        out.append((M, N, K, int(rng.integers(n_combo))))
    return out


def _plan(profile, M: int, N: int, K: int, combo: dict):
    """The profile's call for one shape and option combination (raises UnsupportedShape where it refuses)."""
    bias = combo["out_dtype"] if combo["bias"] else None
    return profile.call(M, N, K, combo["a_dtype"], combo["b_dtype"], combo["out_dtype"], combo["scale_mode"],
                        combo["fast_accum"], bias)


def judge(profile, M: int, N: int, K: int, combo: dict, answer) -> tuple[str, str | None]:
    """("agree" | "refused" | "disagree", detail) of the profile against one heuristic ``answer``
    (a FIELDS tuple, or None where the heuristic has no algorithm and torch raises)."""
    from cpemu.recording.splitk_query import SPLITK

    try:
        call = _plan(profile, M, N, K, combo)
    except UnsupportedShape as e:
        if answer is None:
            return "agree", "both refuse"
        if e.reason == "no-algorithm":  # the profile says torch raises, but the heuristic has one
            return "disagree", f"the heuristic has an algorithm ({int(answer[SPLITK])} slices), the profile says none"
        return "refused", e.reason
    if answer is None:
        return "disagree", f"the heuristic has no algorithm, the profile plans {call.plan.splits} slices"
    s, tail = int(answer[SPLITK]), profile.split_rule(combo["scale_mode"]).tail
    want = len(slices_for(covered_k(K, s, 128, tail), s, 128))  # the slices of what the kernel sums
    if call.plan.splits == want:
        return "agree", None
    return "disagree", f"the heuristic splits into {answer[SPLITK]} ({want} slices), the profile plans {call.plan.splits}"


def check(items, ask, profile) -> dict:
    """Counts and disagreements of ``items`` ((M, N, K, combination index)) with ``ask(M, N, K, combo)``."""
    cs = combos("all")
    bound = profile.data["modes"]["tensorwise"]["split_k"]["params"]["bound"]
    counts = {"split": Counter(), "unsplit": Counter()}
    bad, refused = [], []
    for M, N, K, j in items:
        c = cs[j]
        verdict, detail = judge(profile, M, N, K, c, ask(M, N, K, c))
        region = "split" if split_bound(bound, M, N, K) >= 2 else "unsplit"
        counts[region][verdict if verdict != "refused" else f"refused:{detail}"] += 1
        row = {"M": M, "N": N, "K": K, **c, "detail": detail}
        if verdict == "disagree":
            bad.append(row)
        elif verdict == "refused" and len(refused) < 200:
            refused.append(row)
    return {"counts": {k: dict(v) for k, v in counts.items()}, "disagreements": bad, "refused_sample": refused}


def plan_ranges(profile) -> list[tuple[int, int, int, int]]:
    """(n_min, n_max, k_min, k_max) of each complete table of the profile's tensorwise split rule."""
    from cpemu.splitk import complete_names, table_range
    from cpemu.splitk_complete import load_complete

    par = profile.data["modes"]["tensorwise"]["split_k"]["params"]
    return [table_range(load_complete(name, profile.base_dir).meta) for name in complete_names(par)]


def where_unrecorded(ranges, N: int, K: int) -> str:
    """Where an unrecorded shape lies: in a table's plan (not recorded yet) or beyond every plan, by
    axis (above the largest N or K of the plans)."""
    if any(n0 <= N <= n1 and k0 <= K <= k1 for n0, n1, k0, k1 in ranges):
        return "in a plan"
    if not ranges:
        return "no table"
    n_hi, k_hi = N > max(r[1] for r in ranges), K > max(r[3] for r in ranges)
    return {(True, True): "N and K above", (True, False): "N above", (False, True): "K above"}.get(
        (n_hi, k_hi), "between plans")


def refusals(items, profile) -> dict:
    """Per region, how many of ``items`` the profile answers (``answered``) and refuses (``refused:<reason>``),
    and the unrecorded ones (inside a table's plan) and those outside the recorded domain (beyond every plan)
    by where they lie (:func:`where_unrecorded`); no heuristic is asked, so nothing is judged."""
    cs = combos("all")
    bound = profile.data["modes"]["tensorwise"]["split_k"]["params"]["bound"]
    ranges = plan_ranges(profile)
    counts = {"split": Counter(), "unsplit": Counter()}
    unrecorded, outside = Counter(), Counter()
    for M, N, K, j in items:
        try:
            _plan(profile, M, N, K, cs[j])
            verdict = "answered"
        except UnsupportedShape as e:
            verdict = f"refused:{e.reason}"
            if e.reason in ("unrecorded", "outside-domain"):
                (unrecorded if e.reason == "unrecorded" else outside)[where_unrecorded(ranges, N, K)] += 1
        counts["split" if split_bound(bound, M, N, K) >= 2 else "unsplit"][verdict] += 1
    return {"counts": {k: dict(v) for k, v in counts.items()}, "unrecorded": dict(unrecorded),
            "outside_domain": dict(outside), "disagreements": [], "refused_sample": []}


def _refusals_worker(args):
    items, profile_name = args
    return refusals(items, cpemu.get_profile(profile_name))


def _worker(args):
    items, profile_name, ws = args
    from cpemu.recording.splitk_query import LeanQuerier

    q = LeanQuerier(ws)
    return check(items, q.ask, cpemu.get_profile(profile_name))


def merge_results(parts: list[dict]) -> dict:
    counts = {"split": Counter(), "unsplit": Counter()}
    bad, refused, unrecorded, outside = [], [], Counter(), Counter()
    for p in parts:
        unrecorded.update(p.get("unrecorded", {}))
        outside.update(p.get("outside_domain", {}))
        for k, v in p["counts"].items():
            counts[k].update(v)
        bad += p["disagreements"]
        refused += p["refused_sample"][:max(0, 200 - len(refused))]
    total = Counter()
    for v in counts.values():
        total.update(v)
    doc = {"total": dict(total), "counts": {k: dict(v) for k, v in counts.items()}, "disagreements": bad,
           "refused_sample": refused}
    if any("unrecorded" in p for p in parts):
        doc["unrecorded"], doc["outside_domain"] = dict(unrecorded), dict(outside)
    return doc


@click.command()
@click.option("--shapes", "n", type=int, default=200000, show_default=True)
@click.option("--seed", type=int, default=11, show_default=True)
@click.option("--split-share", type=float, default=0.3, show_default=True,
              help="share of shapes drawn inside the split region")
@click.option("--jobs", type=int, default=16, show_default=True)
@click.option("--profile", "profile_name", default=cpemu.DEFAULT_PROFILE, show_default=True)
@click.option("--out", "out_path", required=True)
@click.option("--no-heuristic", is_flag=True,
              help="no GPU: count what the profile answers and refuses on the same draw, judge nothing")
def main(n, seed, split_share, jobs, profile_name, out_path, no_heuristic):
    profile = cpemu.get_profile(profile_name)
    items = draw(n, seed, profile, split_share)
    if no_heuristic:
        t0 = time.time()
        with mp.get_context("spawn").Pool(jobs) as pool:
            doc = merge_results(pool.map(_refusals_worker, [(items[w::jobs], profile_name) for w in range(jobs)]))
        del doc["disagreements"], doc["refused_sample"]
        doc.update(shapes=n, seed=seed, split_share=split_share, profile=profile_name, heuristic=False,
                   seconds=round(time.time() - t0, 1), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        with open(out_path, "w") as f:
            json.dump(doc, f, indent=1)
        click.echo(f"{n} shapes (no heuristic asked): {doc['total']}; unrecorded: {doc['unrecorded']}; "
                   f"outside the recorded domain: {doc['outside_domain']}")
        return
    from cpemu.recording.splitk_query import probe_workspace, runtime_info
    from cpemu.recording import cublaslt_heuristic as ch

    ws, src = probe_workspace()
    t0 = time.time()
    with mp.get_context("spawn").Pool(jobs) as pool:
        parts = pool.map(_worker, [(items[w::jobs], profile_name, ws) for w in range(jobs)])
    doc = merge_results(parts)
    rt = ch.Runtime()
    doc.update(shapes=n, seed=seed, split_share=split_share, profile=profile_name, seconds=round(time.time() - t0, 1),
               date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), workspace_bytes=ws, workspace_source=src,
               runtime=runtime_info(rt))
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    click.echo(f"{n} shapes: {doc['total']}; {len(doc['disagreements'])} disagreements")
    raise SystemExit(1 if doc["disagreements"] else 0)


if __name__ == "__main__":
    main()
