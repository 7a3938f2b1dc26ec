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
    the H200 (tools/splitk_output_check.py's record, the same operand generator) where the profile
    reproduced them, and not for tile 16x64 at 17 slices, where it did not."""
    doc = json.load(open(OUTPUTS))
    seen = {True: 0, False: 0}
    for i in (4, 5, 6, 7, 32, 33, 84, 85, 86, 87, 88, 89):
        r = doc["rows"][i]
        case = {"M": r["M"], "N": r["N"], "K": r["K"], "splits": r["splits"], "seed": doc["seed"] + i // 4,
                "combo": f"e4m3,e4m3,{r['out_dtype']},{'fast' if r['fast_accum'] else 'promo'}"}
        got = hashlib.sha256(st.emulate(case, "profile").tobytes()).hexdigest()
        assert (got == r["sha256"]) == r["match"], (i, r)
        seen[r["match"]] += 1
    assert seen == {True: 8, False: 4}


def test_cases_are_unverified_configurations_of_the_table():
    import cpemu
    from cpemu.splitk_complete import load_complete

    par = cpemu.get_profile().data["modes"]["tensorwise"]["split_k"]["params"]
    table = load_complete(par["complete_file"])
    cases = st.make_cases(per=1)
    assert len(cases) == len({(c["tile"], c["splits"], c["reduction"]) for c in cases}) == len(set(st.unverified_configs()[1].values())) > 5
    f = table.meta["fields"]
    ks = table.meta["k0"] + table.meta["k_step"] * np.arange(table.meta["nk"])
    for c in cases[::7]:
        v = par["verified_splits"].get(str(c["tile"]), 1)
        assert c["splits"] not in v if isinstance(v, list) else c["splits"] > v
        p = int(np.searchsorted(table.pairs, (c["M"] << 20) | c["N"]))
        cfg = table.configs[table.column(p, table.combo[c["combo"]])[int(np.searchsorted(ks, c["K"]))]]
        assert (cfg[f.index("tile_id")], cfg[f.index("splitk_num")]) == (c["tile"], c["splits"])


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


def _verdict():
    with open(os.path.join(TILES, "verdict.json")) as f:
        return json.load(f)


def test_verified_splits_are_the_verdicts():
    """The profile's verified_splits are the earlier ones plus every (tile, split count) whose H200
    calls all matched the profile's slicing; no count that failed on the H200 is verified."""
    import cpemu

    doc = _verdict()
    par = cpemu.get_profile().data["modes"]["tensorwise"]["split_k"]["params"]
    assert doc["cases"] == 299 and doc["matched"] == 282
    assert st.proposed_verified(BEFORE_VERDICT, doc["rows"]) == par["verified_splits"]
    failed = {(r["tile"], r["splits"]) for r in doc["rows"] if not r["match"]["profile"]}
    assert {t for t, _ in failed} == {47, 393, 448}
    for tile, s in failed:
        v = par["verified_splits"][str(tile)]
        assert s not in v if isinstance(v, list) else s > v


def test_proposed_verified():
    rows = [{"tile": 7, "splits": s, "match": {"profile": ok}} for s, ok in ((2, True), (3, True), (5, True), (6, False))]
    assert st.proposed_verified({}, rows) == {"7": [2, 3, 5]}
    assert st.proposed_verified({"7": 4}, rows) == {"7": 5}
    assert st.proposed_verified({"7": [3], "8": 9}, rows[:2]) == {"7": 3, "8": 9}
    with pytest.raises(ValueError, match="tile 7: split counts \\[6\\] failed but are verified already"):
        st.proposed_verified({"7": 6}, rows)


def test_verdict_rows_against_the_reference():
    """Re-judged here: the reference under the profile's slicing gives the recorded H200 bytes
    (sha256) for a cheap call of each tile that matched, and not for the failures, whose H200
    bytes are kept (native-failing.npz)."""
    doc = _verdict()
    failing = np.load(os.path.join(TILES, "native-failing.npz"))
    cheapest = {}
    for i, r in enumerate(doc["rows"]):
        key = (r["tile"], r["match"]["profile"])
        if r["macs"] <= 1e8 and (key not in cheapest or r["macs"] < doc["rows"][cheapest[key]]["macs"]):
            cheapest[key] = i
    assert len(cheapest) == 8 and {k for k in cheapest if not k[1]} == {(47, False), (393, False), (448, False)}
    for i in cheapest.values():
        r = doc["rows"][i]
        got = st.emulate(r, "profile")
        assert (hashlib.sha256(got.tobytes()).hexdigest() == r["sha256"]) == r["match"]["profile"], (i, r)
        if not r["match"]["profile"]:
            want = failing[f"c{i}"]
            assert hashlib.sha256(want.tobytes()).hexdigest() == r["sha256"]
            assert not np.array_equal(got, want)


def test_probes_show_the_profile_slicing_where_it_holds():
    """The H200's chain starts (probe): tile id 10 starts its slices where the profile does
    (25 and 4 slices), tile id 47 with 17 slices does not: 16 slices of 2688 and a last of 2704,
    where the profile's ceil(358 / 17) = 22 tiles would give 2816."""
    from cpemu.schedule import slices_for

    seen = {}
    for name in sorted(os.listdir(os.path.join(TILES, "probes"))):
        with open(os.path.join(TILES, "probes", name)) as f:
            p = json.load(f)
        h = p["heuristic"]
        want = [k0 for k0, _ in slices_for(p["K"], h["splitk_num"], 128)[1:]]
        seen[(h["tile_id"], h["splitk_num"])] = p["chain_starts"] == want
        if h["tile_id"] == 47:
            assert p["chain_starts"] == [2688 * j for j in range(1, 17)] and p["K"] - 16 * 2688 == 2704
    assert seen == {(10, 25): True, (10, 4): True, (47, 17): False, (10, 1): True}
