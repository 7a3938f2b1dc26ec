"""The reference, and the CPU backend cpu-fp32, reproduce every committed GPU recording bit for bit.

Truth: tests/data/h200 (torch._scaled_mm on an NVIDIA H200; provenance in its manifest).
Inputs are regenerated from the recorded seeds and checked against the recorded input
sha256 before any output is compared; outputs are compared as bit patterns (the sha256
of the whole output, and the stored rows element by element for the failure message).
"""

import os

import numpy as np
import pytest

from cpemu.truth import check_case, features_of, load_manifest

TRUTH_DIRS = {"h200": os.path.join(os.path.dirname(__file__), "data", "h200")}
_MANIFESTS = {k: load_manifest(v) for k, v in TRUTH_DIRS.items()}
_NPZ = {}


def _bits(folder, rec):
    if rec.get("stored") != "bits":
        return None
    path = os.path.join(TRUTH_DIRS[folder], rec["file"])
    if path not in _NPZ:
        _NPZ[path] = np.load(path)
    return _NPZ[path][rec["id"]]


CASES = [(k, rec) for k, man in _MANIFESTS.items() for rec in man["cases"]]


@pytest.mark.parametrize("backend", ["reference", "cpu-fp32"])
@pytest.mark.parametrize("folder,rec", CASES, ids=[f"{k}:{r['id']}" for k, r in CASES])
def test_recording(folder, rec, backend):
    man = _MANIFESTS[folder]
    r = check_case(rec, _bits(folder, rec), man["profile"], backend=backend)
    expected = "rejected-both" if "error" in rec else "match"
    assert r.status == expected, f"{rec['id']} [{', '.join(features_of(rec))}]: {r.status}: {r.detail}"


def test_manifest_covers_every_feature():
    """The recordings exercise each feature the profile claims (counts are in the README)."""
    feats = {f for _, rec in CASES if "error" not in rec for f in features_of(rec)}
    for f in ("out-bfloat16", "out-float16", "out-float32", "fast-accum", "promotion", "scale-tensor",
              "scale-rowwise", "bias", "split-k", "e4m3xe5m2", "e5m2xe4m3", "data-nan", "evo2"):
        assert f in feats, f


def test_recorded_split_counts_match_the_profile():
    """Each recording's split-K count (cuBLASLt's answer on the GPU) is the profile's."""
    import cpemu

    checked = 0
    for folder, rec in CASES:
        if "splits" not in rec:
            continue
        prof = cpemu.get_profile(_MANIFESTS[folder]["profile"])
        scaling = "rowwise" if rec["scale"] == "rowwise" else "tensorwise"
        plan = prof.plan(rec["M"], rec["N"], rec["K"], rec["fast_accum"], scaling, rec["a_format"],
                         rec["b_format"], rec["out_dtype"])
        assert plan.splits == rec["splits"], rec["id"]
        checked += 1
    assert checked > 300
