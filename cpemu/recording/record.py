"""``cpemu record``: turn what this machine's GPU computes into a recorded, verified profile.

Steps (each writes its result under ``OUT/raw`` and is skipped when that file exists, so an
interrupted run resumes where it stopped):

1. provenance: GPU, SM count, driver, torch, CUDA, cuBLASLt (``OUT/raw/truth``);
2. truth: torch._scaled_mm outputs for the designed suites (cpemu/cases.py, ``OUT/raw/truth``);
3. split-K: cuBLASLt's heuristic answers, asked as torch asks, over a grid (rule derivation),
   held-out random shapes (rule check) and the truth shapes;
4. the split-K laws checked on every answer, and the point table of the shapes they leave open
   (``OUT/profile/<name>.splitk.json``);
4b. with ``complete_seconds``: the complete record of those shapes (:mod:`.splitk_enum`, in
   ``OUT/raw/splitk_complete``, resumed by every rerun) and its table
   (``OUT/profile/<name>.splitk-complete.npz``); with ``rowbias_seconds``: the rowwise-bias record
   (whether the heuristic has an algorithm for rowwise scales with bias and fast accumulation where K
   can split; ``OUT/raw/rowbias_complete``, ``OUT/profile/<name>.rowbias-complete.npz``), which the
   profile's ``no_algorithm.complete_file`` names;
5. the truth folder with its manifest (``OUT/truth``);
6. the profile (``OUT/profile/<name>.json``), starting from a base profile's instruction
   model and schedule; every recording is then checked with the emulator: when all match,
   the profile's status is ``recorded``; otherwise promotion intervals and epilogue orders
   are searched (:mod:`cpemu.recording.fit`), and if nothing reproduces every recording the
   profile keeps the base profile's status and the report lists the mismatches.
"""

from __future__ import annotations

import datetime
import json
import os
from collections import Counter

from ..call import Order
from ..cases import SUITES, suite
from ..profile import Profile, get_profile
from ..truth import verify_folder


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _profile_name(prov: dict, base: Profile) -> str:
    dev = "".join(ch for ch in prov["gpu"].lower().replace("nvidia", "").replace("geforce", "") if ch.isalnum())
    return f"{base.data['arch']}-{dev or 'gpu'}-torch"


def _split_k_tables(raw, prof_dir, name, complete_seconds, jobs, prov, echo,
                    rowbias_seconds=None) -> tuple[dict, dict]:
    """Check the split-K laws on the recorded answers and write the tables; (report, profile params).
    With ``rowbias_seconds`` the params hold ``rowbias_file`` too (the rowwise-bias table's name).

    The laws include "rowwise never splits": a GPU whose heuristic splits rowwise calls stops here."""
    from . import splitk_rule

    table_file = f"{name}.splitk.json"
    with open(os.path.join(raw, "splitk_grid.json")) as f:
        bound = dict(splitk_rule.BOUND, workspace_bytes=json.load(f)["workspace_bytes"])
    rule = splitk_rule.build([os.path.join(raw, "splitk_grid.json")],
                             [os.path.join(raw, "splitk_heldout.json"), os.path.join(raw, "splitk_truth.json")],
                             os.path.join(prof_dir, table_file), bound=bound, echo=echo)
    params = {"bound": bound, "table_file": table_file}
    if complete_seconds:
        params["complete_file"] = _complete_table(raw, prof_dir, name, bound, complete_seconds, jobs, prov, echo)
    if rowbias_seconds:
        params["rowbias_file"] = _complete_table(raw, prof_dir, name, bound, rowbias_seconds, jobs, prov, echo,
                                                 options="rowwise-bias")
    return rule, params


def _set_split_k(data: dict, params: dict, suites) -> None:
    """The new profile's split_k sections: the laws and tables for tensorwise, none for rowwise."""
    extra = sorted({(c.N, c.K) for s in suites for c in suite(s) if c.N > 16384 or c.K > 16384})
    domain = {"M": [1, 16384], "N": [16, 16384], "K": [16, 16384], "extra_NK": [list(nk) for nk in extra]}
    params = dict(params)
    rowbias_file = params.pop("rowbias_file", None)
    data["modes"]["tensorwise"]["split_k"] = {
        "kind": "rule", "granularity": 128, "domain": domain, "params": params,
        # the H200 leaves the end of K out there (hopper-h200-torch); not checked on this GPU, so refused
        "tail": {"min_splits": 17, "align": 32, "verified": {},
                 "source": "as the H200's kernels (hopper-h200-torch); not checked on this GPU, so a K that the "
                           "rule would cut is refused"},
        "source": "cuBLASLt heuristic (cpemu record): the split bound and no-split laws checked on the grid, "
                  "held-out random shapes and the truth shapes; open shapes from the recorded tables"}
    if "rowwise" in data["modes"]:
        # with bias and fast accumulation the heuristic may have no algorithm where K could split (torch
        # raises there): such calls stay refused, as on the H200, until a rowwise-bias record decides them
        data["modes"]["rowwise"]["split_k"] = {
            "kind": "none", "domain": domain, "source": "never split in the recorded answers (cpemu record)",
            "no_algorithm": {"bound": params["bound"], "bound_at_least": 2,
                             "source": "as the H200's heuristic (hopper-h200-torch): with rowwise scales, bias and "
                                       "fast accumulation it may have no algorithm where K can split; not recorded "
                                       "on this GPU, so refused"}}
        if rowbias_file:
            na = data["modes"]["rowwise"]["split_k"]["no_algorithm"]
            na["complete_file"] = rowbias_file
            na["source"] = ("cublasLtMatmulAlgoGetHeuristic as torch asks, outer-vector scales with bias and fast "
                            "accumulation where K can split (cpemu record --complete-rowbias): a recorded shape is "
                            "answered where the heuristic has an algorithm and refused as no-algorithm where it has "
                            "none; the rest of the region is refused as maybe-no-algorithm")


def _complete_table(raw, prof_dir, name, bound, seconds, jobs, prov, echo, options="tensorwise") -> str:
    """Run (or continue) the complete split-K record (``options``: tensorwise, or rowwise-bias: the
    rowwise-bias record, a table of its own) for ``seconds``, then merge what is finished."""
    from . import splitk_enum

    stem = "splitk" if options == "tensorwise" else "rowbias"
    rec = os.path.join(raw, f"{stem}_complete")
    st = splitk_enum.run_parallel(rec, splitk_enum.default_plan(bound=bound, options=options), jobs, seconds,
                                  workspace_bytes=bound["workspace_bytes"], echo=echo)
    complete_file = f"{name}.{stem}-complete.npz"
    sizes = splitk_enum.merge(rec, os.path.join(prof_dir, complete_file),
                              provenance={k: prov.get(k) for k in ("gpu", "driver", "torch", "cublaslt")})
    what = "split-K" if stem == "splitk" else "rowwise-bias"
    echo(f"[record] complete {what} record: {st['pairs_done']}/{st['pairs_total']} (M, N) pairs; table {sizes}")
    return complete_file


def record(out_dir: str, base_profile: str = "hopper-h200-torch", name: str | None = None,
           suites=SUITES, heldout: int = 3000, grids=("wide", "dense-splitk"), echo=print, progress=None,
           jobs: int = 1, complete_seconds: float | None = None, rowbias_seconds: float | None = None) -> dict:
    """Run every step; returns the report (also written to OUT/report.json)."""
    from . import splitk_table, truth_recorder
    from .import_truth import build_truth_folder

    raw = os.path.join(out_dir, "raw")
    raw_truth = os.path.join(raw, "truth")
    prof_dir = os.path.join(out_dir, "profile")
    os.makedirs(raw_truth, exist_ok=True)
    os.makedirs(prof_dir, exist_ok=True)
    base = get_profile(base_profile)

    path = os.path.join(raw_truth, "provenance.json")
    if not os.path.exists(path):
        _write_json(path, truth_recorder.provenance())
    prov = json.load(open(path))
    name = name or _profile_name(prov, base)
    echo(f"[record] {prov['gpu']} ({prov['sm_count']} SMs), driver {prov['driver']}, torch {prov['torch']}, "
         f"cuBLASLt {prov['cublaslt'].get('version')}; profile {name} from {base.name}")

    for s in suites:
        if os.path.exists(os.path.join(raw_truth, f"{s}.json")):
            echo(f"[record] truth suite {s}: already recorded")
            continue
        recs = truth_recorder.record_suite(s, raw_truth, progress=progress and progress(f"truth {s}"))
        echo(f"[record] truth suite {s}: {len(recs)} calls, {sum('error' in r for r in recs)} rejected by torch")

    queries = {"splitk_grid.json": ([sh for g in grids for sh in splitk_table.ch.grid_shapes(g)], "all"),
            "splitk_heldout.json": (splitk_table.random_shapes(heldout, 1, "all")
                                    + splitk_table.random_shapes(heldout, 2, "split"), "main"),
            "splitk_truth.json": (sorted({(c.M, c.N, c.K) for s in suites for c in suite(s)}), "all")}
    for fname, (shapes, combo_set) in queries.items():
        fpath = os.path.join(raw, fname)
        if os.path.exists(fpath):
            echo(f"[record] {fname}: already recorded")
            continue
        doc = splitk_table.query_table(list(dict.fromkeys(shapes)), splitk_table.combos(combo_set),
                                       progress=progress and progress(f"heuristic {fname}"))
        _write_json(fpath, doc)
        echo(f"[record] {fname}: {len(doc['shapes'])} shapes x {len(doc['combos'])} option combinations")

    rule, params = _split_k_tables(raw, prof_dir, name, complete_seconds, jobs, prov, echo, rowbias_seconds)
    truth_dir = os.path.join(out_dir, "truth")
    summary = build_truth_folder([raw_truth], [os.path.join(raw, "splitk_truth.json")], name, truth_dir)

    data = json.loads(json.dumps(base.data))
    data.update(name=name, device=f"{prov['gpu']} ({prov['sm_count']} SMs)",
                library=f"cuBLASLt {prov['cublaslt'].get('version')}", caller=f"torch {prov['torch']} torch._scaled_mm")
    data["provenance"] = {"gpu": prov["gpu"], "sm_count": prov["sm_count"], "driver": prov["driver"],
                          "torch": prov["torch"], "cuda": prov["torch_cuda"],
                          "cublaslt": prov["cublaslt"].get("version"),
                          "recorded": datetime.date.today().isoformat(), "recorded_with": "cpemu record",
                          "instruction_model": base.data["instruction"]["source"]}
    _set_split_k(data, params, suites)

    report = {"profile": name, "truth": summary, "split_k_rule": rule}
    _choose_schedule(data, base, name, prof_dir, truth_dir, jobs, report, echo)
    _write_json(os.path.join(out_dir, "report.json"), report)
    return report


def _choose_schedule(data: dict, base, name: str, prof_dir: str, truth_dir: str, jobs: int, report: dict, echo):
    """Write the profile with the first schedule candidate (the base profile's, then promotion
    intervals x epilogue orders) that reproduces every recording; the report says which."""
    candidates = [None] + [(p, o) for p in (4, 8, 2) for o in (x.value for x in Order)]
    for cand in candidates:
        trial = json.loads(json.dumps(data))
        if cand is not None:
            for m in trial["modes"].values():
                m["promotion_interval"], m["epilogue"]["order"] = cand[0], cand[1]
        trial["verification"] = {"status": "recorded", "truth": "truth", "method": "cpemu record", "counts": {}}
        ppath = os.path.join(prof_dir, f"{name}.json")
        _write_json(ppath, trial)
        results, counts = verify_folder(truth_dir, profile=Profile.from_file(ppath), jobs=jobs)
        status = Counter(r.status for r in results)
        report.setdefault("attempts", []).append({"candidate": cand, "status": dict(status)})
        echo(f"[record] schedule {cand or 'of ' + base.name}: {dict(status)}")
        if status.get("mismatch", 0) == 0 and status.get("error", 0):
            report["errors"] = [r.__dict__ for r in results if r.status == "error"][:20]
            echo(f"[record] {status['error']} recordings could not be checked (see report.json 'errors'); "
                 "no schedule candidate changes that")
            break
        if status.get("mismatch", 0) == 0 and status.get("error", 0) == 0:
            trial["verification"] = {
                "status": "recorded", "truth": "truth",
                "method": "cpemu record: every recorded torch._scaled_mm output reproduced bit for bit; split-K "
                          "thresholds checked on held-out heuristic answers",
                "counts": {"recorded_calls": len(results), "outputs_reproduced_bit_for_bit": status.get("match", 0),
                           "rejected_by_torch_and_cpemu": status.get("rejected-both", 0)}}
            _write_json(ppath, trial)
            report["status"] = "recorded"
            report["features"] = {f"{f}:{s}": n for (f, s), n in sorted(counts.items())}
            break
    if report.get("status") != "recorded":
        data["verification"] = dict(base.data["verification"])
        data["verification"]["method"] += "; cpemu record found recordings no candidate schedule reproduces"
        _write_json(os.path.join(prof_dir, f"{name}.json"), data)
        report["status"] = base.status
        report["first_mismatches"] = [r.__dict__ for r in results if r.status != "match"][:20]
