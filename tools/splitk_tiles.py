"""Check cpemu's split-K slicing per (tile, split count) against native torch._scaled_mm outputs.

The profile answers a split-K shape only where its slicing was reproduced on the GPU for the
kernel's tile up to that split count (``verified_splits``). This tool finds the configurations of
the complete table above those counts, runs native on a few cheap shapes of each, and compares
the bytes with cpemu's reference under the profile's slicing (and, where that differs, a few
other slicings, to say which one the kernel uses).

    python tools/splitk_tiles.py cases --out cases.json                    # CPU: what to run
    python tools/splitk_tiles.py native --cases cases.json --out native.npz  # GPU host with torch
    python tools/splitk_tiles.py verdict --cases cases.json --native native.npz --out verdict.json [--step cpu-fp32]
    python tools/splitk_tiles.py probe --M 1 --N 48 --K 45712 --out probe.json  # GPU: where slices end
    python tools/splitk_tiles.py rejudge --verdict verdict.json --out now.json  # CPU: under today's profile

Operands: random finite FP8 codes (numpy seed per case, the same on both machines), unit
tensorwise scales, no bias. ``native`` also asks the heuristic (as torch asks) whether it still
picks the case's configuration.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import time

import click
import numpy as np

#: slicings tried where the profile's does not reproduce the output: (name, granularity, layout, order);
#: "profile" is the profile's own (its tail rule included, :func:`profile_slices`), "ceil" the same
#: without the tail rule (what the first verdict judged)
SLICINGS = (("profile", 128, "profile", "in"), ("ceil", 128, "ceil", "in"),
            ("reverse", 128, "ceil", "reverse"), ("g64", 64, "ceil", "in"),
            ("g256", 256, "ceil", "in"), ("balanced", 128, "balanced", "in"),
            ("balanced-last", 128, "balanced-last", "in"))


def _codes(rng, shape, fmt):
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    special = (c & 0x7F) == 0x7F if fmt == "e4m3" else (c & 0x7F) >= 0x7C
    c[special] = 0  # finite codes only
    return c


def operands(case):
    rng = np.random.default_rng(case["seed"])
    a, b = case["combo"].split(",")[:2]
    return _codes(rng, (case["M"], case["K"]), a), _codes(rng, (case["N"], case["K"]), b)


def profile_slices(K, s, profile_name="hopper-h200-torch"):
    """The slices the profile's plan sums for ``s`` slices (cpemu.schedule.kernel_slices)."""
    import cpemu
    from cpemu.schedule import kernel_slices

    return kernel_slices(K, s, cpemu.get_profile(profile_name).split_rule("tensorwise"))


def slices(K, s, g, layout):
    """Contiguous slices of K tiles of g: ``ceil`` (the profile's: ceil(tiles/s) each, the last
    shorter), ``balanced`` / ``balanced-last`` (tiles // s each, the first / last tiles % s one more)."""
    if layout == "profile":
        return profile_slices(K, s)
    tiles = -(-K // g)
    if layout == "ceil":
        per = -(-tiles // s) * g
        return tuple((k, min(k + per, K)) for k in range(0, K, per))
    base, extra = divmod(tiles, s)
    counts = [base + (i < extra if layout == "balanced" else i >= s - extra) for i in range(s)]
    out, k = [], 0
    for n in counts:
        if n:
            out.append((k, min(k + n * g, K)))
            k += n * g
    return tuple(out)


# ---------------------------------------------------------------------------- cases (CPU)

def unverified_configs(profile_name="hopper-h200-torch", which=0):
    """{config id: (tile, split, reduction)} of the profile's complete table ``which`` (its index in
    ``complete_file``) above the profile's verified counts."""
    import cpemu
    from cpemu.splitk import complete_names, split_verified
    from cpemu.splitk_complete import load_complete

    par = cpemu.get_profile(profile_name).data["modes"]["tensorwise"]["split_k"]["params"]
    table = load_complete(complete_names(par)[which])
    f = table.meta["fields"]
    ti, si, ri = f.index("tile_id"), f.index("splitk_num"), f.index("reduction_scheme")
    out = {i: (int(c[ti]), int(c[si]), int(c[ri])) for i, c in enumerate(table.configs)
           if not split_verified(par, c[ti], int(c[si]))}
    return table, out


def tail_configs(table, profile_name="hopper-h200-torch"):
    """{config id: (tile, split, reduction)} of the complete table whose split count the profile's
    tail rule covers (cpemu.schedule.covered_k) but whose cut was not seen for its tile, and per id
    the K of the table's grid where the rule cuts K."""
    import cpemu
    from cpemu.schedule import covered_k

    rule = cpemu.get_profile(profile_name).split_rule("tensorwise")
    tail = rule.tail or {}
    f = table.meta["fields"]
    ti, si, ri = f.index("tile_id"), f.index("splitk_num"), f.index("reduction_scheme")
    ks = table.meta["k0"] + table.meta["k_step"] * np.arange(table.meta["nk"])
    out, cut = {}, {}
    for i, c in enumerate(table.configs):
        tile, s = int(c[ti]), int(c[si])
        if tail and s >= tail["min_splits"] and s not in tail.get("verified", {}).get(str(tile), []):
            out[i] = (tile, s, int(c[ri]))
            cut[i] = np.array([covered_k(int(K), s, rule.granularity, tail) != K for K in ks.tolist()])
    return out, cut


def make_cases(per: int, profile_name="hopper-h200-torch", which=0):
    """Cheap calls of every configuration of complete table ``which`` to check: split counts above the
    verified ones, and (``"tail": true``) counts whose tail cut was not seen for the tile, at a K where
    it cuts."""
    table, bad = unverified_configs(profile_name, which)
    tails, cut = tail_configs(table, profile_name)
    ks = table.meta["k0"] + table.meta["k_step"] * np.arange(table.meta["nk"])
    best = {}  # (tile, s, red, tail) -> {(M, N): (cost, K, combo)}
    ids, tail_ids = np.array(sorted(bad)), np.array(sorted(tails))
    # only pairs whose runs name one of those ids in some combination can hold one (a column takes its
    # ids from its own runs and its base's): the others need no decoding
    wanted = np.union1d(ids, tail_ids)
    held = set()
    for off, _, cfg in table.runs.values():
        held.update((np.searchsorted(off, np.nonzero(np.isin(cfg, wanted))[0], side="right") - 1).tolist())
    for p in sorted(held):
        key = int(table.pairs[p])
        M, N = key >> 20, key & 0xFFFFF
        for combo, j in table.combo.items():
            col = table.column(p, j)
            picks = [(cid, col == cid, bad[cid] + (False,)) for cid in np.unique(col[np.isin(col, ids)]).tolist()]
            picks += [(cid, (col == cid) & cut[cid], tails[cid] + (True,))
                      for cid in np.unique(col[np.isin(col, tail_ids)]).tolist()]
            for cid, where, cfg in picks:
                if not where.any():
                    continue
                i = int(np.argmax(where))  # the smallest such K with this configuration
                cost = M * N * int(ks[i])
                d = best.setdefault(cfg, {})
                if (M, N) not in d or cost < d[(M, N)][0]:
                    d[(M, N)] = (cost, int(ks[i]), combo)
    cases = []
    for cfg in sorted(best):
        picks = sorted(best[cfg].items(), key=lambda kv: kv[1][0])[:per]
        for (M, N), (cost, K, combo) in picks:
            cases.append({"tile": cfg[0], "splits": cfg[1], "reduction": cfg[2], "M": M, "N": N, "K": K,
                          "combo": combo, "macs": cost, "seed": len(cases), **({"tail": True} if cfg[3] else {})})
    return cases


# ---------------------------------------------------------------------------- native (GPU)

def run_native(cases):
    import torch

    from cpemu.recording.splitk_query import FIELDS, Querier, probe_workspace

    ws, _ = probe_workspace()
    q = Querier(ws)
    dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    outs, asked = {}, []
    for i, c in enumerate(cases):
        a_f, b_f, out, acc = c["combo"].split(",")
        a, bt = operands(c)
        ta = torch.from_numpy(a).cuda().view(dt[a_f])
        tb = torch.from_numpy(bt).cuda().view(dt[b_f])
        one = torch.ones((), device="cuda")
        y = torch._scaled_mm(ta, tb.t(), scale_a=one, scale_b=one, out_dtype=getattr(torch, out),
                             use_fast_accum=acc == "fast").cpu().contiguous()
        outs[f"c{i}"] = y.view(torch.uint8).numpy().reshape(-1)
        ans = q.ask(c["M"], c["N"], c["K"], {"a_dtype": a_f, "b_dtype": b_f, "out_dtype": out,
                                              "fast_accum": acc == "fast", "bias": False, "scale_mode": "tensorwise"})
        row = dict(zip(FIELDS, ans)) if ans else {}
        asked.append({"tile_id": row.get("tile_id"), "splitk_num": row.get("splitk_num"),
                      "reduction_scheme": row.get("reduction_scheme")})
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "workspace_bytes": ws,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "heuristic": asked, **q.info()}
    return outs, meta


# ---------------------------------------------------------------------------- probe (GPU)

#: the probe's two products: BIG in one K position and SMALL 16 further, a = 1 everywhere. In one
#: chain of fast accumulation the step aligns SMALL to BIG's exponent and truncates it away (2^-9 is
#: below 256's grid of 2^-5 at 13 fraction bits); in two chains each partial is exact and their FP32
#: round-to-nearest sum keeps it (the ulp of 256 is 2^-15).
PROBE_BIG, PROBE_SMALL = 256.0, 2.0 ** -9


def probe_operands(M, N, K, first, fmt_a="e4m3", fmt_b="e4m3"):
    """Codes for one probe call: column n tests the K positions ``16 * (first + n)`` and 16 further."""
    import ml_dtypes

    dt = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
    a = np.full((M, K), 1.0, np.float32).astype(dt[fmt_a]).view(np.uint8)
    bt = np.zeros((N, K), np.float32)
    for n in range(N):
        k = 16 * (first + n)
        if k + 16 < K:
            bt[n, k], bt[n, k + 16] = PROBE_BIG, PROBE_SMALL
    return a, bt.astype(dt[fmt_b]).view(np.uint8)


def read_probe(out_row, first, K):
    """The K positions (multiples of 16) where a new chain starts, from one probe call's FP32 outputs."""
    starts = []
    for n, v in enumerate(np.asarray(out_row, np.float32).tolist()):
        k = 16 * (first + n)
        if k + 16 < K and v != PROBE_BIG:
            if v != PROBE_BIG + PROBE_SMALL:
                raise ValueError(f"probe output {v!r} at K position {k}: neither one chain nor two")
            starts.append(k + 16)
    return starts


def run_probe(M, N, K, fmt_a="e4m3", fmt_b="e4m3"):
    import torch

    from cpemu.recording.splitk_query import FIELDS, Querier, probe_workspace

    ws, _ = probe_workspace()
    combo = {"a_dtype": fmt_a, "b_dtype": fmt_b, "out_dtype": "float32", "fast_accum": True, "bias": False,
             "scale_mode": "tensorwise"}
    ans = Querier(ws).ask(M, N, K, combo)
    dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    one = torch.ones((), device="cuda")
    starts = []
    for first in range(0, K // 16 - 1, N):
        a, bt = probe_operands(M, N, K, first, fmt_a, fmt_b)
        y = torch._scaled_mm(torch.from_numpy(a).cuda().view(dt[fmt_a]), torch.from_numpy(bt).cuda().view(dt[fmt_b]).t(),
                             scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=True)
        starts += read_probe(y[0].cpu().numpy(), first, K)
    return {"M": M, "N": N, "K": K, "formats": [fmt_a, fmt_b], "heuristic": dict(zip(FIELDS, ans)) if ans else None,
            "chain_starts": starts, "torch": torch.__version__, "device": torch.cuda.get_device_name()}


# ---------------------------------------------------------------------------- verdict (CPU)

#: the host backends whose step a verdict may sum with: the reference's (the specification) or
#: cpu-fp32's (the same bits, tests/test_cpu_fp32.py; about 2.7x faster on these calls)
STEPS = ("reference", "cpu-fp32")


def _step(name: str):
    from cpemu import backends

    if name not in STEPS:
        raise KeyError(name)
    return backends.get(name).arith.step


def emulate(case, name, step="reference"):
    """cpemu's reference output bytes of ``case`` under the slicing ``name`` (:data:`SLICINGS`),
    each step summed by ``step`` (:data:`STEPS`)."""
    import cpemu
    from cpemu import reference as ref
    from cpemu.call import Epilogue
    from cpemu.formats import FP8_FORMATS, encode_output
    from cpemu.schedule import Plan

    _, g, layout, order = next(s for s in SLICINGS if s[0] == name)
    prof = cpemu.get_profile()
    a_f, b_f, out, acc = case["combo"].split(",")
    promo = None if acc == "fast" else int(prof.mode("tensorwise")["promotion_interval"])
    a, bt = operands(case)
    A, B = ref.Codes(a, FP8_FORMATS[a_f]), ref.Codes(bt, FP8_FORMATS[b_f])
    parts = [ref.accumulate(A, B, Plan(slices=(sl,), promotion=promo), prof.instruction, step=_step(step))
             for sl in slices(case["K"], case["splits"], g, layout)]
    if order == "reverse":
        parts = parts[::-1]
    acc_sum = parts[0]
    with np.errstate(invalid="ignore", over="ignore"):
        for p in parts[1:]:
            acc_sum = acc_sum + p
    ep = Epilogue.from_mode(prof.mode("tensorwise"), out)
    one = np.float32(1.0)
    y = encode_output(ref.epilogue(acc_sum, one, one, None, ep.spec()), out, ep.nan_bits)
    return np.ascontiguousarray(y).view(np.uint8).reshape(-1)


def _check(job):
    case, want, names, step = job
    got = {}
    for name in names:
        got[name] = bool(np.array_equal(emulate(case, name, step), want))
        if name == "profile" and got[name] and not case.get("tail"):
            break  # the profile's slicing reproduces it: no need for the others (a tail case also
            # asks whether the slicing without the cut would have, i.e. whether the call tells them apart)
    return got


def verdict(cases, native, jobs=1, names=tuple(s[0] for s in SLICINGS), step="reference"):
    work = [(c, native[f"c{i}"], names, step) for i, c in enumerate(cases)]
    if jobs > 1:
        with mp.get_context("spawn").Pool(jobs) as pool:
            res = pool.map(_check, work, chunksize=1)
    else:
        res = [_check(w) for w in work]
    rows = [dict(c, match=r, layout="profile", sha256=hashlib.sha256(native[f"c{i}"].tobytes()).hexdigest())
            for i, (c, r) in enumerate(zip(cases, res))]
    par = _params()
    return {"rows": rows, "matched": sum(r["match"].get("profile", False) for r in rows), "cases": len(rows),
            "proposed_verified_splits": proposed_verified(par.get("verified_splits", {}), rows)}


def rejudge(doc, jobs=1):
    """A verdict's rows judged again under the profile's slicing as it is now, from the H200
    outputs' sha256: a row whose profile slicing is the one it was judged under keeps its
    verdict; the others are emulated again (``match_before`` keeps the earlier verdict)."""
    rows, work = [], []
    for r in doc["rows"]:
        judged = slices(r["K"], r["splits"], 128, r.get("layout", "ceil"))
        now = profile_slices(r["K"], r["splits"])
        if now == judged:
            rows.append(dict(r, layout="profile"))
        else:
            work.append(len(rows))
            rows.append(r)
    jobs_in = [(rows[i],) for i in work]
    if jobs > 1:
        with mp.get_context("spawn").Pool(jobs) as pool:
            got = pool.map(_hash_profile, jobs_in, chunksize=1)
    else:
        got = [_hash_profile(j) for j in jobs_in]
    for i, h in zip(work, got):
        r = rows[i]
        rows[i] = dict(r, layout="profile", match_before=r["match"], rejudged=True,
                       match={"profile": h == r["sha256"]})
    return {"rows": rows, "matched": sum(r["match"].get("profile", False) for r in rows), "cases": len(rows),
            "rejudged": len(work), "native": doc.get("native"),
            "proposed_verified_splits": proposed_verified(_params().get("verified_splits", {}), rows)}


def _hash_profile(job):
    return hashlib.sha256(emulate(job[0], "profile").tobytes()).hexdigest()


def _params(profile_name="hopper-h200-torch"):
    import cpemu

    return cpemu.get_profile(profile_name).data["modes"]["tensorwise"]["split_k"]["params"]


def proposed_verified(old: dict, rows) -> dict:
    """``verified_splits`` with the verdict's rows added: per tile, the counts already verified
    and every count whose calls all matched; a largest count where that is every count from 2 up,
    else the list. A count that failed on any call is left out (and must not be verified already)."""
    ok, bad = {}, {}
    for r in rows:
        (ok if r["match"].get("profile", False) else bad).setdefault(str(r["tile"]), set()).add(r["splits"])
    out = {}
    for tile in sorted(set(old) | set(ok) | set(bad), key=int):
        v = old.get(tile, 1)
        had = set(v) if isinstance(v, list) else set(range(2, v + 1))
        failed = bad.get(tile, set())
        if failed & had:
            raise ValueError(f"tile {tile}: split counts {sorted(failed)} failed but are verified already")
        counts = (had | ok.get(tile, set())) - failed
        top = max(counts, default=1)
        if counts == set(range(2, top + 1)):
            out[tile] = top
        else:
            out[tile] = sorted(counts)
    return out


@click.group()
def cli():
    """(module docstring)"""


@cli.command("cases")
@click.option("--out", "out_path", required=True)
@click.option("--per", type=int, default=3, help="shapes per configuration (the cheapest, one per (M, N))")
@click.option("--table", "which", type=click.IntRange(min=0), default=0,
              help="which of the profile's complete tables (its index in complete_file)")
def cases_cmd(out_path, per, which):
    import cpemu
    from cpemu.splitk import complete_names

    names = complete_names(cpemu.get_profile().data["modes"]["tensorwise"]["split_k"]["params"])
    if which >= len(names):
        raise click.BadParameter(f"the profile has {len(names)} complete table(s) (got {which})", param_hint="--table")
    cases = make_cases(per, which=which)
    with open(out_path, "w") as f:
        json.dump({"cases": cases}, f, indent=0)
    click.echo(f"{len(cases)} cases of {len({(c['tile'], c['splits']) for c in cases})} configurations, "
               f"{sum(c['macs'] for c in cases):.3g} MACs")


@cli.command("native")
@click.option("--cases", "cases_path", required=True)
@click.option("--out", "out_path", required=True)
def native_cmd(cases_path, out_path):
    with open(cases_path) as f:
        cases = json.load(f)["cases"]
    outs, meta = run_native(cases)
    np.savez_compressed(out_path, meta=json.dumps(meta), **outs)
    moved = sum(h["tile_id"] != c["tile"] or h["splitk_num"] != c["splits"] for h, c in zip(meta["heuristic"], cases))
    click.echo(f"{len(cases)} native outputs; the heuristic picked another configuration for {moved}")


@cli.command("probe")
@click.option("--M", "M", type=int, required=True)
@click.option("--N", "N", type=int, required=True)
@click.option("--K", "K", type=int, required=True)
@click.option("--formats", default="e4m3,e4m3", help="a,b formats")
@click.option("--out", "out_path", required=True)
def probe_cmd(M, N, K, formats, out_path):
    """Where torch's kernel starts a new accumulation chain along K (fast accumulation, FP32 out)."""
    fa, fb = formats.split(",")
    doc = run_probe(M, N, K, fa, fb)
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    h = doc["heuristic"] or {}
    click.echo(f"tile {h.get('tile_id')} split {h.get('splitk_num')}: chains start at {doc['chain_starts']}")


@cli.command("verdict")
@click.option("--cases", "cases_path", required=True)
@click.option("--native", "native_path", required=True)
@click.option("--out", "out_path", required=True)
@click.option("--jobs", type=int, default=1)
@click.option("--step", type=click.Choice(STEPS), default="reference", show_default=True,
              help="the step function that sums each step (cpu-fp32: the reference's bits, faster)")
def verdict_cmd(cases_path, native_path, out_path, jobs, step):
    with open(cases_path) as f:
        cases = json.load(f)["cases"]
    z = np.load(native_path)
    native = {k: z[k] for k in z.files if k != "meta"}
    doc = verdict(cases, native, jobs, step=step)
    doc["native"] = json.loads(str(z["meta"]))
    doc["step"] = step
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    click.echo(f"{doc['matched']}/{doc['cases']} reproduced by the profile's slicing; "
               f"proposed verified_splits {doc['proposed_verified_splits']}")


@cli.command("rejudge")
@click.option("--verdict", "verdict_path", required=True)
@click.option("--out", "out_path", required=True)
@click.option("--jobs", type=int, default=1)
def rejudge_cmd(verdict_path, out_path, jobs):
    """A verdict judged again under the profile's slicing as it is now (CPU, from the sha256)."""
    with open(verdict_path) as f:
        doc = rejudge(json.load(f), jobs)
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    click.echo(f"{doc['matched']}/{doc['cases']} reproduced by the profile's slicing ({doc['rejudged']} judged "
               f"again); proposed verified_splits {doc['proposed_verified_splits']}")


if __name__ == "__main__":
    cli()
