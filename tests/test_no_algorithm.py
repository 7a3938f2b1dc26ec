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
