"""Transformer Engine as a caller of cuBLASLt (cpemu.recording.te_caller, cpemu.callers), without a GPU.

* TE's descriptors are torch's plus the explicit default epilogue and the four minimum
  alignments, in that order (written out here from TE's cublas_gemm, docs/te-caller.md).
* TE's heuristic workspace: the allocation minus 256 plus the address alignment.
* The check's queries cover Evo 2's three shapes, every M = 16..16384 in steps of 16, four
  workspaces and both callers; the verdict marks a split and a difference from torch.
* The verdict file's reader validates it and says what it holds for one projection.
"""

from __future__ import annotations

import json
import os

import pytest

import cpemu
from cpemu import callers
from cpemu.cuda import cublaslt
from cpemu.recording import te_caller as tc
from test_cublaslt_binding import PTRS, _RecordingLt


def test_te_descriptors_extend_torchs():
    c = cublaslt.Case(16, 5760, 1920, "e4m3", "e4m3", "bfloat16", True, False, "tensorwise")
    torch_lt, te_lt = _RecordingLt(), _RecordingLt()
    cublaslt.build_descs(torch_lt, c, PTRS, 1 << 20)
    tc.build_te_descs(te_lt, c, PTRS, tc.te_heuristic_workspace(32 * 2**20 + 1024))
    n = len(torch_lt.calls)
    assert te_lt.calls[:n - 1] == torch_lt.calls[:n - 1]
    assert te_lt.calls[n - 1] == ("pref_set", 1, "c_ulong", 8, 32 * 2**20 + 1024)  # MAX_WORKSPACE_BYTES
    assert te_lt.calls[n:] == [
        ("desc_set", 7, "c_uint", 4, 1),  # EPILOGUE = DEFAULT
        ("pref_set", 5, "c_uint", 4, 256),  # MIN_ALIGNMENT_A_BYTES
        ("pref_set", 6, "c_uint", 4, 256),
        ("pref_set", 7, "c_uint", 4, 256),
        ("pref_set", 8, "c_uint", 4, 256),  # MIN_ALIGNMENT_D_BYTES
    ]


@pytest.mark.parametrize("allocated, address, asked", [
    (32 * 2**20 + 1024, 512, 32 * 2**20 + 1024), (32 * 2**20, 256, 32 * 2**20), (4096, 16, 4096 - 240)])
def test_te_heuristic_workspace(allocated, address, asked):
    assert tc.te_heuristic_workspace(allocated, address) == asked


def test_queries_cover_the_check():
    qs = list(tc.cases())
    assert len(qs) == 3 * 2 * 4 * 1024
    ms = sorted({q[4].M for q in qs})
    assert ms[0] == 16 and ms[-1] == 16384 and len(ms) == 1024 and all(m % 16 == 0 for m in ms)
    assert {(q[4].N, q[4].K) for q in qs} == {(5760, 1920), (12288, 4096), (24576, 8192)}
    assert {q[2] for q in qs} == {"1MiB", "4MiB", "32MiB", "32MiB+1KiB"}
    c = qs[0][4]
    assert (c.a_dtype, c.b_dtype, c.out_dtype, c.fast_accum, c.bias, c.scale_mode) == \
        ("e4m3", "e4m3", "bfloat16", True, False, "tensorwise")
    with pytest.raises(ValueError, match="M range"):
        tc.m_values(32, 16)


def _fake_ask(split_at=()):
    def ask(caller, case, ws):
        s = 2 if (caller == "te" and case.M in split_at and case.N == 24576) else 1
        return {"M": case.M, "N": case.N, "K": case.K, "status": "OK", "algo_id": 66, "tile_id": 40,
                "stages_id": 8, "cluster_shape_id": 2, "splitk_num": s, "reduction_scheme": 0 if s == 1 else 1,
                "cta_swizzling": 0, "custom_option": 0, "inner_shape_id": 0}
    return ask


PROV = {"device_name": "NVIDIA H200", "cublaslt_version": 130100, "tool": "tools/te_caller_check.py",
        "date": "2026-12-01T12:00:00+00:00"}


def test_verdict_no_split_and_split():
    q = list(tc.cases(ms=[16, 32, 48]))
    doc = tc.verdict(tc.run_check(_fake_ask(), q), PROV)
    assert doc["te_no_split"] is True
    e = doc["shapes"]["evo2-40b"]["te"]["32MiB+1KiB"]
    assert e["no_split"] and e["split_M"] == [] and e["equal_to_torch_1MiB"] and e["M"] == [16, 48]
    doc = tc.verdict(tc.run_check(_fake_ask(split_at={32}), q), PROV)
    assert doc["te_no_split"] is False
    e = doc["shapes"]["evo2-40b"]["te"]["32MiB"]
    assert e["split_M"] == [32] and not e["no_split"] and e["differs_from_torch_1MiB_at_M"] == [32]
    assert doc["shapes"]["evo2-1b"]["te"]["32MiB"]["no_split"]


def test_reader(tmp_path, monkeypatch):
    assert callers.te_caller("hopper-h200-torch") is None or callers.te_caller("hopper-h200-torch")["kind"]
    doc = tc.verdict(tc.run_check(_fake_ask(), list(tc.cases(ms=[16, 32]))), PROV)
    monkeypatch.setattr(callers, "_read", lambda name: doc)
    assert "checked unsplit for evo2-7b" in callers.te_schedule("hopper-h200-torch", 12288, 4096)
    assert "not checked" in callers.te_schedule("hopper-h200-torch", 12288, 4096, M=4096)
    assert "not checked" in callers.te_schedule("hopper-h200-torch", 4096, 4096)
    monkeypatch.setattr(callers, "_read", lambda name: None)
    assert "not recorded" in callers.te_schedule("hopper-h200-torch", 12288, 4096)


def test_verdict_follows_the_schema():
    import jsonschema
    doc = tc.verdict(tc.run_check(_fake_ask(), list(tc.cases(ms=[16]))), PROV)
    jsonschema.validate(json.loads(json.dumps(doc)), cpemu.profile.load_schema("te_caller"))


def test_committed_verdict_is_its_rows():
    """The H200 verdict shipped beside the profile is what its recorded queries say
    (tests/data/te-caller: every answer of the check, a second run on the same host): 24,576
    queries, TE's configuration never splits K for an Evo 2 shape, and it picks torch's 1 MiB kernel."""
    import gzip

    doc = callers.te_caller("hopper-h200-torch")
    assert doc is not None and doc["provenance"]["device_name"] == "NVIDIA H200"
    path = os.path.join(os.path.dirname(__file__), "data", "te-caller", "hopper-h200-torch.te-caller-rows.json.gz")
    with gzip.open(path) as f:
        rows = json.load(f)
    assert len(rows) == 24576
    again = tc.verdict(rows, doc["provenance"])
    assert again["shapes"] == doc["shapes"] and again["te_no_split"] is doc["te_no_split"] is True
    for model in doc["shapes"].values():
        for ws, e in model["te"].items():
            assert e["no_split"] and e["answered"] == e["queries"] == 1024 and e["M"] == [16, 16384], ws
