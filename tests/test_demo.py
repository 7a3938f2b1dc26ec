"""``cpemu gemm --demo``: whether the output is the H200's recorded one.

The shipped table of recorded demo calls (profile_data/hopper-h200-torch.recorded-demos.json)
must hold exactly what the truth recording tests/data/h200 holds for those calls.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from cpemu import demo
from cpemu.cases import EVO2_SHAPES, Case
from cpemu.cli import main

MANIFEST = os.path.join(os.path.dirname(__file__), "data", "h200", "manifest.json")


def test_shipped_table_is_the_recording():
    with open(MANIFEST) as f:
        recorded = {c["id"]: c for c in json.load(f)["cases"]}
    table = demo.recorded_demos()
    assert sorted(table) == sorted(EVO2_SHAPES)
    for name, (case, sha) in table.items():
        rec = recorded[case.id]
        assert Case.from_json(rec) == case and rec["output_sha256"] == sha
        assert (case.N, case.K) == EVO2_SHAPES[name] and case.M == 16 and case.data == "gauss40"


def test_recorded_demo_equals_the_h200():
    r = CliRunner().invoke(main, ["gemm", "--demo", "evo2-1b", "--recorded", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["h200"]["equal"] is True and d["h200"]["case"] == "16x5760x1920-e4m3e4m3-gauss40-s40-fast-bfloat16-tensor"
    assert d["manifest_sha256"] == demo.recorded_demos()["evo2-1b"][1]


def test_recorded_demo_text():
    r = CliRunner().invoke(main, ["gemm", "--recorded"])
    assert r.exit_code == 0, r.output
    assert "h200:     equals the H200's recorded output (16x5760x1920-e4m3e4m3-gauss40-s40" in r.stdout


def test_a_different_output_is_reported_and_fails(monkeypatch):
    case, _ = demo.recorded_demos()["evo2-1b"]
    monkeypatch.setattr(demo, "recorded_demos", lambda: {"evo2-1b": (case, "0" * 64)})
    r = CliRunner().invoke(main, ["gemm", "--recorded"])
    assert r.exit_code == 1 and "h200:     DIFFERS from the H200's recorded output" in r.stdout


def test_unrecorded_demo_says_so():
    r = CliRunner().invoke(main, ["gemm", "--demo", "evo2-1b", "--M", "1"])
    assert r.exit_code == 0 and "h200:     not a call the H200 recorded (add --recorded" in r.stdout


def test_other_profile_is_not_compared():
    r = CliRunner().invoke(main, ["gemm", "--recorded", "--profile", "ada-rtx4060-torch", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["h200"]
    assert d["recorded"] is True and d["equal"] is None and "models another GPU" in d["text"]


@pytest.mark.parametrize("extra, flag", [(["--M", "16"], "--M"), (["--seed", "40"], "--seed"),
                                         (["--scale-a", "2"], "--scale-a"), (["--no-fast-accum"], "--fast-accum"),
                                         (["--out-dtype", "float32"], "--out-dtype")])
def test_recorded_takes_no_call_options(extra, flag):
    r = CliRunner().invoke(main, ["gemm", "--recorded"] + extra)
    assert r.exit_code == 2 and "--recorded runs the call as the H200 recorded it; drop" in r.output
    assert flag in r.output.split("drop")[1]


def test_recorded_needs_a_demo(tmp_path):
    import numpy as np

    np.save(tmp_path / "a.npy", np.zeros((4, 32), np.uint8))
    np.save(tmp_path / "b.npy", np.zeros((32, 16), np.uint8))
    r = CliRunner().invoke(main, ["gemm", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"),
                                  "--recorded"])
    assert r.exit_code == 2 and "--recorded applies to --demo only" in r.output
