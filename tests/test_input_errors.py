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
