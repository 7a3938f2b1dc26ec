"""tools/live_parity.py on the CPU: the draw, the operands, the comparison, the tallies and the
run loop, with cpemu's reference standing in for native torch._scaled_mm (and corrupted or
refusing versions of it that must make the run fail)."""

import importlib.util
import json
import os

import ml_dtypes
import numpy as np
import pytest

import cpemu

torch = pytest.importorskip("torch")  # the tool draws its operands with torch
HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("cpemu_tools_live_parity",
                                               os.path.join(HERE, "..", "tools", "live_parity.py"))
lp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lp)

H200 = cpemu.get_profile("hopper-h200-torch")
SMALL = dict(model_share=0.5, outside_share=0.25, max_mac=2 ** 15)


def _sigs(n, seed=0, profile=H200, **kw):
    return list(lp.draw_calls(profile, n, seed, **{**SMALL, **kw}))


def test_draw_is_seeded():
    assert _sigs(40, seed=3) == _sigs(40, seed=3)
    assert _sigs(40, seed=3) != _sigs(40, seed=4)


def test_draws_stay_in_the_profile():
    pairs = [list(p) for p in H200.data["formats"]]
    sigs = _sigs(300, max_mac=2 ** 40)
    assert {s["scaling"] for s in sigs} == {"tensorwise", "rowwise"}
    for s in sigs:
        M, N, K = s["M"], s["N"], s["K"]
        assert N % 16 == 0 and K % 16 == 0 and M >= 1 and M * N * K <= 2 ** 40
        assert (M + N) * K + 4 * M * N <= 2 ** 30  # --max-bytes
        assert lp.in_domain(H200.data["modes"][s["scaling"]]["split_k"]["domain"], M, N, K)
        mode = H200.data["modes"][s["scaling"]]
        if s["outside"] is None:
            assert [s["a_format"], s["b_format"]] in pairs and s["out_dtype"] in mode["out_dtypes"]
            assert s["bias"] in (None, mode["bias_dtypes"][s["out_dtype"]])
        else:  # a feature the profile does not record
            assert [s["a_format"], s["b_format"]] not in pairs or s["bias"] != mode["bias_dtypes"][s["out_dtype"]]


def test_model_like_shapes():
    sigs = _sigs(200, model_share=1.0, outside_share=0.0, max_mac=2 ** 40)
    for s in sigs:
        assert s["model_like"] and (s["N"], s["K"]) in lp.MODEL_NK[s["source"]]
        dom = H200.data["modes"][s["scaling"]]["split_k"]["domain"]
        assert lp.in_domain(dom, s["M"], s["N"], s["K"])
        N, K = s["N"], s["K"]
        cap = min(dom["M"][1], 2 ** 40 // (N * K), (2 ** 30 - N * K) // (K + 4 * N))
        in_tokens = any(lo <= s["M"] <= hi for lo, hi in lp.TOKEN_RANGES) or s["M"] == cap
        assert in_tokens or (s["source"] == "evo2" and s["M"] % 16 == 0)
    assert {"evo2", "llama3-8b"} <= {s["source"] for s in sigs}
    assert not any(s["model_like"] for s in _sigs(50, model_share=0.0))


def test_too_small_max_mac_is_refused():
    with pytest.raises(ValueError, match="--max-mac"):
        _sigs(1, max_mac=100)


@pytest.mark.parametrize("scaling, M, N, K, want", [
    ("tensorwise", 16, 64, 16384, True),    # u = min(6, 255)
    ("tensorwise", 1, 4096, 5120, False),   # ceil(5120/2560) - 1 = 1
    ("tensorwise", 1, 4096, 5136, True),    # ceil(5136/2560) - 1 = 2
    ("tensorwise", 2048, 4096, 16384, False),  # the workspace allows no split
    ("tensorwise", 32, 2048, 16384, True),  # floor(1048560 / (4 * 32 * 2048)) = 3
    ("tensorwise", 32, 4096, 16384, False),  # floor(1048560 / 524288) = 1: 2^20 - 16 bytes hold one partial
    ("tensorwise", 16, 4080, 16384, True),  # ceil32(4080) = 4096: floor(1048560 / 262144) = 3
    ("rowwise", 16, 64, 16384, False),      # the rowwise mode never splits
])
def test_split_region(scaling, M, N, K, want):
    assert lp.split_region(H200, scaling, M, N, K) is want


def test_split_region_reads_the_profiles_bound():
    data = json.loads(json.dumps(H200.data))
    data["modes"]["tensorwise"]["split_k"].setdefault("params", {})["bound"] = {"k_per_split": 1280}
    halved = cpemu.Profile("test-bound", data)
    assert not lp.split_region(H200, "tensorwise", 1, 4096, 5120)  # ceil(5120/2560) - 1 = 1
    assert lp.split_region(halved, "tensorwise", 1, 4096, 5120)  # ceil(5120/1280) - 1 = 3
    data["modes"]["tensorwise"]["split_k"]["params"]["bound"] = {"workspace_bytes": 4 * 2 ** 20}
    assert lp.split_region(cpemu.Profile("test-ws", data), "tensorwise", 32, 4096, 16384)  # 4 MiB: 7


def test_no_split_region_without_a_split_rule():
    assert not lp.split_region(cpemu.get_profile("ada-rtx4060-torch"), "tensorwise", 16, 64, 16384)


def test_operands():
    s = dict(_sigs(1)[0], M=5, N=32, K=48, scaling="rowwise", scales={"kind": "random", "log2_range": [-8, 4]},
             bias="float16", data="codes")
    ops = lp.Operands(s, "cpu")
    a, bt = ops.host("a"), ops.host("bt")
    assert a.shape == (5, 48) and bt.shape == (32, 48) and a.dtype == np.uint8 and bt.dtype == np.uint8
    assert ops.scale_a.shape == (5, 1) and ops.scale_b.shape == (1, 32)
    assert ops.bias.dtype == np.uint16 and ops.bias.shape == (32,)
    assert np.isfinite(a.view(lp.FP8[s["a_format"]]).astype(np.float32)).all()
    again = lp.Operands(s, "cpu")
    assert np.array_equal(a, again.host("a")) and np.array_equal(bt, again.host("bt"))
    assert all(np.array_equal(getattr(ops, k), getattr(again, k)) for k in ("scale_a", "scale_b", "bias"))
    assert not np.array_equal(bt, lp.Operands(dict(s, seed=s["seed"] + 1), "cpu").host("bt"))
    x, w, sa, sb, kw = ops.torch_args()
    assert x.dtype == (torch.float8_e4m3fn if s["a_format"] == "e4m3" else torch.float8_e5m2)
    assert w.shape == (48, 32) and w.stride() == (1, 48) and kw["bias"].dtype == torch.float16
    t = lp.Operands(dict(s, scaling="tensorwise", scales={"kind": "unit"}, bias=None), "cpu")
    assert t.scale_a.shape == () and float(t.scale_a) == 1.0 and t.bias is None


def test_gauss_codes_follow_the_normal():
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)

    def codes(fmt, data):
        return lp._codes(gen, rng, (200000,), fmt, data, "cpu").numpy().view(lp.FP8[fmt]).astype(np.float64)

    x = codes("e4m3", "gauss")
    assert np.isfinite(x).all() and abs(x.mean()) < 0.05 * x.std()
    table = lp._gauss_table("e4m3", 10.0).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert 9.8 < table.std() < 10.2 and table.max() <= 448
    assert np.isnan(codes("e5m2", "nan")).any() and np.isfinite(codes("e5m2", "codes")).all()
    assert len(np.unique(codes("e4m3", "codes"))) > 200


def test_first_difference():
    a = np.arange(12, dtype=np.uint16).reshape(3, 4)
    assert lp.first_difference(a.view(ml_dtypes.bfloat16), a.copy()) is None
    b = a.copy()
    b[1, 2] = 0xBEEF
    b[2, 0] = 1
    assert lp.first_difference(a, b) == {"index": [1, 2], "native": "0x0006", "cpemu": "0xbeef", "differing": 2}
    f = np.zeros((1, 2), np.float32)
    g = np.array([[0.0, -0.0]], np.float32)
    assert lp.first_difference(f, g) == {"index": [0, 1], "native": "0x00000000", "cpemu": "0x80000000",
                                         "differing": 1}
    assert "shape" in lp.first_difference(a, a[:2])["reason"]


# --------------------------------------------------------------------------- the run loop

def _reference_native(corrupt=None, refuse=None):
    """cpemu's reference as native: output bits, optionally with one bit flipped or some calls refused."""
    run = lp.gemm_runner(H200, "reference")

    def native(sig, ops):
        if refuse is not None and refuse(sig):
            raise RuntimeError("Bias is not supported when out_dtype is set to Float32")
        y = lp.bits(run(sig, ops)).copy()
        if corrupt is not None and y.size:
            y.flat[corrupt] ^= 1
        return y
    return native


def _run(tmp_path, native, n=24, runners=None, **kw):
    runners = runners or {"reference": lp.gemm_runner(H200, "reference"), "torch": lp.dropin_runner(H200)}
    out = str(tmp_path / "rec.json")
    rec, code = lp.run_parity(_sigs(n, seed=7), native, runners, header={"tool": "test"}, out=out, total=n, **kw)
    assert json.load(open(out))["calls_run"] == rec["calls_run"]
    return rec, code


def test_reference_native_matches(tmp_path):
    lines = []
    rec, code = _run(tmp_path, _reference_native(), echo=lines.append)
    assert code == 0 and rec["failures"] == 0 and rec["calls_run"] == 24 and rec["stopped"] == "calls"
    assert len(lines) == 24 and lines[0].startswith("[live-parity] 1/24 M=")
    statuses = {b["status"] for e in rec["calls"] for b in e["backends"].values()}
    assert statuses <= {"matched", "both-refused"} and "matched" in statuses
    for e in rec["calls"]:
        if e["native"]["status"] == "refused":  # the reference refuses what the profile does not record
            assert e["signature"]["outside"] and e["backends"]["reference"]["status"] == "both-refused"
    t = rec["totals"]
    assert t["all"]["calls"] == 24 == sum(t["all"]["backends"]["reference"].values())
    assert sum(t.get(r, {"calls": 0})["calls"] for r in ("outside-profile", "split", "unsplit")) == 24


def test_tally():
    def entry(model, split, outside, native, **statuses):
        return {"signature": {"model_like": model, "split_region": split, "outside": outside},
                "native": {"status": native}, "backends": {n: {"status": s} for n, s in statuses.items()}}

    entries = [entry(True, True, None, "answered", ref="matched", torch="refused"),
               entry(True, True, None, "answered", ref="refused", torch="refused"),
               entry(False, True, None, "answered", ref="mismatched", torch="matched"),
               entry(True, False, None, "answered", ref="matched", torch="matched"),
               entry(False, False, "e5m2 x e5m2", "refused", ref="both-refused", torch="answered-refused")]
    entries[1]["backends"]["ref"]["error"] = lp._err(cpemu.UnsupportedShape("tile only up to 1 slices", "unverified-split"))
    entries[1]["backends"]["torch"]["error"] = lp._err(cpemu.UnsupportedShape("not recorded", "unrecorded"))
    t = lp.tally(entries)
    assert t["all"] == {"calls": 5, "native": {"answered": 4, "refused": 1},
                        "backends": {"ref": {"matched": 2, "mismatched": 1, "refused": 1, "both-refused": 1},
                                     "torch": {"matched": 2, "refused": 2, "answered-refused": 1}},
                        "refused_why": {"other": 1, "unverified-split": 1}}
    assert t["model-like"] == {"calls": 3, "native": {"answered": 3},
                               "backends": {"ref": {"matched": 2, "refused": 1}, "torch": {"matched": 1, "refused": 2}},
                               "refused_why": {"other": 1, "unverified-split": 1}}
    assert lp._err(ValueError("x")) == {"type": "ValueError", "message": "x"}
    assert t["random"]["backends"]["ref"] == {"mismatched": 1}
    assert t["split"]["calls"] == 3 and t["unsplit"]["calls"] == 1
    assert t["outside-profile"]["backends"]["torch"] == {"answered-refused": 1}
    assert t["inside-domain"]["calls"] == 4 and "beyond-record" not in t
    assert lp.failures(entries) == 2
    beyond = entry(False, True, None, "answered", ref="refused")
    beyond["signature"]["beyond_record"] = True
    t = lp.tally(entries + [beyond])
    assert t["beyond-record"]["calls"] == 1 and t["inside-domain"]["calls"] == 4 and t["split"]["calls"] == 4


@pytest.mark.parametrize("M, N, K, want", [(1, 4096, 65536, False), (1, 4096, 65552, True), (1, 65552, 8192, True),
                                           (8, 4096, 131072, True), (256, 4096, 131072, False)])
def test_beyond_record_is_the_split_region_past_the_complete_tables(M, N, K, want):
    """The shipped complete table's plan holds N and K up to 65536; a shape that can split beyond it is
    outside the recorded domain (and refused as outside-domain); one that cannot split is inside."""
    got = lp.split_region(H200, "tensorwise", M, N, K) and lp.beyond_record(H200, "tensorwise", N, K)
    assert got is want
    assert not lp.beyond_record(H200, "rowwise", N, K)  # rowwise has no complete table: never beyond
    if want:
        with pytest.raises(cpemu.UnsupportedShape) as e:
            H200.call(M, N, K, "e4m3", "e4m3", "bfloat16", "tensorwise", True, None)
        assert e.value.reason == "outside-domain"


def test_corrupted_native_fails(tmp_path):
    rec, code = _run(tmp_path, _reference_native(corrupt=0), runners={"reference": lp.gemm_runner(H200, "reference")})
    assert code == 1 and rec["failures"] > 0
    bad = [e for e in rec["calls"] if e["backends"]["reference"]["status"] == "mismatched"]
    assert len(bad) == sum(e["native"]["status"] == "answered" for e in rec["calls"]) == rec["failures"]
    d = bad[0]["backends"]["reference"]["first_difference"]
    assert d["index"] == [0, 0] and d["differing"] == 1 and int(d["native"], 16) ^ int(d["cpemu"], 16) == 1
    assert rec["totals"]["all"]["backends"]["reference"]["mismatched"] == len(bad)


def test_cpemu_answering_a_refused_call_fails(tmp_path):
    def refuse(sig):
        return sig["outside"] is None and sig["index"] % 2 == 0

    rec, code = _run(tmp_path, _reference_native(refuse=refuse), runners={"reference": lp.gemm_runner(H200, "reference")})
    answered = [e for e in rec["calls"] if e["backends"]["reference"]["status"] == "answered-refused"]
    assert code == 1 and answered and all(e["native"]["error"]["type"] == "RuntimeError" for e in answered)


def test_errors_refusals_and_skips(tmp_path):
    def broken(sig, ops):
        raise KeyError("boom")

    def refusing(sig, ops):
        raise cpemu.UnsupportedShape("not recorded")

    runners = {"cuda-tiled": broken, "cuda-simple": refusing, "reference": lp.gemm_runner(H200, "reference")}
    rec, code = _run(tmp_path, _reference_native(), n=6, runners=runners, reference_max_mac=0)
    e = next(e for e in rec["calls"] if e["native"]["status"] == "answered")
    assert e["backends"]["cuda-tiled"]["status"] == "error"
    assert e["backends"]["cuda-tiled"]["error"] == {"type": "KeyError", "message": "'boom'"}
    assert e["backends"]["cuda-simple"]["status"] == "refused"
    assert e["backends"]["cuda-simple"]["error"]["type"] == "UnsupportedShape"
    assert e["backends"]["reference"]["status"] == "skipped"
    assert code == 1 and rec["failures"] == len(rec["calls"]) == 6  # an error counts where native refused too
    assert all(x["backends"]["cuda-tiled"]["status"] == "error" for x in rec["calls"])


def test_max_seconds_stops_the_draw(tmp_path):
    rec, code = _run(tmp_path, _reference_native(), max_seconds=0)
    assert (rec["calls_run"], rec["stopped"], code) == (0, "max-seconds", 0)


def test_unknown_backend_is_refused():
    import click

    with pytest.raises(click.BadParameter, match="unknown backend 'cuda-fast'"):
        lp._backends("reference,cuda-fast", H200)


def test_command_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    from click.testing import CliRunner

    r = CliRunner().invoke(lp.main, ["--calls", "1"])
    assert r.exit_code == 1 and "needs a CUDA GPU visible to torch" in r.output


def test_command_dry_run_on_the_cpu(tmp_path):
    """The whole command with torch's CPU kernel as the native (its bits are not the H200's)."""
    from click.testing import CliRunner

    out = tmp_path / "rec.json"
    args = ["--device", "cpu", "--calls", "8", "--seed", "2", "--backends", "reference,torch", "--max-mac", "32768",
            "--out", str(out)]
    r = CliRunner().invoke(lp.main, args)
    rec = json.loads(out.read_text())
    assert r.exit_code == (1 if rec["failures"] else 0), r.output
    assert rec["calls_run"] == 8 and rec["complete"] and rec["options"]["backends"] == ["reference", "torch"]
    env = rec["environment"]
    assert env["torch"] and env["cpemu_commit"] and env["profile_match"]["verdict"] == "differs"
    assert "nvidia_smi_gpu" in env and env["reported_attributes"] is None  # no shim: nothing reported in place
    assert [e["signature"] for e in rec["calls"]] == _sigs(8, seed=2, model_share=0.5, outside_share=0.05)
    assert "8 calls in" in r.output
    r = CliRunner().invoke(lp.main, args[:-2] + ["--only", "3,5", "--out", str(out)])
    assert [e["signature"]["index"] for e in json.loads(out.read_text())["calls"]] == [3, 5]


def test_record_names_the_attributes_a_shim_reports(monkeypatch):
    """Under tools/as_h200.sh the CUDA driver names another GPU; the record keeps what the shim reports."""
    import cpemu

    monkeypatch.setenv("SPOOF_NAME", "NVIDIA H200")
    monkeypatch.setenv("SPOOF_ATTRS", "16=132")
    env = lp.environment(cpemu.get_profile(cpemu.DEFAULT_PROFILE))
    assert env["reported_attributes"] == {"SPOOF_NAME": "NVIDIA H200", "SPOOF_ATTRS": "16=132"}


def test_every_drawn_call_says_whether_it_lies_beyond_the_record():
    sigs = _sigs(200, seed=3, max_mac=2 ** 40, split_share=0.5, outside_share=0)
    assert all(s["beyond_record"] == (s["split_region"] and lp.beyond_record(H200, s["scaling"], s["N"], s["K"]))
               for s in sigs)
    assert any(s["beyond_record"] for s in sigs) and any(s["split_region"] and not s["beyond_record"] for s in sigs)


def test_split_share_draws_inside_the_split_region():
    sigs = _sigs(60, model_share=0.0, split_share=1.0, outside_share=0.0, max_mac=2 ** 40)
    assert all(s["split_region"] == (s["scaling"] == "tensorwise") for s in sigs)
    assert any(s["split_region"] for s in sigs)
    plain = _sigs(60, model_share=0.0, split_share=0.0, outside_share=0.0, max_mac=2 ** 40)
    assert sum(s["split_region"] for s in plain) < sum(s["split_region"] for s in sigs)


def test_designed_large_suite():
    """The large suite: every dimension above 16384 somewhere, Evo 2 40B at M = 32768, every call
    inside the profile's domain and outside the split region (so the laws alone answer it)."""
    profile = cpemu.get_profile()
    sigs = list(lp.designed_calls(profile, 3))
    assert len(sigs) == len(lp.LARGE_SHAPES) * len(lp.LARGE_OPTIONS) and [s["index"] for s in sigs] == list(range(len(sigs)))
    for ax in "MNK":
        assert max(s[ax] for s in sigs) > 16384
    assert any((s["M"], s["N"], s["K"], s["scaling"]) == (32768, 24576, 8192, "rowwise") for s in sigs)
    for s in sigs:
        dom = lp._domain(profile, s["scaling"])
        assert lp.in_domain(dom, s["M"], s["N"], s["K"]) and not s["split_region"], s
        assert profile.call(s["M"], s["N"], s["K"], s["a_format"], s["b_format"], s["out_dtype"], s["scaling"],
                            s["fast_accum"]).plan.splits == 1
    assert sigs == list(lp.designed_calls(profile, 3))


def test_designed_beyond_suite():
    """The beyond suite: each shape above 131072 in some dimension and at most 2^20, and nothing can
    split there by the written-out bound (u <= 1): LM heads, Evo 2 at M = 2^18 and 2^20, K = 2^18."""
    from splitk_fixtures import bound_u

    bound = H200.data["modes"]["tensorwise"]["split_k"]["params"]["bound"]
    sigs = list(lp.designed_calls(H200, 3, "beyond"))
    assert len(sigs) == len(lp.BEYOND_SHAPES) * len(lp.LARGE_OPTIONS)
    for M, N, K in lp.BEYOND_SHAPES:
        assert 131072 < max(M, N, K) <= 1 << 20 and N % 16 == 0 and K % 16 == 0, (M, N, K)
        assert int(bound_u(bound, M, N, K)) <= 1, (M, N, K)
    for ax, want in (("M", 1 << 20), ("N", 262144), ("K", 262144)):
        assert max(s[ax] for s in sigs) == want
    assert {s["source"] for s in sigs} == {"designed-beyond"} and not any(s["split_region"] for s in sigs)
