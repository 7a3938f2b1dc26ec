"""The hopper-h200-torch split-K rule against cuBLASLt's own answers recorded on the H200.

tests/data/h200-splitk holds the heuristic's top-1 answers (tools/splitk_table.py and
tools/cublaslt_heuristic.py, configured as torch 2.11 configures cuBLASLt): a grid, held-out
random shapes, and the point table's sources. The laws (the split bound, no split where it
is <= 1, rowwise never splits) are checked on them here; tests/test_splitk_complete.py checks
the dense samples and the complete record.
"""

import glob
import os
from collections import Counter

import pytest

import cpemu
from cpemu.schedule import UnsupportedShape
from cpemu.splitk import split_bound

from cpemu.recording.splitk_rule import rows_of
from splitk_fixtures import UNRECORDED, partial_profile

DATA = os.path.join(os.path.dirname(__file__), "data", "h200-splitk")
FILES = sorted(glob.glob(os.path.join(DATA, "*.json.gz")))
PROFILE = cpemu.get_profile("hopper-h200-torch")


def _answer(c, M, N, K):
    scaling = c["scale_mode"]
    return PROFILE.plan(M, N, K, c["fast_accum"], scaling, c["a_dtype"], c["b_dtype"], c["out_dtype"]).splits


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(f) for f in FILES])
def test_profile_agrees_with_recorded_heuristic(path):
    counts = Counter()
    bad = []
    for c, M, N, K, ch in rows_of(path):
        if ch == "x":  # cuBLASLt has no algorithm: torch raises; nothing to compare
            counts["no-algorithm"] += 1
            continue
        try:
            got = _answer(c, M, N, K)
        except UnsupportedShape:
            counts["refused"] += 1
            continue
        counts["agree" if got == int(ch, 36) else "disagree"] += 1
        if got != int(ch, 36) and len(bad) < 5:
            bad.append((c, M, N, K, ch, got))
    assert not bad, bad
    assert counts["agree"] > 0
    assert counts["refused"] == 0, counts  # every recorded shape is answered


def test_held_out_predicates():
    """Outside the tables, the laws answer 1 (bound <= 1, or rowwise): never wrong on held-out shapes."""
    bound = PROFILE.data["modes"]["tensorwise"]["split_k"]["params"]["bound"]
    checked = 0
    for path in FILES:
        if "heldout" not in path:
            continue
        for c, M, N, K, ch in rows_of(path):
            if c["scale_mode"] == "rowwise" or split_bound(bound, M, N, K) <= 1:
                assert ch in "1x", (c, M, N, K, ch)
                checked += 1
    assert checked > 100000


def test_unrecorded_split_region_is_refused():
    with pytest.raises(UnsupportedShape, match="not in the profile's recorded table"):
        partial_profile().plan(*UNRECORDED, True)  # a pair of the plan that its table does not hold
    assert PROFILE.plan(*UNRECORDED, True).splits == 2  # the shipped table holds every pair of its plan
    with pytest.raises(UnsupportedShape, match="outside the range"):
        PROFILE.plan(16, 64, 131088, True)
    assert PROFILE.plan(16, 24576, 8192, True).splits == 1  # Evo 2 40B projection


def test_rule_derivation_reproduces_the_profile(tmp_path):
    """Checking the laws again on the committed answers finds no violation, and the point table it
    writes is the shipped one, shape for shape and character for character."""
    import json
    from importlib import resources

    from cpemu.recording.splitk_rule import build

    grid = os.path.join(DATA, "splitk_grid.json.gz")
    out = tmp_path / "t.splitk.json"
    params = PROFILE.data["modes"]["tensorwise"]["split_k"]["params"]
    report = build([grid], [f for f in FILES if f != grid], str(out), bound=params["bound"], echo=lambda *_: None)
    assert all(not c["violations"] for c in report["checks"].values())
    assert sum(c["support"].get("no-split", 0) for c in report["checks"].values()) > 700000
    new = json.loads(out.read_text())
    ship = json.loads(resources.files("cpemu.profile_data").joinpath(params["table_file"]).read_text())
    assert new["shapes"] == ship["shapes"] and new["tables"] == ship["tables"]
    assert len(new["shapes"]) > 20000


def test_rule_derivation_refuses_a_violated_law(tmp_path):
    """A recorded split above the bound is an error, not a table entry."""
    import gzip
    import json

    c = dict(a_dtype="e4m3", b_dtype="e4m3", out_dtype="bfloat16", fast_accum=True, bias=False,
             scale_mode="tensorwise")
    doc = {"combos": [c], "shapes": [[4096, 4096, 8192], [1, 64, 8192]], "splits": ["21"]}
    path = tmp_path / "bad.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    from cpemu.recording.splitk_rule import build

    with pytest.raises(ValueError, match="law violated.*'bound': 1, 'no-split': 1"):
        build([str(path)], [], str(tmp_path / "t.json"), echo=lambda *_: None)
