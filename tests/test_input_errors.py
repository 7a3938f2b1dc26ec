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

    import numpy.ma  # noqa: F401 - imported before np.empty goes (numpy imports it lazily)
    from cpemu import backends

    backends.status(cpemu.get_profile("ada-rtx4060-torch"))  # validated first: the ladder's checks allocate
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


# --------------------------------------------------------------------------- found by a bad-input audit

def test_huge_python_scale_names_the_argument():
    with pytest.raises(ValueError, match=r"^scale_a: must be finite and representable in float32"):
        cpemu.gemm(A, B, scale_a=10 ** 400)


def test_masked_operand_is_refused():
    with pytest.raises(ValueError, match=r"^a: must be a plain numpy array"):
        cpemu.gemm(np.ma.masked_array(A), B)


@pytest.mark.parametrize("bits, why", [(np.array([1.5], np.float32), "must have dtype uint16"),
                                       (np.array([0x3C00], np.int64), "must have dtype uint16"),
                                       ([0x3F80], "must be a numpy or cupy array")])
def test_bits_to_float32_refuses_what_is_not_bit_patterns(bits, why):
    with pytest.raises(ValueError, match=rf"^bits: {why}"):
        cpemu.bits_to_float32(bits)


def test_bits_to_float32_reads_bit_patterns():
    got = cpemu.bits_to_float32(np.array([0x3F80, 0xC000], np.uint16))
    assert got.view(np.uint32).tolist() == [0x3F800000, 0xC0000000]
    assert cpemu.bits_to_float32(np.array([0x3C00], np.uint16), "float16").view(np.uint32).tolist() == [0x3F800000]


def test_profile_path_object_is_accepted(tmp_path):
    import pathlib
    path = pathlib.Path(cpemu.profile.__file__).parent / "profile_data" / "ada-rtx4060-torch.json"
    assert cpemu.get_profile(path).name == "ada-rtx4060-torch"


def _profile_copy(tmp_path, edit, name="hopper-h200-torch"):
    """A copy of a shipped profile (with its split-K tables beside it) after ``edit(doc)``."""
    import pathlib
    import shutil
    src = pathlib.Path(cpemu.profile.__file__).parent / "profile_data"
    for f in src.glob(f"{name}.*"):
        shutil.copy(f, tmp_path / f.name)
    doc = json.loads((src / f"{name}.json").read_text())
    edit(doc)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


SPLIT = dict(a=np.zeros((1, 8192), ml_dtypes.float8_e4m3fn), b=np.zeros((8192, 1536), ml_dtypes.float8_e4m3fn))


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["instruction"].update(F=40), r"at instruction/F: 40 is greater than the maximum of 32"),
    (lambda d: d["instruction"].update(F=3), r"at instruction/F: 3 is less than the minimum of 6"),
    (lambda d: d["instruction"].update(e_zero=100), r"at instruction/e_zero: 100 is greater than the maximum"),
    (lambda d: d["instruction"].update(e_zero=10 ** 30), r"at instruction/e_zero"),
    (lambda d: d["modes"]["tensorwise"]["split_k"].pop("params"), r"at modes/tensorwise/split_k: 'params' is a required"),
    (lambda d: d["modes"]["tensorwise"]["nan_bits"].update(bfloat16=2 ** 40), r"at modes/tensorwise/nan_bits/bfloat16"),
    (lambda d: d["modes"]["tensorwise"]["nan_bits"].update(bfloat16=0x3F80), r"0x3f80 is not a NaN bit pattern of bfloat16"),
])
def test_profile_values_the_model_cannot_use_are_refused_at_load(tmp_path, edit, match):
    with pytest.raises(ValueError, match=match):
        cpemu.get_profile(_profile_copy(tmp_path, edit))


@pytest.mark.parametrize("damage, match", [
    (lambda p: p.unlink(), r"split-K point table 'hopper-h200-torch.splitk.json' \(table_file\) is not readable"),
    (lambda p: p.write_text("{not json"), r"split-K point table .* is not readable: JSONDecodeError"),
    (lambda p: p.write_text('{"shapes": 5}'), r"split-K point table .* is not readable: TypeError"),
])
def test_broken_point_table_names_the_file(tmp_path, damage, match):
    path = _profile_copy(tmp_path, lambda d: None)
    damage(tmp_path / "hopper-h200-torch.splitk.json")
    with pytest.raises(ValueError, match=match):
        cpemu.gemm(SPLIT["a"], SPLIT["b"], profile=path)


def test_broken_complete_table_names_the_file(tmp_path):
    doc = {}

    def edit(d):
        d["modes"]["tensorwise"]["split_k"]["params"]["table_file"] = "empty.json"
        doc.update(d)
    path = _profile_copy(tmp_path, edit)
    (tmp_path / "empty.json").write_text('{"shapes": [], "tables": {}}')
    (tmp_path / "hopper-h200-torch.splitk-complete.npz").write_bytes(b"not an npz")
    with pytest.raises(ValueError, match=r"complete split-K table 'hopper-h200-torch.splitk-complete.npz' "
                                         r"\(complete_file\) is not readable"):
        cpemu.gemm(SPLIT["a"], SPLIT["b"], profile=path)


def _npy_with_header(path, header: dict, payload: bytes = b"\0" * 64):
    h = repr(header).encode("latin1")
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + payload)
    return str(path)


@pytest.mark.parametrize("header, match", [
    ({"descr": "<f1", "fortran_order": False, "shape": (10 ** 20,)}, r"says float8_e5m2 codes of shape \(100000000000000000000,\)"),
    ({"descr": "<f1", "fortran_order": False, "shape": (2 ** 40, 16)}, r"and the file holds 64"),
    ({"descr": "<f1", "fortran_order": False, "shape": (-1, 16)}, r"not a tuple of sizes"),
    ({"descr": "|u1", "fortran_order": False, "shape": (2 ** 40, 16)}, r"its header says shape \(1099511627776, 16\) of uint8"),
    ({"descr": "|u1", "fortran_order": False, "shape": (1.5, 16)}, r"shape is not valid"),
])
def test_cli_npy_header_is_checked_before_allocating(tmp_path, header, match):
    a = _npy_with_header(tmp_path / "a.npy", header)
    b = str(tmp_path / "b.npy")
    np.save(b, np.zeros((32, 16), np.uint8))
    r = CliRunner().invoke(main, ["gemm", "--a", a, "--b", b])
    assert r.exit_code == 1 and "Error: a: " in r.output and "is not a readable .npy file of FP8 codes" in r.output, r.output
    assert __import__("re").search(match, r.output), r.output


def test_fp8linear_scalar_input():
    torch = pytest.importorskip("torch")
    import cpemu.torch as ct

    with pytest.raises(ValueError, match=r"^input: last dimension must be in_features = 64 \(got shape \(\)\)"):
        ct.FP8Linear(_w(), 1.0, 1.0)(torch.tensor(1.0))


def _truth_folder(tmp_path, edit_case, bits=None):
    """A one-case truth folder (its manifest valid) whose case record ``edit_case`` changes."""
    from cpemu.cases import Case, operands, sha256_arrays
    from cpemu.truth import file_sha256

    case = Case(16, 16, 32, data="uniform", out_dtype="float32")
    rec = dict(json.loads(json.dumps(case.to_json())), inputs_sha256=sha256_arrays(*operands(case)),
               output_shape=[16, 16], output_sha256="0" * 64, stored="bits", file="x.npz")
    files = {}
    if bits is not None:  # "case": 3 wrong-shaped rows under the case's id; else the arrays given
        np.savez(tmp_path / "x.npz", **({rec["id"]: np.zeros(3, np.uint32)} if bits == "case" else bits))
        files["x.npz"] = file_sha256(str(tmp_path / "x.npz"))
    edit_case(rec)
    man = dict(json.loads((__import__("pathlib").Path(__file__).parent / "data" / "h200" / "manifest.json").read_text()),
               cases=[rec], files=files)
    (tmp_path / "manifest.json").write_text(json.dumps(man))
    return str(tmp_path)


@pytest.mark.parametrize("edit, bits, match", [
    (lambda r: r.pop("file"), None, r"has stored bits but no 'file'"),
    (lambda r: None, {"other": np.zeros(3, np.uint32)}, r"truth file x.npz: holds no stored bits for case"),
    (lambda r: None, "case", r"stored bits \(x.npz\): uint32 of shape \(3,\) are not leading rows"),
])
def test_cli_verify_broken_case_records(tmp_path, edit, bits, match):
    r = CliRunner().invoke(main, ["verify", _truth_folder(tmp_path, edit, bits)])
    assert __import__("re").search(match, r.output), r.output


def test_cli_verify_refuses_operands_that_do_not_fit(tmp_path, monkeypatch):
    import cpemu.memory as mem

    monkeypatch.setattr(mem, "available_bytes", lambda: 1 << 30)
    folder = _truth_folder(tmp_path, lambda r: (r.update(M=65536, K=16384, id="big", stored="sha256"), r.pop("file")))
    r = CliRunner().invoke(main, ["verify", folder])
    assert "out: the (65536, 16) float32 output needs 0.00 GiB (plus 1.00 GiB of working memory" in r.output, r.output


def test_te_helpers_name_their_arguments(tmp_path):
    torch = pytest.importorskip("torch")
    import cpemu.torch as ct
    from cpemu.torch.te_state import load_checkpoint

    for kw, match in ((dict(amax=torch.ones(2)), r"^amax: must be one number"), (dict(amax="x"), r"^amax: must be one"),
                      (dict(amax=1.0, margin="1"), r"^margin: must be an integer"),
                      (dict(amax=1.0, margin=5000), r"^margin: must be an integer from -126 to 126"),
                      (dict(amax=1.0, fp8_max=0), r"^fp8_max: must be a positive finite number")):
        with pytest.raises(ValueError, match=match):
            ct.delayed_scaling_scale(**kw)
    assert ct.delayed_scaling_scale(2.0, margin=np.int64(1)).item() == 112.0
    with pytest.raises(ValueError, match=r"^x: must be a torch tensor"):
        ct.quantize_e4m3([1.0], 1.0)
    with pytest.raises(ValueError, match=r"^scale: must be one number"):
        ct.quantize_e4m3(torch.ones(4), torch.ones(4))
    for w in (None, torch.zeros(0, 64), torch.zeros(32, 64, dtype=torch.bool)):
        with pytest.raises(ValueError, match=r"^weight: must be a non-empty 2-D bf16/fp16/fp32 tensor"):
            ct.FP8Linear.from_weight(w, input_amax=3.0)
    with pytest.raises(ValueError, match=r"^weight_fp8: in_features and out_features must be positive multiples"):
        ct.FP8Linear(torch.zeros(0, 64).to(torch.float8_e4m3fn), 1.0, 1.0)
    (tmp_path / "t.txt").write_text("not a checkpoint")
    (tmp_path / "e.pt").write_bytes(b"")
    torch.save([1, 2], tmp_path / "l.pt")
    for f, match in ((str(tmp_path / "t.txt"), r"is not a torch.save checkpoint"),
                     (str(tmp_path / "e.pt"), r"is not a torch.save checkpoint"),
                     (str(tmp_path / "l.pt"), r"holds a list, not a state dict"),
                     (None, r"must be a file path or a binary file object"), (5, r"must be a file path")):
        with pytest.raises(ValueError, match=rf"^checkpoint: .*{match}"):
            load_checkpoint(f)


@pytest.mark.parametrize("args, match", [
    (["run", "--k-step", "0"], "'--k-step': 0 is not in the range x>=16"),
    (["run", "--k-step", "24"], "--k-step must be a multiple of 16"),
    (["run", "--jobs", "0"], "'--jobs': 0 is not in the range x>=1"),
    (["run", "--seconds", "nan"], "--seconds finite"),
    (["run", "--n-max", "100000000000"], "'--n-max': 100000000000 is not in the range 16<=x<=131072"),
    (["status"], "Directory"), (["merge", "--out", "o.npz"], "Directory"),
])
def test_splitk_enum_cli_checks_its_options(tmp_path, args, match):
    from cpemu.recording.splitk_enum import cli

    folder = str(tmp_path / "missing")
    r = CliRunner().invoke(cli, args[:1] + ["--dir", folder] + args[1:])
    assert r.exit_code == 2 and match in r.output, r.output
    assert not (tmp_path / "missing").exists()  # nothing written before the checks


def test_dispatch_and_patch_arguments():
    pytest.importorskip("torch")
    import cpemu.torch as ct

    for keys in (None, 5, "CPU"):
        with pytest.raises(ValueError, match=r"^keys: must be a tuple of dispatch keys"):
            ct.dispatch(keys=keys)
    for cm, name in ((ct.patch(), "patch"), (ct.dispatch(), "dispatch")):
        with pytest.raises(RuntimeError, match=rf"^{name}: __exit__ without a matching __enter__"):
            cm.__exit__(None, None, None)
