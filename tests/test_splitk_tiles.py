"""tools/splitk_tiles.py: its slicings, its cases, and its emulation against recorded H200 outputs."""

import hashlib
import importlib.util
import json
import os

import numpy as np
import pytest

HERE = os.path.dirname(__file__)
_spec = importlib.util.spec_from_file_location("cpemu_tools_splitk_tiles", os.path.join(HERE, "..", "tools", "splitk_tiles.py"))
st = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(st)
from splitk_fixtures import checked_split, tail_cut  # noqa: E402

OUTPUTS = os.path.join(HERE, "data", "h200-splitk", "measured", "large_split_outputs.json")


@pytest.mark.parametrize("layout", ["ceil", "balanced", "balanced-last"])
def test_slicings_cover_k(layout):
    for K in (5136, 7168, 45712, 65536):
        for s in (2, 3, 7, 17, 25):
            for g in (64, 128, 256):
                sl = st.slices(K, s, g, layout)
                assert sl[0][0] == 0 and sl[-1][1] == K and all(a[1] == b[0] for a, b in zip(sl, sl[1:]))
                assert len(sl) <= s and all(k0 % g == 0 for k0, _ in sl)
    from cpemu.schedule import slices_for
    assert st.slices(45712, 17, 128, "ceil") == slices_for(45712, 17, 128)
    assert [b - a for a, b in st.slices(1280, 3, 128, "balanced")] == [512, 384, 384]
    assert [b - a for a, b in st.slices(1280, 3, 128, "balanced-last")] == [384, 384, 512]


def test_emulation_against_recorded_h200_outputs():
    """The tool's emulation under the profile's slicing gives the bytes torch._scaled_mm gave on
    the H200 (tools/splitk_output_check.py's record, the same operand generator). The record's
    four misses then (tile 16x64 with 17 slices at K = 45712, fast accumulation and promotion) are
    the profile's tail rule: its slicing without the rule still misses them."""
    doc = json.load(open(OUTPUTS))
    seen = {True: 0, False: 0}
    for i in (4, 5, 6, 7, 32, 33, 84, 85, 86, 87, 88, 89):
        r = doc["rows"][i]
        case = {"M": r["M"], "N": r["N"], "K": r["K"], "splits": r["splits"], "seed": doc["seed"] + i // 4,
                "combo": f"e4m3,e4m3,{r['out_dtype']},{'fast' if r['fast_accum'] else 'promo'}"}
        got = hashlib.sha256(st.emulate(case, "profile").tobytes()).hexdigest()
        assert got == r["sha256"], (i, r)
        ceil = hashlib.sha256(st.emulate(case, "ceil").tobytes()).hexdigest()
        assert (ceil == r["sha256"]) == r["match"], (i, r)
        seen[r["match"]] += 1
    assert seen == {True: 8, False: 4}


def test_covered_k():
    """The tail rule leaves K - 16 for K = 16 mod 32 from 17 slices on, where K - 16 is a whole
    number of 128-wide K tiles per slice, and all of K elsewhere; the slices of what is covered
    are exactly ``splits`` non-empty ranges there."""
    import cpemu
    from cpemu.schedule import covered_k, slices_for

    tail = cpemu.get_profile().split_rule("tensorwise").tail
    assert tail["min_splits"] == 17 and tail["align"] == 32
    cut = 0
    for s in range(2, 27):
        for K in range(16, 65536 + 1, 16):
            c = covered_k(K, s, 128, tail)
            rule = tail_cut(K, s)
            assert c == (K - 16 if rule else K), (K, s)
            if rule:
                cut += 1
                assert len(slices_for(c, s, 128)) == s
                assert slices_for(c, s, 128) != slices_for(K, s, 128)
    assert cut == sum(65536 // (128 * s) for s in range(17, 27))
    assert covered_k(43536, 17, 128, None) == 43536 and covered_k(43536, 16, 128, tail) == 43536


#: the rounds of tiles/ that ran (cases<n>.json, native<n>.npz, verdict<n>.json): 1 to 15 on the H200, 16 on
#: an H100 reporting the H200's attributes (tiles/README.md); none is planned (every configuration is verified)
ROUNDS_RUN = 16


def _cases(n):
    with open(os.path.join(HERE, "data", "h200-splitk", "tiles", f"cases{n}.json")) as f:
        return json.load(f)["cases"]


def test_every_configuration_of_the_table_is_verified_and_answered():
    """Every (tile, split count) of the shipped table is verified: the last ones came with record runs
    34 to 43 and were checked by rounds 12 to 16, so make_cases plans nothing more. The calls of those
    rounds are answered with the split count the H200's heuristic picked for them; without round 16's
    count in the profile (tile 48 with 2 slices) its calls are refused as unverified. The counts of 17 or more slices not seen cut are given
    by the table at no K the tail rule cuts."""
    import copy

    import cpemu
    from cpemu.profile import Profile
    from cpemu.schedule import UnsupportedShape

    table, bad = st.unverified_configs()
    assert bad == {} and st.make_cases(per=3) == []
    assert not os.path.exists(os.path.join(TILES, f"cases{ROUNDS_RUN + 1}.json"))
    unseen = set(st.tail_configs(table)[0].values())
    assert unseen == {(315, 19, 2), (393, 19, 2), (448, 17, 2), (448, 18, 2), (486, 17, 2), (537, 17, 2)}
    rounds = {12: {(14, 19, 2), (14, 20, 2), (14, 21, 2), (48, 10, 2), (48, 17, 2), (48, 18, 2), (48, 19, 2),
                   (48, 20, 2), (48, 21, 2)},
              13: {(48, 5, 2), (48, 6, 2)}, 14: {(48, 3, 2)}, 15: {(48, 4, 2)}, 16: {(48, 2, 2)}}
    assert max(rounds) == ROUNDS_RUN
    for n, want in rounds.items():
        cases = _cases(n)
        assert {(c["tile"], c["splits"], c["reduction"]) for c in cases} == want, n
        # the H200's heuristic, asked beside each native call, picked the case's configuration
        picked = json.loads(str(np.load(os.path.join(TILES, f"native{n}.npz"))["meta"]))["heuristic"]
        assert [(h["tile_id"], h["splitk_num"], h["reduction_scheme"]) for h in picked] == \
            [(c["tile"], c["splits"], c["reduction"]) for c in cases], n
        for c in cases:
            fa, fb, out, fast = c["combo"].split(",")
            assert cpemu.get_profile().call(c["M"], c["N"], c["K"], fa, fb, out,
                                            fast_accum=fast == "fast").plan.splits == c["splits"], c
    data = copy.deepcopy(cpemu.get_profile().data)
    v = data["modes"]["tensorwise"]["split_k"]["params"]["verified_splits"]
    v["48"] = [s for s in v["48"] if s != 2]
    before = Profile("before-round-16", data)
    for c in _cases(16):
        fa, fb, out, fast = c["combo"].split(",")
        with pytest.raises(UnsupportedShape) as e:
            before.call(c["M"], c["N"], c["K"], fa, fb, out, fast_accum=fast == "fast")
        assert e.value.reason == "unverified-split", c


def _round3_profile():
    """The profile as it stood before round 3: tail cuts seen for tiles 47, 393 (20) and 448 (22)
    only, and tile 448 not checked with 16 slices."""
    import copy

    import cpemu
    from cpemu.profile import Profile

    data = copy.deepcopy(cpemu.get_profile().data)
    sk = data["modes"]["tensorwise"]["split_k"]
    sk["tail"]["verified"] = {"47": list(range(17, 26)), "393": [20], "448": [22]}
    sk["params"]["verified_splits"]["448"] = [s for s in sk["params"]["verified_splits"]["448"] if s != 16]
    return Profile("before-round-3", data)


def test_cases_are_unverified_configurations_of_the_table():
    """Under the profile as it stood before round 3, the cases are one call of each configuration
    not checked yet, and of each tail cut not seen yet, each at a K where its configuration is the
    table's answer (and, for a tail case, where the rule cuts K)."""
    import cpemu
    from cpemu.schedule import covered_k
    from cpemu.splitk_complete import load_complete

    prof = _round3_profile()
    par = prof.data["modes"]["tensorwise"]["split_k"]["params"]
    table = load_complete(par["complete_file"])
    cases = st.make_cases(per=1, profile_name=prof)
    tails = set(st.tail_configs(table, prof)[0].values())
    keys = [(c["tile"], c["splits"], c["reduction"], c.get("tail", False)) for c in cases]
    assert len(keys) == len(set(keys))
    # rounds 4 to 16 (cases4.json to cases16.json) hold the configurations that came with later
    # record runs; those of the rounds that ran are verified in the profile now, those of the planned
    # round are not; the tail cuts of all of them are not in this profile
    later = [n for n in range(4, ROUNDS_RUN + 2)
             if n <= ROUNDS_RUN or os.path.exists(os.path.join(HERE, "data", "h200-splitk", "tiles", f"cases{n}.json"))]
    later_tail = {(c["tile"], c["splits"]) for n in later for c in _cases(n) if c.get("tail")}
    planned = {(c["tile"], c["splits"], c["reduction"]) for n in later if n > ROUNDS_RUN for c in _cases(n)
               if not c.get("tail")}
    assert {k[:3] for k in keys if not k[3]} == set(st.unverified_configs(prof)[1].values())
    assert set(st.unverified_configs(prof)[1].values()) == {(448, 16, 2)} | planned
    assert {k[:3] for k in keys if k[3]} <= tails
    assert {k[:2] for k in keys if k[3]} == ({(10, s) for s in range(17, 26)} | {(393, 17), (393, 18), (448, 19)}
                                             | later_tail)
    tail = prof.split_rule("tensorwise").tail
    f = table.meta["fields"]
    ks = table.meta["k0"] + table.meta["k_step"] * np.arange(table.meta["nk"])
    for c in cases:
        if c.get("tail"):
            assert covered_k(c["K"], c["splits"], 128, tail) != c["K"]
            assert c["splits"] not in tail["verified"].get(str(c["tile"]), [])
        else:
            assert not checked_split(par["verified_splits"], c["tile"], c["splits"])
        p = int(np.searchsorted(table.pairs, (c["M"] << 20) | c["N"]))
        cfg = table.configs[table.column(p, table.combo[c["combo"]])[int(np.searchsorted(ks, c["K"]))]]
        assert (cfg[f.index("tile_id")], cfg[f.index("splitk_num")]) == (c["tile"], c["splits"])
    assert cpemu.get_profile() is not prof


@pytest.mark.parametrize("K, s", [(45712, 17), (7168, 3)])
def test_probe_finds_the_slices_of_the_reference(K, s):
    """The probe's premise on the specification: run through cpemu's reference with a known
    slicing, its calls show exactly where each slice's chain starts."""
    import cpemu
    from cpemu import reference as ref
    from cpemu.formats import FP8_FORMATS
    from cpemu.schedule import Plan, slices_for

    prof = cpemu.get_profile()
    M, N = 1, 64
    plan = Plan(slices=slices_for(K, s, 128), promotion=None)
    starts = []
    for first in range(0, K // 16 - 1, N):
        a, bt = st.probe_operands(M, N, K, first)
        acc = ref.accumulate(ref.Codes(a, FP8_FORMATS["e4m3"]), ref.Codes(bt, FP8_FORMATS["e4m3"]), plan, prof.instruction)
        starts += st.read_probe(acc[0], first, K)
    assert starts == [k0 for k0, _ in plan.slices[1:]] and len(starts) == len(plan.slices) - 1
    with pytest.raises(ValueError, match="neither one chain nor two"):
        st.read_probe(np.array([256.5], np.float32), 0, K)


TILES = os.path.join(HERE, "data", "h200-splitk", "tiles")
#: verified_splits before the tiles verdict (the truth suites and tools/splitk_output_check.py)
BEFORE_VERDICT = {"10": 25, "12": 4, "13": 6, "47": 6, "312": 6, "315": 5, "393": 7, "394": 3, "448": 2}


def _verdict(name="verdict.json"):
    with open(os.path.join(TILES, name)) as f:
        return json.load(f)


def test_verified_splits_are_the_verdicts():
    """The profile's verified_splits are the earlier ones plus every (tile, split count) whose H200
    calls all matched the profile's slicing: the first verdict judged again under the tail rule
    (its 17 misses, and only they, judged again) and the second to sixteenth verdicts; no count fails."""
    import cpemu

    first, now = _verdict(), _verdict("verdict-tail.json")
    par = cpemu.get_profile().data["modes"]["tensorwise"]["split_k"]["params"]
    assert first["cases"] == 299 and first["matched"] == 282
    assert now["cases"] == 299 and now["matched"] == 299 and now["rejudged"] == 17
    assert [r["sha256"] for r in now["rows"]] == [r["sha256"] for r in first["rows"]]
    assert {i for i, r in enumerate(now["rows"]) if r.get("rejudged")} == \
        {i for i, r in enumerate(first["rows"]) if not r["match"]["profile"]}
    rows = now["rows"]
    # the calls of each later round, every one of which matched
    calls = {2: 29, 3: 37, 4: 101, 5: 144, 6: 251, 7: 99, 8: 9, 9: 13, 10: 4, 11: 14, 12: 51, 13: 6, 14: 3, 15: 3, 16: 3}
    assert sorted(calls) == list(range(2, ROUNDS_RUN + 1))
    for n, c in calls.items():
        doc = _verdict(f"verdict{n}.json")
        assert doc["cases"] == c and doc["matched"] == c, n
        rows = rows + doc["rows"]
    assert st.proposed_verified(BEFORE_VERDICT, rows) == par["verified_splits"]
    assert par["verified_splits"]["47"] == 25 and {16, 22} <= set(par["verified_splits"]["448"])


def test_tail_cuts_seen_are_the_verdicts():
    """The profile's ``split_k.tail.verified`` is exactly the (tile, count) of the verdicts' calls
    whose K the tail rule cuts, all of which matched; in rounds 3 to 15 every tail call also told the
    cut from the sum over all of K (the ceil slicing of K did not give the H200's bytes)."""
    import cpemu

    seen = {}
    tail_calls = 0
    for name in ["verdict-tail.json"] + [f"verdict{n}.json" for n in range(2, ROUNDS_RUN + 1)]:
        for r in _verdict(name)["rows"]:
            if tail_cut(r["K"], r["splits"]):
                assert r["match"]["profile"], (name, r)
                seen.setdefault(str(r["tile"]), set()).add(r["splits"])
                if name == "verdict3.json":
                    assert r["tail"], r
            if r.get("tail"):
                assert tail_cut(r["K"], r["splits"]) and r["match"]["ceil"] is False, r
                tail_calls += 1
    assert tail_calls == 36 + 18 + 36 + 69 + 20 + 3 + 2 + 7 + 24
    verified = cpemu.get_profile().split_rule("tensorwise").tail["verified"]
    assert {t: sorted(v) for t, v in seen.items()} == verified
    assert verified == {"10": list(range(17, 26)), "12": list(range(17, 26)), "13": list(range(17, 26)),
                        "14": [19, 20, 21], "47": list(range(17, 26)), "48": [17, 18, 19, 20, 21, 24, 25], "92": [17, 19, 20, 21, 22], "312": list(range(17, 26)),
                        "313": list(range(17, 26)), "314": list(range(17, 24)), "315": [17, 18, 20, 21, 22, 23], "393": [17, 18, 20],
                        "394": [18, 20], "448": [19, 22]}


def test_proposed_verified():
    rows = [{"tile": 7, "splits": s, "match": {"profile": ok}} for s, ok in ((2, True), (3, True), (5, True), (6, False))]
    assert st.proposed_verified({}, rows) == {"7": [2, 3, 5]}
    assert st.proposed_verified({"7": 4}, rows) == {"7": 5}
    assert st.proposed_verified({"7": [3], "8": 9}, rows[:2]) == {"7": 3, "8": 9}
    with pytest.raises(ValueError, match="tile 7: split counts \\[6\\] failed but are verified already"):
        st.proposed_verified({"7": 6}, rows)


def test_verdict_rows_against_the_reference():
    """Judged here again: the reference under the profile's slicing gives the recorded H200 bytes
    (sha256) for a cheap call of each tile, and the kept bytes of the first verdict's misses (tiles
    47, 393 and 448 with 17 or more slices: native-failing.npz) and of later verdicts (native2.npz
    to native15.npz), which the slicing without the tail rule does not give where the rule cuts K."""
    first = _verdict("verdict-tail.json")
    failing = np.load(os.path.join(TILES, "native-failing.npz"))
    cheapest = {}
    for i, r in enumerate(first["rows"]):
        key = (r["tile"], bool(r.get("rejudged")))
        if r["macs"] <= 1e8 and (key not in cheapest or r["macs"] < first["rows"][cheapest[key]]["macs"]):
            cheapest[key] = i
    assert len(cheapest) == 8 and {k for k in cheapest if k[1]} == {(47, True), (393, True), (448, True)}
    for i in cheapest.values():
        r = first["rows"][i]
        got = st.emulate(r, "profile")
        assert hashlib.sha256(got.tobytes()).hexdigest() == r["sha256"], (i, r)
        if r.get("rejudged"):
            want = failing[f"c{i}"]
            assert hashlib.sha256(want.tobytes()).hexdigest() == r["sha256"] and np.array_equal(got, want)
            assert not np.array_equal(st.emulate(r, "ceil"), want)
    # per later round, rows judged again: {row: whether the tail rule cuts its K}; where it cuts, the
    # slicing of all of K must not give the H200's bytes, and where it does not, it must
    later = {2: {0: True, 4: True, 23: True},  # tile 47 with 17 and 18 slices, 448 with 22
             3: {0: True, 24: True, 30: True, 34: True},  # tile 10 with 17 and 25 slices, 393 with 18, 448 with 19
             4: {49: True, 76: False},  # tile 312 with 21 slices where the tail rule cuts K, 394 with 14
             5: {21: True, 24: True, 84: True},  # tile 312 with 19 and 24 slices, 313 with 19
             6: {0: False, 39: True, 99: True},  # tile 12 with 5 slices; 12 and 13 with 17
             7: {0: False, 39: True, 42: True},  # tile 92 with 2 slices; 313 with 24 and 25
             8: {1: False, 4: True},  # tile 92 with 17 slices where the rule does not cut K and where it does
             9: {8: True, 9: False},  # tile 92 with 19 slices where the rule cuts K; 92 with 21 where it does not
             10: {0: False},  # tile 15 with 10 slices
             11: {3: True, 12: False, 13: True},  # tile 48 with 24 slices (cut), 315 with 19 (not) and 22 (cut)
             12: {24: True, 18: False},  # tile 48 with 17 slices (cut) and with 10 (not)
             13: {0: False}}  # tile 48 with 5 slices
    for n, rows in later.items():
        doc = _verdict(f"verdict{n}.json")
        native = np.load(os.path.join(TILES, f"native{n}.npz"))
        for i, cut in rows.items():
            r = doc["rows"][i]
            want = native[f"c{i}"]
            assert tail_cut(r["K"], r["splits"]) == cut and hashlib.sha256(want.tobytes()).hexdigest() == r["sha256"]
            assert np.array_equal(st.emulate(r, "profile"), want), (n, i)
            assert np.array_equal(st.emulate(r, "ceil"), want) == (not cut), (n, i)


def test_verdict_with_the_cpu_fp32_step():
    """A verdict summed by cpu-fp32's step (``verdict --step cpu-fp32``) judges as the reference's:
    round 5's cheapest tail call and a split call, against their H200 bytes, every slicing."""
    fifth = _verdict("verdict5.json")
    native5 = np.load(os.path.join(TILES, "native5.npz"))
    picks = (21, 24)  # tile 312 with 19 slices (a tail call) and 24
    cases = [{k: v for k, v in fifth["rows"][i].items() if k not in ("match", "layout", "sha256")} for i in picks]
    native = {f"c{j}": native5[f"c{i}"] for j, i in enumerate(picks)}
    doc = st.verdict(cases, native, step="cpu-fp32")
    assert [r["match"] for r in doc["rows"]] == [fifth["rows"][i]["match"] for i in picks]
    assert doc["matched"] == 2 and doc["rows"][0]["match"]["ceil"] is False
    with pytest.raises(KeyError):
        st.emulate(cases[0], "profile", step="float64")


def test_probes_show_the_profile_slicing():
    """The H200's chain starts (probe) are where the profile's slices start: tile id 10 with 1, 4,
    7 and 25 slices, and tile ids 10 and 47 with 17, 18 and 25 slices, whose slices the tail rule makes
    2560 or 2688 elements long where the ceil slicing would give 2688 or 2816."""
    from cpemu.schedule import slices_for

    seen = {}
    for name in sorted(os.listdir(os.path.join(TILES, "probes"))):
        with open(os.path.join(TILES, "probes", name)) as f:
            p = json.load(f)
        h = p["heuristic"]
        want = [k0 for k0, _ in st.profile_slices(p["K"], h["splitk_num"])[1:]]
        ceil = [k0 for k0, _ in slices_for(p["K"], h["splitk_num"], 128)[1:]]
        seen[(h["tile_id"], h["splitk_num"], p["K"])] = (p["chain_starts"] == want, want == ceil)
    assert seen == {(10, 1, 8864): (True, True), (10, 4, 35856): (True, True), (10, 7, 56336): (True, True),
                    (10, 25, 65536): (True, True), (10, 17, 43536): (True, False), (47, 17, 45712): (True, False), (47, 17, 43536): (True, False),
                    (47, 18, 46096): (True, False), (47, 25, 64016): (True, False)}


def test_tail_rule_refuses_unseen_cuts():
    """A split answer whose K the tail rule cuts is given only where the cut was seen for its tile
    and count; a profile recorded with ``cpemu record`` has seen none, so it refuses every such K
    and still answers the K the rule leaves whole."""
    from cpemu.recording.record import _set_split_k
    from cpemu.schedule import UnsupportedShape
    from cpemu.splitk import _verified

    data = {"modes": {"tensorwise": {}}}
    _set_split_k(data, {"bound": {}}, [])
    tail = data["modes"]["tensorwise"]["split_k"]["tail"]
    assert tail["verified"] == {} and tail["min_splits"] == 17
    cfg = {"splitk_num": 17, "tile_id": 10}
    with pytest.raises(UnsupportedShape, match="last 16 elements of such a K out") as e:
        _verified({}, cfg, 1, 16, 43536, "e4m3,e4m3,bfloat16,fast", tail)
    assert e.value.reason == "unverified-split"
    assert _verified({}, cfg, 1, 16, 43552, "e4m3,e4m3,bfloat16,fast", tail) == 17
    assert _verified({}, cfg, 1, 16, 43536, "e4m3,e4m3,bfloat16,fast", dict(tail, verified={"10": [17]})) == 17


@pytest.mark.parametrize("split_k", [None, 17])
def test_gemm_gives_the_h200_bytes_where_the_tail_is_cut(split_k):
    """Through the public API: cpemu.gemm at (1, 48, 43536), where the H200 uses 17 slices and
    leaves the last 16 elements of K out, gives the H200's bytes (round 2's native output), from
    the table's answer and from the caller's split_k=17 alike."""
    import ml_dtypes

    import cpemu

    second = _verdict("verdict2.json")
    r = second["rows"][0]
    assert (r["M"], r["N"], r["K"], r["splits"], r["combo"]) == (1, 48, 43536, 17, "e4m3,e4m3,bfloat16,fast")
    a, bt = st.operands(r)
    y = cpemu.gemm(a.view(ml_dtypes.float8_e4m3fn), bt.view(ml_dtypes.float8_e4m3fn).T, out_dtype="bfloat16",
                   fast_accum=True, backend="reference", split_k=split_k)
    want = np.load(os.path.join(TILES, "native2.npz"))["c0"]
    assert np.array_equal(np.ascontiguousarray(y).view(np.uint8).reshape(-1), want)
