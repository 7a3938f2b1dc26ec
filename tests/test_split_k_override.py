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
from splitk_fixtures import UNRECORDED, partial_profile

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
    """A profile whose table does not hold the shape refuses it; stated, the split count the shipped
    table records (2) gives the shipped profile's bits, and another count other bits."""
    M, N, K = UNRECORDED
    rng = np.random.default_rng(5)
    f8 = cpemu.formats.FP8_FORMATS["e4m3"].np_dtype
    a = rng.normal(0, 1, (M, K)).astype(np.float32).astype(f8)
    b = rng.normal(0, 1, (K, N)).astype(np.float32).astype(f8)
    with pytest.raises(cpemu.UnsupportedShape) as e:
        cpemu.gemm(a, b, backend="reference", profile=partial_profile())
    assert e.value.reason == "unrecorded"
    shipped = cpemu.gemm(a, b, backend="reference")
    stated = cpemu.gemm(a, b, backend="reference", profile=partial_profile(), split_k=2)
    other = cpemu.gemm(a, b, backend="reference", profile=partial_profile(), split_k=3)
    assert stated.view(np.uint16).tobytes() == shipped.view(np.uint16).tobytes()
    assert other.view(np.uint16).tobytes() != shipped.view(np.uint16).tobytes()


@pytest.mark.parametrize("bad", [0, 42, 2.0, True, "2"])
def test_split_k_is_checked(bad):
    a = np.zeros((1, 5120), np.float32).astype(cpemu.formats.FP8_FORMATS["e4m3"].np_dtype)
    b = np.zeros((5120, 16), np.float32).astype(cpemu.formats.FP8_FORMATS["e4m3"].np_dtype)
    with pytest.raises(ValueError, match=r"split_k: must be None or an integer from 1 to ceil\(K / 128\) = 40"):
        cpemu.gemm(a, b, split_k=bad)
