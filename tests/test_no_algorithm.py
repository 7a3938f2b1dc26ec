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

H200 = cpemu.get_profile("hopper-h200-torch")
LARGE = Path(__file__).parent / "data" / "h200-splitk" / "measured" / "large.npz"


def _refused(M, N, K, a, b, out, fast, bias):
    try:
        H200.call(M, N, K, a, b, out, "rowwise", fast, out if bias else None)
    except UnsupportedShape as e:
        return str(e)
    return None


def test_every_recorded_no_algorithm_is_refused():
    d = np.load(LARGE)
    combos = json.loads(str(d["combos"]))
    shapes, ids = d["shapes"].astype(int), d["ids"]
    refused_none = answered_ok = refused_ok = 0
    for j, c in enumerate(combos):
        if c["scale_mode"] != "rowwise" or not c["bias"]:
            continue
        for (M, N, K), cid in zip(shapes, ids[:, j]):
            why = _refused(M, N, K, c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"], True)
            if cid < 0:
                assert why is not None and "no algorithm" in why, ((M, N, K), c)
                refused_none += 1
            elif why is None:
                answered_ok += 1
            else:
                assert "no algorithm" in why, ((M, N, K), c, why)
                refused_ok += 1
    assert refused_none == 39695  # every query without an algorithm
    assert refused_ok == 1411 and answered_ok == 144768 - 39695 - 1411


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
