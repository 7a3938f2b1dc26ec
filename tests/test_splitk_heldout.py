"""tools/splitk_heldout.py without a GPU: the draw, and the judge against stand-in heuristic answers
(the shipped complete table's own answers where it has them, one unsplit answer elsewhere)."""

import importlib.util
import os

import numpy as np

import cpemu
from cpemu.splitk import split_bound
from cpemu.splitk_complete import load_complete, lookup
from splitk_fixtures import UNRECORDED, partial_profile

HERE = os.path.dirname(__file__)
_spec = importlib.util.spec_from_file_location("cpemu_tools_splitk_heldout", os.path.join(HERE, "..", "tools", "splitk_heldout.py"))
hd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hd)
PROFILE = cpemu.get_profile("hopper-h200-torch")
PARAMS = PROFILE.data["modes"]["tensorwise"]["split_k"]["params"]


def _rowbias_holds(M, N, K):
    """Whether the profile's rowwise-bias table (no_algorithm.complete_file) holds (M, N, K): the pair
    recorded, K inside its grid."""
    na = PROFILE.data["modes"]["rowwise"]["split_k"]["no_algorithm"]
    return bool(na.get("complete_file")) and load_complete(na["complete_file"]).holds(M, N, K)


# the 9 maybe-no-algorithm refusals of the recorded sample that the shipped rowwise-bias table decides (7 pairs
# with K <= 65536, all of M <= 6, held by its record of 13,231 pairs; the other 2 have K above 65536)
DECIDED_SAMPLE = 7


def _answer(split):
    return (66, 10, 36, 4, split, 2 if split > 1 else 0, 0, 1, 0, 16)


def test_draw_covers_the_domain():
    items = hd.draw(4000, 1, PROFILE, split_share=0.3)
    assert items == hd.draw(4000, 1, PROFILE, split_share=0.3) and len(items) == 4000
    a = np.array(items)
    assert a[:, 0].max() > 16384 and a[:, 1].max() > 16384 and a[:, 2].max() > 16384
    assert (a[:, 1] % 16 == 0).all() and (a[:, 2] % 16 == 0).all() and a[:, 0].min() >= 1
    split = [split_bound(PARAMS["bound"], M, N, K) >= 2 for M, N, K, _ in items]
    assert 0.3 < np.mean(split) < 0.6


def test_judge():
    c = {"a_dtype": "e4m3", "b_dtype": "e4m3", "out_dtype": "bfloat16", "fast_accum": True, "bias": False,
         "scale_mode": "tensorwise"}
    assert hd.judge(PROFILE, 64, 4096, 4096, c, _answer(1)) == ("agree", None)
    verdict, detail = hd.judge(PROFILE, 64, 4096, 4096, c, _answer(2))
    assert verdict == "disagree" and "splits into 2" in detail
    assert hd.judge(PROFILE, 64, 4096, 4096, c, None)[0] == "disagree"  # the profile answers where torch raises
    # a recorded split pair: the complete table's answer agrees, another split count does not
    M, N, K = 1, 1536, 7168
    cfg = lookup(PARAMS["complete_file"], None, M, N, K, "e4m3,e4m3,bfloat16,fast")
    s = cfg["splitk_num"]
    assert s >= 2 and hd.judge(PROFILE, M, N, K, c, _answer(s)) == ("agree", None)
    assert hd.judge(PROFILE, M, N, K, c, _answer(s + 1))[0] == "disagree"
    # an unrecorded split pair is refused, named
    assert hd.judge(partial_profile(), *UNRECORDED, c, _answer(2)) == ("refused", "unrecorded")
    # where the tail rule cuts K, 22 slices of K - 16 (the ceil slicing of all of K would give 21)
    c2 = dict(c, a_dtype="e5m2", out_dtype="float32")
    assert lookup(PARAMS["complete_file"], None, 1, 1040, 56336, "e5m2,e4m3,float32,fast")["splitk_num"] == 22
    assert hd.judge(PROFILE, 1, 1040, 56336, c2, _answer(22)) == ("agree", None)
    # rowwise, bias and fast accumulation below N = 8192 where K can split: the profile says no algorithm,
    # which agrees where the heuristic has none and is a disagreement where it has one
    rb = dict(c, scale_mode="rowwise", bias=True)
    assert hd.judge(PROFILE, 2, 4096, 14336, rb, None) == ("agree", "both refuse")
    verdict, detail = hd.judge(PROFILE, 2, 4096, 14336, rb, _answer(1))
    assert verdict == "disagree" and "the profile says none" in detail
    assert hd.judge(PROFILE, 1, 70144, 8192, rb, _answer(1)) == ("refused", "maybe-no-algorithm")  # beyond the plan
    # a pair the rowwise-bias table holds is decided by it: there the H200's heuristic has an unsplit algorithm
    assert _rowbias_holds(2, 28672, 8192) and hd.judge(PROFILE, 2, 28672, 8192, rb, _answer(1)) == ("agree", None)
    assert hd.judge(PROFILE, 2, 28672, 8192, rb, None)[0] == "disagree"


def test_check_counts_and_exit_rows():
    items = hd.draw(300, 2, PROFILE, split_share=0.3)

    def ask(M, N, K, c):
        if split_bound(PARAMS["bound"], M, N, K) < 2:
            return _answer(1)
        key = f"{c['a_dtype']},{c['b_dtype']},{c['out_dtype']},{'fast' if c['fast_accum'] else 'promo'}"
        cfg = lookup(PARAMS["complete_file"], None, M, N, K, key) if c["scale_mode"] == "tensorwise" else None
        return _answer(1 if c["scale_mode"] == "rowwise" else 2) if not isinstance(cfg, dict) else _answer(cfg["splitk_num"])

    res = hd.merge_results([hd.check(items[:150], ask, PROFILE), hd.check(items[150:], ask, PROFILE)])
    assert sum(res["total"].values()) == 300 and res["total"].get("agree", 0) > 150
    assert not any(d["K"] <= 5120 for d in res["disagreements"])
    assert all(k == "agree" or k.startswith("refused:") or k == "disagree" for k in res["total"])


def test_refusals_count_without_the_heuristic():
    """--no-heuristic counts what the profile answers and refuses on a draw, without judging: an unsplit
    shape and a recorded split pair are answered, an unrecorded split pair is refused as unrecorded, a split
    shape beyond every table's plan as outside the domain; on a draw every shape lands in exactly one count,
    and the split region holds every refusal for an unrecorded pair."""
    cs = hd.combos("all")
    j = next(i for i, c in enumerate(cs) if (c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"], c["bias"],
                                              c["scale_mode"]) == ("e4m3", "e4m3", "bfloat16", True, False, "tensorwise"))
    res = hd.refusals([(64, 4096, 4096, j), (1, 1536, 7168, j), (4000, 16, 5184, j)], PROFILE)
    assert res["counts"] == {"unsplit": {"answered": 1}, "split": {"answered": 2}} and res["unrecorded"] == {}
    # a table that holds only part of its plan (a record not finished)
    res = hd.refusals([(64, 4096, 4096, j), (4000, 16, 5184, j), (*UNRECORDED, j)], partial_profile())
    assert res["counts"] == {"unsplit": {"answered": 1}, "split": {"answered": 1, "refused:unrecorded": 1}}
    assert res["unrecorded"] == {"in a plan": 1} and res["outside_domain"] == {}
    # beyond the shipped table's plan (N and K up to 65536), by axis
    res = hd.refusals([(1, 16, 65552, j), (1, 65552, 6144, j), (1, 65552, 65552, j)], PROFILE)
    assert res["counts"] == {"split": {"refused:outside-domain": 3}, "unsplit": {}}
    assert res["outside_domain"] == {"K above": 1, "N above": 1, "N and K above": 1} and res["unrecorded"] == {}
    items = hd.draw(300, 3, PROFILE, split_share=0.3)
    res = hd.merge_results([hd.refusals(items[:100], PROFILE), hd.refusals(items[100:], PROFILE)])
    assert sum(res["total"].values()) == 300 and res["total"]["answered"] > 150
    assert "refused:unrecorded" not in res["counts"]["unsplit"]
    assert sum(res["unrecorded"].values()) == res["total"].get("refused:unrecorded", 0)
    assert set(res["unrecorded"]) <= {"in a plan"}
    beyond = sum(1 for M, N, K, i in items if split_bound(PARAMS["bound"], M, N, K) >= 2 and max(N, K) > 65536
                 and cs[i]["scale_mode"] == "tensorwise")
    assert sum(res["outside_domain"].values()) == res["total"].get("refused:outside-domain", 0) == beyond > 0


def test_the_recorded_held_out_check_of_the_complete_table():
    """The 200,000-shape held-out check asked of the heuristic (an H100 reporting the H200's device
    attributes, tools/as_h200.sh) with the finished complete table: 0 disagree; every shape is counted
    once; the refused ones are the split region beyond N, K = 65536 (outside-domain) and rowwise bias
    with fast accumulation where N >= 8192 (maybe-no-algorithm), and the shipped profile still refuses
    each refused sample for its recorded reason, except those the rowwise-bias table (recorded since) decides."""
    import json

    r = json.load(open(os.path.join(HERE, "data", "h100-splitk", "as-h200", "heldout-seed11-complete.json")))
    assert r["shapes"] == 200000 and r["seed"] == 11 and r["disagreements"] == []
    assert r["total"] == {"agree": 190849, "refused:outside-domain": 8763, "refused:maybe-no-algorithm": 388}
    assert sum(r["total"].values()) == 200000 and r["runtime"]["device_name"] == "NVIDIA H200"
    assert r["counts"]["unsplit"] == {"agree": 121062}
    keys = ("a_dtype", "b_dtype", "out_dtype", "fast_accum", "bias", "scale_mode")
    decided = 0
    for s in r["refused_sample"]:
        c = {k: s[k] for k in keys}
        verdict, detail = hd.judge(PROFILE, s["M"], s["N"], s["K"], c, _answer(1))
        if s["detail"] == "maybe-no-algorithm" and _rowbias_holds(s["M"], s["N"], s["K"]):
            # recorded since: the rowwise-bias table decides it (an unsplit algorithm, or none: torch raises)
            assert (verdict, detail) == ("agree", None) or hd.judge(PROFILE, s["M"], s["N"], s["K"], c, None) == (
                "agree", "both refuse"), s
            decided += 1
            continue
        assert (verdict, detail) == ("refused", s["detail"]), s
        rowbias = s["scale_mode"] == "rowwise" and s["bias"] and s["fast_accum"] and s["N"] >= 8192
        assert rowbias if s["detail"] == "maybe-no-algorithm" else max(s["N"], s["K"]) > 65536, s
    assert decided == DECIDED_SAMPLE
