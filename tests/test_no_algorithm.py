"""Rowwise scales with bias and fast accumulation: where cuBLASLt's heuristic (on the H200, as
torch 2.11 asks) returns no algorithm, torch raises, so cpemu must refuse, never answer.

Truth: the recorded heuristic answers of tests/data/h200-splitk/measured/large.npz (-1: no
algorithm) and three calls native torch._scaled_mm refused in a live-parity run on the H200."""

import json
from pathlib import Path

import numpy as np
import pytest

import cpemu
from cpemu import UnsupportedShape
from cpemu.splitk import combo_key, complete_names
from cpemu.splitk_complete import NONE, expand_runs, load_complete

H200 = cpemu.get_profile("hopper-h200-torch")
LARGE = Path(__file__).parent / "data" / "h200-splitk" / "measured" / "large.npz"


def _refusal(M, N, K, a, b, out, fast, bias):
    """(message, reason) of cpemu's refusal, or None where it answers."""
    try:
        H200.call(M, N, K, a, b, out, "rowwise", fast, out if bias else None)
    except UnsupportedShape as e:
        return str(e), e.reason
    return None


def _refused(*args):
    got = _refusal(*args)
    return None if got is None else got[0]


def _shipped_table():
    """The profile's rowwise-bias table (no_algorithm.complete_file), or None where it ships none."""
    names = complete_names(H200.data["modes"]["rowwise"]["split_k"]["no_algorithm"])
    return load_complete(names[0]) if names else None


def _held(t, M: int, N: int, K: int) -> bool:
    return t is not None and t.holds(M, N, K)


# What the shipped table holds of each truth file, by the number of pairs it holds (None: no table). The
# record ran out of device time after 13,231 of its plan's 15,409 pairs (M = 1 and 2 whole, M = 12 to 15
# not yet): tests/data/h200-splitk/rowbias/README.md.
#   large.npz: answers with an algorithm refused as maybe-no-algorithm (not held), and answers without one
#   decided as no-algorithm by the table (held, N >= 8192);
#   rowbias.npz: its pairs with 8192 <= N <= 65536 held (of 31); fresh.txz: its pairs held (of 1,013)
HELD = {None: {"large": (1411, 0)}, 13231: {"large": (729, 1094), "measured": 30, "fresh": 999},
        15409: {"large": (602, 1147), "measured": 31, "fresh": 1013}}


def _expected(t, what: str):
    got = HELD.get(None if t is None else len(t.pairs))
    assert got is not None, f"no expected counts for a rowwise-bias table of {len(t.pairs)} pairs"
    return got[what]


def test_every_recorded_no_algorithm_is_refused():
    """Every query of large.npz without an algorithm is refused as having none. Where the heuristic has one:
    answered inside the rowwise-bias table's plan (N and K up to 65536) when the profile ships the table,
    else refused as maybe-no-algorithm, never as no-algorithm. Inside the plan with N >= 8192 the table
    decides (no-algorithm); below N = 8192 the law does."""
    d = np.load(LARGE)
    combos = json.loads(str(d["combos"]))
    shapes, ids = d["shapes"].astype(int), d["ids"]
    t = _shipped_table()
    refused_none = answered_ok = refused_ok = decided = 0
    for j, c in enumerate(combos):
        if c["scale_mode"] != "rowwise" or not c["bias"]:
            continue
        for (M, N, K), cid in zip(shapes, ids[:, j]):
            got = _refusal(M, N, K, c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"], True)
            why, reason = got if got is not None else (None, None)
            planned = _held(t, M, N, K)
            if cid < 0:
                assert why is not None and "no algorithm" in why, ((M, N, K), c)
                refused_none += 1
                decided += reason == "no-algorithm"
                assert reason == "no-algorithm" or (N >= 8192 and not planned), ((M, N, K), c, reason)
            elif why is None:
                answered_ok += 1
            else:  # the heuristic has one: refused as maybe-no-algorithm, never as no-algorithm
                assert "no algorithm" in why and reason == "maybe-no-algorithm", ((M, N, K), c, why)
                assert not planned or not c["fast_accum"], ((M, N, K), c, "the table holds it")
                refused_ok += 1
    assert refused_none == 39695  # every query without an algorithm
    # with an algorithm, in the region, not held (with the complete table: N or K above 65536,
    # 105 + 94 + 98 + 100 + 101 + 104)
    beyond, held_none = _expected(t, "large")
    assert refused_ok == beyond and answered_ok == 144768 - 39695 - beyond
    # the region's shapes with N < 8192 in each of the 6 combinations, and those the table holds without an
    # algorithm (with the complete table 169 + 197 + 193 + 201 + 193 + 194)
    assert decided == 6 * 6192 + held_none


def test_below_the_n_law_the_region_has_no_algorithm():
    """none_below_n: the region's shapes with N < 8192 are refused as no-algorithm (torch raises); with
    N >= 8192 beyond any table's plan (here N above 65536) as maybe-no-algorithm; the law applies only with
    bias and fast accumulation, inside the region."""
    na = H200.data["modes"]["rowwise"]["split_k"]["no_algorithm"]
    assert na["none_below_n"] == 8192
    got = _refusal(2, 8176, 8192, "e4m3", "e4m3", "bfloat16", True, True)
    assert got[1] == "no-algorithm" and "none below N = 8192" in got[0] and "torch raises" in got[0]
    assert _refusal(1, 70144, 8192, "e4m3", "e4m3", "bfloat16", True, True)[1] == "maybe-no-algorithm"  # beyond
    assert _refusal(2, 8176, 4096, "e4m3", "e4m3", "bfloat16", True, True) is None  # K cannot split
    assert _refusal(2, 8176, 8192, "e4m3", "e4m3", "bfloat16", False, True) is None  # promoted
    assert _refusal(2, 8176, 8192, "e4m3", "e4m3", "bfloat16", True, False) is None  # no bias


@pytest.mark.parametrize("M, N, K, b, out", [(3, 5376, 104784, "e5m2", "float16"), (3, 7168, 18432, "e4m3", "float16"),
                                             (1, 4336, 5552, "e4m3", "bfloat16")])
def test_live_parity_refusals_are_refused(M, N, K, b, out):
    """Native torch._scaled_mm raised CUBLAS_STATUS_NOT_SUPPORTED for these on the H200."""
    assert "no algorithm" in _refused(M, N, K, "e4m3", b, out, True, True)
    assert _refused(M, N, K, "e4m3", b, out, False, True) is None  # promoted accumulation has one
    assert _refused(M, N, K, "e4m3", b, out, True, False) is None  # so has no bias


def test_with_bias_an_algorithm_is_the_one_without_bias_where_its_custom_option_is_not_0():
    """A law of the recorded answers (not used by the profile, which does not record the rowwise
    answers without bias): with rowwise scales, bias and fast accumulation the heuristic has an
    algorithm exactly where its answer without bias has CUSTOM_OPTION != 0, and then it is that
    answer (every field, workspace included). Where the split bound is <= 1 every answer without
    bias has custom option 1 or 3; inside the region most have 0."""
    d = np.load(LARGE)
    combos = json.loads(str(d["combos"]))
    ids, configs = d["ids"], d["configs"]
    custom = json.loads(str(d["meta"]))["fields"].index("custom_option")
    checked = with_algo = 0
    for j, c in enumerate(combos):
        if c["scale_mode"] != "rowwise" or not c["bias"] or not c["fast_accum"]:
            continue
        twin = [i for i, t in enumerate(combos) if t == {**c, "bias": False}]
        assert len(twin) == 1, c
        plain = ids[:, twin[0]]
        assert (plain >= 0).all()  # without bias there is always one
        has = ids[:, j] >= 0
        law = configs[plain, custom] != 0
        assert (has == law).all(), (c, int((has != law).sum()))
        assert (ids[has, j] == plain[has]).all(), c
        checked += len(has)
        with_algo += int(has.sum())
    assert checked == 6 * 12064 and with_algo == 6 * 12064 - 39695


def test_rowbias_sample_set_spans_the_refused_region():
    """splitk_measure's rowbias set (what a GPU run measures next): every pair can split at K = 65536, 48 of its
    64 pairs have N >= 8192 (where the measured answers with bias had an algorithm), every K of the complete
    record's grid, and the rowwise fast-accumulation combinations with and without bias."""
    from cpemu.recording import splitk_measure as sm
    from cpemu.splitk import split_bound

    bound = H200.data["modes"]["tensorwise"]["split_k"]["params"]["bound"]
    shapes = sm.rowbias_shapes(np.random.default_rng(21))
    pairs = list(dict.fromkeys((M, N) for M, N, _ in shapes))
    assert len(pairs) == 64 and sum(N >= 8192 for _, N in pairs) == 48
    assert all(split_bound(bound, M, N, 65536) >= 2 for M, N in pairs)
    assert len(shapes) == 64 * 3776 and sorted({K for *_, K in shapes}) == list(range(5136, 65537, 16))
    make, cset = sm.SETS["rowbias"]
    cs = sm.set_combos(cset)
    assert make is sm.rowbias_shapes and len(cs) == 15
    assert all(c["scale_mode"] == "rowwise" and c["fast_accum"] for c in cs)
    assert sum(c["bias"] for c in cs) == 6  # bf16 and fp16 outputs of three format pairs


def test_no_algorithm_report_on_the_recorded_sample():
    """The report that sizes a rowwise bias record, on large.npz: only N >= 8496 and M <= 13 have an
    algorithm, the custom-option law holds, the 6 combinations disagree on some shapes (all 6 must be
    recorded)."""
    from cpemu.recording.no_algorithm_report import report

    r = report(str(LARGE))
    assert r["region_shapes"] == 6851 and len(r["combos"]) == 6
    assert [c["with_algorithm"] for c in r["combos"].values()] == [262, 223, 231, 225, 234, 236]
    assert {c["n_min"] for c in r["combos"].values()} == {8496, 8544}
    assert {c["m_max"] for c in r["combos"].values()} == {13}
    assert all(c["custom_option_law"] == {"violations": 0, "other_answer": 0} for c in r["combos"].values())
    assert r["disagree"]["e4m3,e4m3,bfloat16 / e4m3,e4m3,float16"] == 39 and min(r["disagree"].values()) == 3


def test_no_algorithm_report_finds_what_breaks(tmp_path):
    """A made-up sample where the K law, the custom-option law and the answer break once each: the
    report counts each (it can fail)."""
    from cpemu.recording.no_algorithm_report import report

    c = {"a_dtype": "e4m3", "b_dtype": "e4m3", "out_dtype": "bfloat16", "fast_accum": True, "scale_mode": "rowwise"}
    combos = [dict(c, bias=False), dict(c, bias=True)]
    # fields: custom_option is column 1; config 0 has custom option 0, configs 1 and 2 have 1
    configs = np.array([[66, 0], [66, 1], [67, 1]], np.int32)
    shapes = np.array([[1, 8192, 5136], [1, 8192, 5168],  # one K-law group (block 40, class 16)
                       [1, 8192, 6160],                    # custom option 1, but no algorithm
                       [2, 9000, 5136],                    # an algorithm, another answer than without bias
                       [1, 8192, 4096]], np.int32)         # outside the region (K cannot split)
    ids = np.array([[1, 1], [1, -1], [1, -1], [1, 2], [0, -1]], np.int32)
    path = tmp_path / "s.npz"
    np.savez(path, shapes=shapes, ids=ids, configs=configs, combos=json.dumps(combos),
             meta=json.dumps({"fields": ["algo_id", "custom_option"]}))
    r = report(str(path))["combos"]["e4m3,e4m3,bfloat16"]
    assert r["shapes"] == 4 and r["with_algorithm"] == 2 and r["n_min"] == 8192 and r["m_max"] == 2
    assert r["k_law"] == {"groups": 1, "broken": 1}
    assert r["custom_option_law"] == {"violations": 2, "other_answer": 1}


ROWBIAS = LARGE.parent / "rowbias.npz"


def _rowbias():
    d = np.load(ROWBIAS)
    combos = json.loads(str(d["combos"]))
    bias = [j for j, c in enumerate(combos) if c["bias"]]
    twin = [combos.index({**combos[j], "bias": False}) for j in bias]
    return d, combos, bias, twin


def test_rowbias_record_spans_the_region_at_every_k():
    """rowbias.npz (H200, splitk_measure --sets rowbias): 64 (M, N) pairs of the region, 16 of them with
    N < 8192, at every K of the complete grid, the 6 combinations with bias and their 9 without."""
    d, combos, bias, _ = _rowbias()
    shapes = d["shapes"].astype(int)
    pairs = {(M, N) for M, N, _ in shapes.tolist()}
    assert len(pairs) == 64 and sum(N < 8192 for _, N in pairs) == 16
    assert len(shapes) == 64 * 3776 and set(shapes[:, 2].tolist()) == set(range(5136, 65536 + 1, 16))
    assert len(bias) == 6 and len(combos) == 15
    assert all(c["scale_mode"] == "rowwise" and c["fast_accum"] for c in combos)


def test_rowbias_record_below_8192_has_no_algorithm_at_any_k():
    """The N law (no_algorithm.none_below_n) at every K: none of the 16 pairs with N < 8192 has an
    algorithm with bias, in any combination; the smallest N with one is 8464 here."""
    d, _, bias, _ = _rowbias()
    N = d["shapes"][:, 1].astype(int)
    has = d["ids"][:, bias] >= 0
    assert not has[N < 8192].any() and (N < 8192).sum() == 16 * 3776
    assert int(N[has.any(axis=1)].min()) == 8464 and int(has.sum()) == 514330


def test_rowbias_record_keeps_the_k_law_and_the_custom_option_law():
    """Every K of one 128-wide block with the same alignment class has one answer per combination (the K
    law the rowwise-bias record uses); with bias there is an algorithm exactly where the answer without
    bias has CUSTOM_OPTION != 0, and it is that answer."""
    d, combos, bias, twin = _rowbias()
    shapes, ids, configs = d["shapes"].astype(int), d["ids"], d["configs"]
    M, N, K = shapes.T
    key = (M * 65537 + N) * 1024 + -(-K // 128)
    key = key * 128 + np.minimum(K & -K, 64)
    order = np.argsort(key, kind="stable")
    first = np.r_[True, key[order][1:] != key[order][:-1]]
    group = np.cumsum(first) - 1
    lead = order[first][group]  # each shape's group's first shape
    assert first.sum() == 64 * 1416
    assert (ids[order] == ids[lead]).all()
    custom = json.loads(str(d["meta"]))["fields"].index("custom_option")
    for j, t in zip(bias, twin):
        plain = ids[:, t]
        assert (plain >= 0).all()
        has = ids[:, j] >= 0
        assert (has == (configs[plain, custom] != 0)).all(), combos[j]
        assert (ids[has, j] == plain[has]).all(), combos[j]


def test_rowbias_record_against_the_profile():
    """cpemu on every 61st recorded shape of each combination with bias: no algorithm where N < 8192 is
    refused as no-algorithm. With N >= 8192: where the profile ships a rowwise-bias table
    (no_algorithm.complete_file), each shape of its plan is decided as the H200 answered (refused as
    no-algorithm where it has none, answered where it has one) and the rest refused as maybe-no-algorithm;
    without one, every such shape is refused as maybe-no-algorithm, never answered."""
    d, combos, bias, _ = _rowbias()
    t = _shipped_table()
    seen = {"no-algorithm": 0, "maybe-no-algorithm": 0, "answered": 0}
    for j in bias:
        c = combos[j]
        for (M, N, K), cid in zip(d["shapes"][::61].astype(int).tolist(), d["ids"][::61, j]):
            got = _refusal(M, N, K, c["a_dtype"], c["b_dtype"], c["out_dtype"], True, True)
            got = "answered" if got is None else got[1]
            if N < 8192:
                want = "no-algorithm"
            elif _held(t, M, N, K):
                want = "no-algorithm" if cid < 0 else "answered"
            else:
                want = "maybe-no-algorithm"
            assert got == want and (cid < 0 or N >= 8192), ((M, N, K), c, got)
            seen[want] += 1
    assert seen["no-algorithm"] > 1000 and seen["maybe-no-algorithm" if t is None else "answered"] > 1000


def _rowbias_table():
    t = _shipped_table()
    if t is None:
        pytest.skip("the profile ships no rowwise-bias table (no_algorithm.complete_file)")
    return t


def _refused_as_unheld(M, N, K, key):
    """A pair the table does not hold yet: cpemu refuses its calls as maybe-no-algorithm (never answers)."""
    a, b, out, _ = key.split(",")
    got = _refusal(M, N, K, a, b, out, True, True)
    assert got is not None and got[1] == "maybe-no-algorithm", ((M, N, K), key, got)


def _table_answers(t, M, N, key):
    """The table's answers for (M, N) at every K of its grid, as configuration rows (None: no algorithm),
    or None where the pair is not in it."""
    p = t.pair_index(M, N)
    if p is None:
        return None
    col = t.column(p, t.combo[key])
    return [None if c == NONE else [int(v) for v in t.configs[c]] for c in col.tolist()]


def test_rowbias_table_is_every_h200_answer_of_the_measured_pairs():
    """The shipped rowwise-bias table against rowbias.npz (the H200's own answers, asked by splitk_measure in
    fresh processes): every pair of its plan (8192 <= N <= 65536: 31 of the 48 with N >= 8192), every K, each of
    the 6 combinations, every field."""
    t = _rowbias_table()
    d, combos, bias, _ = _rowbias()
    fields = t.meta["fields"]
    shapes, ids = d["shapes"].astype(int), d["ids"]
    cols = [json.loads(str(d["meta"]))["fields"].index(f) for f in fields]
    configs = d["configs"][:, cols].tolist()
    ks = list(range(t.meta["k0"], t.meta["k0"] + t.meta["k_step"] * t.meta["nk"], t.meta["k_step"]))
    checked = differ = held = 0
    for M, N in sorted({(M, N) for M, N, _ in shapes.tolist() if 8192 <= N <= t.meta["n_max"]}):
        rows = np.flatnonzero((shapes[:, 0] == M) & (shapes[:, 1] == N))
        assert shapes[rows, 2].tolist() == ks, (M, N)
        held += t.pair_index(M, N) is not None
        for j in bias:
            c = combos[j]
            key = combo_key(c["a_dtype"], c["b_dtype"], c["out_dtype"], True)
            got = _table_answers(t, M, N, key)
            if got is None:
                for K in (ks[0], ks[len(ks) // 2], ks[-1]):
                    _refused_as_unheld(M, N, K, key)
                continue
            want = [None if i < 0 else configs[i] for i in ids[rows, j].tolist()]
            bad = [k for k, g, w in zip(ks, got, want) if g != w]
            differ += len(bad)
            assert not bad, f"(M={M}, N={N}) {c}: {len(bad)} K differ, first K={bad[0]}"
            checked += len(ks)
    assert held == _expected(t, "measured") and checked == held * 6 * 3776 and differ == 0


def test_rowbias_table_is_the_fresh_repeat(tmp_path):
    """The shipped rowwise-bias table against fresh.txz (1,013 pairs asked on a fresh host by splitk_enum, the
    widths of the measured pairs first): every answer of every pair."""
    import tarfile
    from cpemu.recording import splitk_enum as se
    t = _rowbias_table()
    with tarfile.open(LARGE.parent.parent / "rowbias" / "fresh.txz") as f:
        f.extractall(tmp_path, filter="data")
    plan = se.default_plan(n_min=8192, options="rowwise-bias")
    keys = [combo_key(c["a_dtype"], c["b_dtype"], c["out_dtype"], True) for c in plan["combos"]]
    fields = t.meta["fields"]
    pairs = held = 0
    for part in sorted((tmp_path / "fresh").glob("part-*.jsonl")):
        local, done = se.read_part(str(part), plan)
        for (M, N), runs in done.items():
            pairs += 1
            if t.pair_index(M, N) is None:
                _refused_as_unheld(M, N, 65536, keys[0])
                continue
            held += 1
            for jc, r in enumerate(runs):
                want = [None if i < 0 else [int(local[i][se.CONFIG_FIELDS.index(f)]) for f in fields]
                        for i in expand_runs(r).tolist()]
                assert _table_answers(t, M, N, keys[jc]) == want, ((M, N), keys[jc])
    assert pairs == 1013 and held == _expected(t, "fresh")
