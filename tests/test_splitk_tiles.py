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
    assert len(cases) == len({(c["tile"], c["splits"], c["reduction"]) for c in cases}) > 50
    f = table.meta["fields"]
    ks = table.meta["k0"] + table.meta["k_step"] * np.arange(table.meta["nk"])
    for c in cases[::7]:
        assert c["splits"] > par["verified_splits"].get(str(c["tile"]), 1)
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
