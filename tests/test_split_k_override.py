"""cpemu.gemm(split_k=...): the caller states the split count; the profile's slicing and reduction do the rest.

Checked against the H200's truth recordings of split-K calls: with the recorded split count
stated, the bits equal the H200's; with another count they do not (the argument is used)."""

import json
import os

import numpy as np
import pytest

import cpemu
from cpemu.cases import Case
from cpemu.truth import _inputs_for_gemm, sha256_arrays
from splitk_fixtures import UNRECORDED

DATA = os.path.join(os.path.dirname(__file__), "data", "h200")
CASES = sorted((r for r in json.load(open(os.path.join(DATA, "manifest.json")))["cases"]
                if r.get("splits", 1) >= 2 and "error" not in r and r["M"] * r["N"] * r["K"] <= 1 << 24),
               key=lambda r: (r["data"] == "uniform", r["M"] * r["N"] * r["K"]))[:16]


def _run(rec, **kw):
    A, B, sa, sb, bias, _ = _inputs_for_gemm(Case.from_json(rec))
    y = cpemu.gemm(A, B, scale_a=sa, scale_b=sb, bias=bias, out_dtype=rec["out_dtype"], fast_accum=rec["fast_accum"],
                   backend="reference", **kw)
    return sha256_arrays(y.view(np.uint32 if y.dtype == np.float32 else np.uint16))


def test_cases_are_split_recordings():
    assert len(CASES) == 16 and len({r["splits"] for r in CASES}) >= 2


@pytest.mark.parametrize("rec", CASES, ids=[r["id"] for r in CASES])
def test_stated_split_gives_the_h200_bits(rec):
    assert _run(rec, split_k=rec["splits"]) == rec["output_sha256"]


def test_another_stated_split_changes_the_bits():
    assert sum(_run(r, split_k=1) != r["output_sha256"] for r in CASES) == len(CASES)


def test_stated_split_answers_an_unrecorded_shape():
    M, N, K = UNRECORDED
    a = np.zeros((M, K), np.float32).astype(cpemu.formats.FP8_FORMATS["e4m3"].np_dtype)
    b = np.zeros((K, N), np.float32).astype(cpemu.formats.FP8_FORMATS["e4m3"].np_dtype)
    with pytest.raises(cpemu.UnsupportedShape) as e:
        cpemu.gemm(a, b, backend="reference")
    assert e.value.reason == "unrecorded"
    assert cpemu.gemm(a, b, backend="reference", split_k=2).shape == (M, N)


@pytest.mark.parametrize("bad", [0, 42, 2.0, True, "2"])
def test_split_k_is_checked(bad):
    a = np.zeros((1, 5120), np.float32).astype(cpemu.formats.FP8_FORMATS["e4m3"].np_dtype)
    b = np.zeros((5120, 16), np.float32).astype(cpemu.formats.FP8_FORMATS["e4m3"].np_dtype)
    with pytest.raises(ValueError, match=r"split_k: must be None or an integer from 1 to ceil\(K / 128\) = 40"):
        cpemu.gemm(a, b, split_k=bad)
