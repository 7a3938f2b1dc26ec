"""Bad input gets a clear error naming the argument (or the file) and the rule, never a wrong
answer or a traceback from deep inside."""

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

import cpemu
from cpemu.backends import BackendUnavailable
from cpemu.cli import main

A = np.zeros((4, 32), ml_dtypes.float8_e4m3fn)
B = np.zeros((32, 16), ml_dtypes.float8_e4m3fn)


@pytest.mark.parametrize("kw, arg", [(dict(a_format="e5m2"), "a_format"), (dict(b_format="e5m2"), "b_format"),
                                     (dict(a_format="fp16"), "a_format")])
def test_numpy_format_contradicting_dtype_is_refused(kw, arg):
    with pytest.raises(ValueError, match=rf"^{arg}: must name the dtype of the numpy operand"):
        cpemu.gemm(A, B, **kw)


def test_numpy_format_naming_the_dtype_is_accepted():
    want = cpemu.gemm(A, B)
    got = cpemu.gemm(A, B, a_format="e4m3", b_format="float8_e4m3fn")
    assert np.array_equal(want.view(np.uint16), got.view(np.uint16))


def test_unhashable_out_dtype():
    with pytest.raises(ValueError, match="^out_dtype: must be one of"):
        cpemu.gemm(A, B, out_dtype=["bfloat16"])


def test_empty_call_with_a_backend_that_cannot_run():
    ok, _ = cpemu.backends.available("cuda-tiled")
    if ok:
        pytest.skip("cuda-tiled runs here")
    with pytest.raises(BackendUnavailable, match="cuda-tiled"):
        cpemu.gemm(np.zeros((0, 32), ml_dtypes.float8_e4m3fn), B, backend="cuda-tiled")


@pytest.mark.parametrize("content, rule", [
    ("", "is not valid JSON"), ("{'name': 1}", "is not valid JSON"),
    ('{"name": "x"}', "does not follow schemas/profile.schema.json"),
])
def test_bad_profile_file_names_the_file(tmp_path, content, rule):
    p = tmp_path / "p.json"
    p.write_text(content)
    with pytest.raises(ValueError, match=rule) as e:
        cpemu.get_profile(str(p))
    assert str(p) in str(e.value) and len(str(e.value)) < 600


@pytest.mark.parametrize("make", ["missing", "folder"])
def test_unreadable_profile_file(tmp_path, make):
    p = tmp_path / "p.json"
    if make == "folder":
        p.mkdir()
    with pytest.raises(ValueError, match="cannot read the profile file") as e:
        cpemu.get_profile(str(p))
    assert str(p) in str(e.value)


def test_schema_invalid_profile_names_the_place(tmp_path):
    data = json.loads(json.dumps(cpemu.get_profile().data))
    data["modes"]["tensorwise"]["promotion_interval"] = 0
    p = tmp_path / "p.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="at modes/tensorwise/promotion_interval"):
        cpemu.get_profile(str(p))


@pytest.mark.parametrize("kind", ["empty", "npz", "random"])
def test_cli_bad_operand_files_name_the_file(tmp_path, kind):
    a = tmp_path / "a.npy"
    if kind == "empty":
        a.write_bytes(b"")
    elif kind == "npz":
        np.savez(tmp_path / "x.npz", a=np.zeros((4, 32), np.uint8))
        (tmp_path / "x.npz").rename(a)
    else:
        a.write_bytes(np.random.default_rng(0).bytes(256))
    b = tmp_path / "b.npy"
    np.save(b, np.zeros((32, 16), np.uint8))
    r = CliRunner().invoke(main, ["gemm", "--a", str(a), "--b", str(b)])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert str(a) in r.output and "a:" in r.output, r.output


@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_cli_verify_jobs_must_be_positive(tmp_path, jobs):
    r = CliRunner().invoke(main, ["verify", str(tmp_path), "--jobs", jobs])
    assert r.exit_code == 2 and "--jobs" in r.output


# --------------------------------------------------------------------------- FP8Linear

def _w(n=32, k=64):
    torch = pytest.importorskip("torch")
    return torch.zeros((n, k), dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("scale, rule", [("two", "input_scale: must be one positive finite number"),
                                         ([1.0, 2.0], "input_scale: must be one number"),
                                         (0.0, "input_scale: must be positive and finite"),
                                         (float("nan"), "input_scale: must be positive and finite"),
                                         (float("inf"), "input_scale: must be positive and finite")])
def test_fp8linear_input_scale(scale, rule):
    import cpemu.torch as ct

    with pytest.raises(ValueError, match=rule):
        ct.FP8Linear(_w(), 1.0, scale)


def test_fp8linear_weight_scale_inv_shape():
    torch = pytest.importorskip("torch")
    import cpemu.torch as ct

    with pytest.raises(ValueError, match="weight_scale_inv: must be one number"):
        ct.FP8Linear(_w(), torch.ones(2), 1.0)


@pytest.mark.parametrize("shape", [(32, 40), (24, 64)])
def test_fp8linear_features_multiple_of_16(shape):
    import cpemu.torch as ct

    with pytest.raises(ValueError, match="weight_fp8: in_features and out_features must be positive multiples"):
        ct.FP8Linear(_w(*shape), 1.0, 1.0)


@pytest.mark.parametrize("dtype", ["int64", "bool", "float8_e4m3fn"])
def test_fp8linear_input_dtype(dtype):
    torch = pytest.importorskip("torch")
    import cpemu.torch as ct

    layer = ct.FP8Linear(_w(), 1.0, 1.0)
    x = torch.zeros((3, 64), dtype=getattr(torch, dtype))
    with pytest.raises(ValueError, match="input: must be a floating-point tensor"):
        layer(x)


def test_cli_out_into_a_missing_folder_fails_before_computing(tmp_path, monkeypatch):
    import cpemu.cli as cli

    def no_gemm(*a, **k):
        raise AssertionError("computed before checking --out")

    monkeypatch.setattr(cli, "_gemm", no_gemm)
    r = CliRunner().invoke(main, ["gemm", "--out", str(tmp_path / "missing" / "y.npy")])
    assert r.exit_code != 0 and "--out: the folder of" in r.output and "Traceback" not in r.output


# --------------------------------------------------------------------------- truth manifests

@pytest.mark.parametrize("content, rule", [(None, "cannot read the truth manifest"), ("{'a': 1}", "is not valid JSON"),
                                           ('{"a": 1}', "does not follow schemas/truth.schema.json")])
def test_bad_truth_manifest_names_the_file(tmp_path, content, rule):
    from cpemu.truth import load_manifest

    man = tmp_path / "manifest.json"
    if content is not None:
        man.write_text(content)
    with pytest.raises(ValueError, match=rule) as e:
        load_manifest(str(tmp_path))
    assert str(man) in str(e.value) and str(e.value).startswith("truth: ") and len(str(e.value)) < 600
    r = CliRunner().invoke(main, ["verify", str(tmp_path)])
    assert r.exit_code == 1 and "Error: truth: " in r.output and rule in r.output and "Traceback" not in r.output


# --------------------------------------------------------------------------- .npy files of ml_dtypes arrays

def _files(tmp_path, a):
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", np.full((32, 16), 0x38, np.uint8))
    return ["gemm", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "--json"]


def test_cli_e4m3_file_without_format_is_refused(tmp_path):
    # np.save writes float8_e4m3fn (and other 1-byte ml_dtypes) as 'V1' records that carry no format
    args = _files(tmp_path, np.full((4, 32), 0x40, np.uint8).view(ml_dtypes.float8_e4m3fn))
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"Error: a: {tmp_path / 'a.npy'} holds raw 1-byte records" in r.output and "give --a-format" in r.output
    r = CliRunner().invoke(main, args + ["--a-format", "e4m3"])
    assert r.exit_code == 0, r.output


def test_cli_e5m2_file_is_read_as_e5m2(tmp_path):
    # np.save writes float8_e5m2 with descr '<f1', which np.load cannot read
    a = np.random.default_rng(0).integers(0, 0x7B, (4, 32), dtype=np.uint8)
    args = _files(tmp_path, a.view(ml_dtypes.float8_e5m2))
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    want = cpemu.gemm(a.view(ml_dtypes.float8_e5m2), np.full((32, 16), 0x38, np.uint8).view(ml_dtypes.float8_e4m3fn))
    import hashlib

    assert d["a_format"] == "e5m2" and d["sha256"] == hashlib.sha256(want.tobytes()).hexdigest()
    r = CliRunner().invoke(main, args + ["--a-format", "e4m3"])
    assert r.exit_code == 1 and "holds float8_e5m2 but --a-format is e4m3" in r.output


# --------------------------------------------------------------------------- early checks, domains, memory

def test_cli_shape_outside_the_domain_refused_before_inputs(monkeypatch):
    import cpemu.cli_gemm as cli

    def no_inputs(case):
        raise AssertionError("inputs were generated")

    monkeypatch.setattr(cli, "operands", no_inputs)
    r = CliRunner().invoke(main, ["gemm", "--demo", "evo2-1b", "--M", "200000"])
    assert r.exit_code == 1 and "Error: M=200000 is outside the range 1..131072" in r.output, r.output


@pytest.mark.parametrize("profile", ["ada-rtx4060-torch", "blackwell-rtx5070ti-torch"])
def test_assumed_schedule_profiles_refuse_beyond_their_domain(profile):
    a = np.zeros((1, 131072 + 16), ml_dtypes.float8_e4m3fn)
    b = np.zeros((131072 + 16, 16), ml_dtypes.float8_e4m3fn)
    with pytest.raises(cpemu.UnsupportedShape, match=r"^K=131088 is outside the range 16\.\.131072"):
        cpemu.gemm(a, b, profile=profile)


def test_every_profile_states_its_domain():
    for name in cpemu.profiles():
        for scaling, mode in cpemu.get_profile(name).data["modes"].items():
            dom = mode["split_k"].get("domain")
            assert dom and all(ax in dom for ax in "MNK"), (name, scaling)
            assert all(dom[ax][1] <= 131072 for ax in "MNK"), (name, scaling)


def test_output_too_large_is_refused_before_allocating(monkeypatch):
    import cpemu.memory as mem

    monkeypatch.setattr(mem, "available_bytes", lambda: 1 << 30)
    monkeypatch.setattr(np, "empty", None)  # any allocation of the output would fail differently
    a = np.zeros((32768, 16), ml_dtypes.float8_e4m3fn)
    with pytest.raises(cpemu.OutputTooLarge, match=r"^out: the \(32768, 32768\) bfloat16 output needs 2\.00 GiB"):
        cpemu.gemm(a, np.zeros((16, 32768), ml_dtypes.float8_e4m3fn), profile="ada-rtx4060-torch")


def test_cli_output_too_large_refused_before_inputs(monkeypatch):
    import cpemu.cli_gemm as cli
    import cpemu.memory as mem

    monkeypatch.setattr(mem, "available_bytes", lambda: 1 << 30)
    monkeypatch.setattr(cli, "operands", None)
    r = CliRunner().invoke(main, ["gemm", "--demo", "evo2-40b", "--M", "131072"])
    assert r.exit_code == 1 and "Error: out: the (131072, 24576) bfloat16 output needs 6.00 GiB" in r.output, \
        r.output
