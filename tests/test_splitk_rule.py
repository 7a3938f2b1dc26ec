"""The hopper-h200-torch split-K rule against cuBLASLt's own answers recorded on the H200.

tests/data/h200-splitk holds the heuristic's top-1 answers (tools/splitk_table.py and
tools/cublaslt_heuristic.py, configured as torch 2.11 configures cuBLASLt): a grid the
rule's thresholds were derived from, and held-out random shapes that were not used to
derive them.
"""

import glob
import os
from collections import Counter

import pytest

import cpemu
from cpemu.schedule import UnsupportedShape

from cpemu.recording.splitk_rule import rows_of

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
    """Outside the table, the rule answers 1 by its thresholds: never wrong on held-out shapes."""
    params = PROFILE.data["modes"]["tensorwise"]["split_k"]["params"]
    checked = 0
    for path in FILES:
        if "heldout" not in path:
            continue
        for c, M, N, K, ch in rows_of(path):
            if c["scale_mode"] == "rowwise" or K <= params["k_max_nosplit"] or M * N >= params["mn_min_nosplit"]:
                assert ch in "1x", (c, M, N, K, ch)
                checked += 1
    assert checked > 100000


def test_unrecorded_split_region_is_refused():
    with pytest.raises(UnsupportedShape, match="not in the profile's recorded table"):
        PROFILE.plan(3, 48, 9008, True)
    with pytest.raises(UnsupportedShape, match="outside the range"):
        PROFILE.plan(16, 64, 16400, True)
    assert PROFILE.plan(16, 24576, 8192, True).splits == 1  # Evo 2 40B projection


def test_rule_derivation_reproduces_the_profile(tmp_path):
    """Deriving the rule again from the recorded grid gives the profile's thresholds, and the
    table it writes agrees with the shipped table wherever both have an answer."""
    import json

    from cpemu.recording.splitk_rule import build

    grid = os.path.join(DATA, "splitk_grid.json.gz")
    held = [f for f in FILES if "heldout" in f]
    out = tmp_path / "t.splitk.json"
    report = build([grid], held, None, str(out), echo=lambda *_: None)
    params = PROFILE.data["modes"]["tensorwise"]["split_k"]["params"]
    assert (report["k_max_nosplit"], report["mn_min_nosplit"]) == (params["k_max_nosplit"], params["mn_min_nosplit"])
    assert all(not c["violations"] for c in report["checks"].values())
    new = json.loads(out.read_text())
    from importlib import resources

    ship = json.loads(resources.files("cpemu.profile_data").joinpath(params["table_file"]).read_text())
    idx = {tuple(s): i for i, s in enumerate(ship["shapes"])}
    agree = 0
    for key, row in new["tables"].items():
        for s, ch in zip(new["shapes"], row):
            j = idx.get(tuple(s))
            if ch != "?" and j is not None and ship["tables"][key][j] != "?":
                assert ship["tables"][key][j] == ch, (key, s)
                agree += 1
    assert agree > 10000
