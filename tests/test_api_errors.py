"""Bad input to ``cpemu.gemm`` is refused with a ValueError that names the argument
and the rule; the ``cpemu`` command line reports such errors as one ``Error:`` line.

The API tests run on a test profile built here (a ``Profile`` instance, which
``get_profile`` accepts), so they do not depend on the data of the shipped profiles.
"""

from __future__ import annotations

import copy
import json
import re

import jsonschema
import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

import cpemu
from cpemu import Profile, ProfileFeatureError, gemm
from cpemu.cli import main
from cpemu.instruction import HOPPER_SM90A
from cpemu.profile import load_schema
from cpemu.profile import profiles as shipped_profiles

E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
BF16 = ml_dtypes.bfloat16


def _mode():
    return {
        "kernel": "test kernel",
        "promotion_interval": 4,
        "split_k": {"kind": "none", "source": "test"},
        "reduction": {"order": "slice-ascending", "precision": "fp32", "rounding": "rn"},
        "epilogue": {"order": "acc*(sa*sb)", "bias": "fp32-rn-add-after-scaling", "source": "test"},
        "out_dtypes": ["bfloat16", "float16", "float32"],
        "bias_dtypes": {"bfloat16": "bfloat16", "float16": "float16", "float32": None},
    }


TEST_DATA = {
    "schema_version": 1, "name": "hopper-test-torch", "arch": "hopper", "device": "test device",
    "library": "test library", "caller": "torch._scaled_mm", "summary": "profile for the error tests",
    "instruction": HOPPER_SM90A.to_json(),
    "formats": [["e4m3", "e4m3"], ["e4m3", "e5m2"], ["e5m2", "e4m3"]],
    "modes": {"tensorwise": _mode(), "rowwise": _mode()},
    "verification": {"status": "instruction-model-only", "method": "test", "truth": None, "counts": {}},
    "provenance": {},
}
PROF = Profile("hopper-test-torch", TEST_DATA)

_tw = copy.deepcopy(TEST_DATA)
_tw["name"] = "hopper-tensorwise-torch"
del _tw["modes"]["rowwise"]
_tw["modes"]["tensorwise"]["out_dtypes"] = ["bfloat16", "float32"]
TENSORWISE_ONLY = Profile("hopper-tensorwise-torch", _tw)


def test_test_profiles_are_valid():
    for p in (PROF, TENSORWISE_ONLY):
        jsonschema.validate(p.data, load_schema("profile"))


def mats(M=4, K=32, N=16, fa=E4M3, fb=E4M3, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 0x70, (M, K), dtype=np.uint8).view(fa)
    b = rng.integers(0, 0x70, (K, N), dtype=np.uint8).view(fb)
    return a, b


_DEFAULT = object()


def run(a=_DEFAULT, b=_DEFAULT, **kw):
    if a is _DEFAULT:
        a, b = mats()
    kw.setdefault("profile", PROF)
    return gemm(a, b, **kw)


def test_valid_call_works():
    y = run()
    assert y.shape == (4, 16) and y.dtype == np.dtype(BF16)


# --------------------------------------------------------------------------- operands

@pytest.mark.parametrize("dtype", [np.float32, BF16, np.uint8, np.int8, np.float16])
@pytest.mark.parametrize("which", ["a", "b"])
def test_operand_dtype(which, dtype):
    a, b = mats()
    if which == "a":
        a = a.view(np.uint8).astype(dtype)
    else:
        b = b.view(np.uint8).astype(dtype)
    with pytest.raises(ValueError, match=rf"^{which}: dtype must be ml_dtypes float8_e4m3fn or float8_e5m2"):
        run(a, b)


@pytest.mark.parametrize("bad", [[[1.0] * 32] * 4, 3.0, None, "x"])
@pytest.mark.parametrize("which", ["a", "b"])
def test_operand_not_an_array(which, bad):
    a, b = mats()
    args = (bad, b) if which == "a" else (a, bad)
    with pytest.raises(ValueError, match=rf"^{which}: must be a numpy array"):
        run(*args)


@pytest.mark.parametrize("shape", [(32,), (2, 4, 32)])
def test_a_not_2d(shape):
    a = np.zeros(shape, np.uint8).view(E4M3)
    _, b = mats()
    with pytest.raises(ValueError, match=r"^a: must be a 2-D matrix"):
        run(a, b)


@pytest.mark.parametrize("shape", [(32,), (1, 32, 16)])
def test_b_not_2d(shape):
    a, _ = mats()
    b = np.zeros(shape, np.uint8).view(E4M3)
    with pytest.raises(ValueError, match=r"^b: must be a 2-D matrix"):
        run(a, b)


def test_k_mismatch():
    a, _ = mats(K=32)
    _, b = mats(K=48)
    with pytest.raises(ValueError, match=re.escape("b: must have shape (K, N) with K = a.shape[1] = 32")):
        run(a, b)


@pytest.mark.parametrize("K", [8, 24, 40])
def test_k_not_multiple_of_16(K):
    a, b = mats(K=K)
    with pytest.raises(ValueError, match=r"^a: K \(a\.shape\[1\]\) must be a positive multiple of 16"):
        run(a, b)


@pytest.mark.parametrize("N", [8, 24])
def test_n_not_multiple_of_16(N):
    a, b = mats(N=N)
    with pytest.raises(ValueError, match=r"^b: N \(b\.shape\[1\]\) must be a positive multiple of 16"):
        run(a, b)


def test_zero_k_and_zero_n():
    a, b = mats(K=0)
    with pytest.raises(ValueError, match=r"^a: K .* positive multiple of 16"):
        run(a, b)
    a, b = mats(N=0)
    with pytest.raises(ValueError, match=r"^b: N .* positive multiple of 16"):
        run(a, b)


def test_zero_m_gives_empty_like_torch():
    a, b = mats(M=0)
    y = run(a, b)
    assert y.shape == (0, 16)


@pytest.mark.parametrize("M", [1, 3, 17])
def test_any_m_works(M):
    a, b = mats(M=M)
    assert run(a, b).shape == (M, 16)


def test_transposed_view_b_works():
    a, b = mats()
    bt = np.ascontiguousarray(b.T)
    assert np.array_equal(run(a, bt.T).view(np.uint16), run(a, b).view(np.uint16))


# --------------------------------------------------------------------------- scales

def test_scale_a_vector_m():
    with pytest.raises(ValueError, match=r"^scale_a: scales must both have one element \(tensorwise\), or be scale_a of shape \(M, 1\) = \(4, 1\) and scale_b of shape \(1, N\) = \(1, 16\)"):
        run(scale_a=np.ones(4, np.float32), scale_b=np.ones((1, 16), np.float32))


def test_scale_b_vector_n():
    with pytest.raises(ValueError, match=r"^scale_b: scales must both have one element \(tensorwise\), or be scale_a of shape \(M, 1\) = \(4, 1\) and scale_b of shape \(1, N\) = \(1, 16\)"):
        run(scale_a=np.ones((4, 1), np.float32), scale_b=np.ones(16, np.float32))


def test_scale_b_wrong_orientation():
    with pytest.raises(ValueError, match=r"^scale_b: scales must both have one element \(tensorwise\), or be scale_a of shape \(M, 1\) = \(4, 1\) and scale_b of shape \(1, N\) = \(1, 16\).*scale_b shape \(16, 1\)"):
        run(scale_a=np.ones((4, 1), np.float32), scale_b=np.ones((16, 1), np.float32))


def test_scale_a_wrong_orientation():
    with pytest.raises(ValueError, match=r"^scale_a: scales must both have one element \(tensorwise\), or be scale_a of shape \(M, 1\) = \(4, 1\) and scale_b of shape \(1, N\) = \(1, 16\).*scale_a shape \(1, 4\)"):
        run(scale_a=np.ones((1, 4), np.float32), scale_b=np.ones((1, 16), np.float32))


def test_only_a_rowwise():
    with pytest.raises(ValueError, match=r"^scale_b: scales must both have one element \(tensorwise\), or be scale_a of shape \(M, 1\) = \(4, 1\) and scale_b of shape \(1, N\) = \(1, 16\)"):
        run(scale_a=np.ones((4, 1), np.float32), scale_b=1.0)


def test_only_b_rowwise():
    with pytest.raises(ValueError, match=r"^scale_a: scales must both have one element \(tensorwise\), or be scale_a of shape \(M, 1\) = \(4, 1\) and scale_b of shape \(1, N\) = \(1, 16\)"):
        run(scale_a=np.float32(2.0), scale_b=np.ones((1, 16), np.float32))


def test_rowwise_works():
    y = run(scale_a=np.full((4, 1), 2.0, np.float32), scale_b=np.full((1, 16), 0.5, np.float32))
    assert np.array_equal(y.view(np.uint16), run().view(np.uint16))


def test_scale_1x1_is_tensorwise():
    one = np.ones((1, 1), np.float32)
    assert np.array_equal(run(scale_a=one, scale_b=one).view(np.uint16), run().view(np.uint16))


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
@pytest.mark.parametrize("which", ["scale_a", "scale_b"])
def test_scale_array_not_float32(which, dtype):
    with pytest.raises(ValueError, match=rf"^{which}: must be a float32 scalar or array"):
        run(**{which: np.array(1, dtype=dtype)})


def test_scale_rowwise_not_float32():
    with pytest.raises(ValueError, match=r"^scale_a: must be a float32 scalar or array"):
        run(scale_a=np.ones((4, 1), np.float64), scale_b=np.ones((1, 16), np.float32))


@pytest.mark.parametrize("bad", [True, "1.0", [1.0], None])
def test_scale_not_a_number(bad):
    with pytest.raises(ValueError, match=r"^scale_a: must be a float"):
        run(scale_a=bad)


@pytest.mark.parametrize("value", [
    float("inf"), -float("inf"),
    np.float32("inf"),
    np.array(np.inf, np.float32), np.array([np.nan], np.float32),
    pytest.param("rowwise-nan", id="rowwise-nan"),
])
def test_scale_not_finite(value):
    if isinstance(value, str):
        sa = np.ones((4, 1), np.float32)
        sa[2, 0] = np.nan
        with pytest.raises(ValueError, match=r"^scale_a: must be finite"):
            run(scale_a=sa, scale_b=np.ones((1, 16), np.float32))
        return
    with pytest.raises(ValueError, match=r"^scale_a: must be finite"):
        run(scale_a=value)


@pytest.mark.parametrize("value", [float("nan"), np.float32("nan")])
def test_scale_python_nan_says_finite(value):
    with pytest.raises(ValueError, match=r"^scale_a: must be finite"):
        run(scale_a=value)


def test_scale_python_nan_is_refused():
    with pytest.raises(ValueError, match=r"^scale_a: "):
        run(scale_a=float("nan"))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e39 -> float32 inf
@pytest.mark.parametrize("value", [0.1, 1 / 3, 1e-50, 1e39])
def test_python_scale_not_exact_in_float32(value):
    # torch._scaled_mm takes float32 tensors; a Python float that float32 cannot hold
    # exactly is refused rather than rounded silently.
    with pytest.raises(ValueError, match=r"^scale_b: a Python scalar scale must be exactly representable in float32"):
        run(scale_b=value)


@pytest.mark.parametrize("value", [2, 0.5, np.float32(0.1), np.array(0.1, np.float32), np.array([3.0], np.float32)])
def test_exact_scales_work(value):
    run(scale_a=value)


# --------------------------------------------------------------------------- bias, out_dtype, fast_accum

@pytest.mark.parametrize("bias", [np.zeros(16, np.float32), np.zeros(16, np.uint16), [0.0] * 16, 1.0])
def test_bias_wrong_dtype(bias):
    with pytest.raises(ValueError, match=r"^bias: must be a numpy array of ml_dtypes bfloat16 or float16"):
        run(bias=bias)


@pytest.mark.parametrize("shape", [(15,), (4,), (1, 16), (4, 16), ()])
def test_bias_wrong_shape(shape):
    with pytest.raises(ValueError, match=re.escape("bias: must have shape (N,) = (16,)")):
        run(bias=np.zeros(shape, BF16))


def test_bias_dtype_not_matching_out_dtype():
    with pytest.raises(ProfileFeatureError, match=r"^bias must have dtype bfloat16 for out_dtype='bfloat16'"):
        run(bias=np.zeros(16, np.float16))


def test_bias_with_float32_output():
    with pytest.raises(ProfileFeatureError, match=r"bias is not supported with out_dtype='float32'"):
        run(bias=np.zeros(16, BF16), out_dtype="float32")


def test_bias_works():
    y = run(bias=np.ones(16, BF16))
    assert y.shape == (4, 16)


@pytest.mark.parametrize("out_dtype", ["bf16", "fp8", "float64", None, np.float32])
def test_unknown_out_dtype(out_dtype):
    with pytest.raises(ValueError, match=r"^out_dtype: must be one of \['bfloat16', 'float16', 'float32'\]"):
        run(out_dtype=out_dtype)


@pytest.mark.parametrize("fast_accum", [1, "yes", None])
def test_fast_accum_not_bool(fast_accum):
    with pytest.raises(ValueError, match=r"^fast_accum: must be a bool"):
        run(fast_accum=fast_accum)


# --------------------------------------------------------------------------- profile, backend

@pytest.mark.parametrize("name", ["no-such-profile", "", "hopper"])
def test_unknown_profile(name):
    with pytest.raises(ValueError, match=r"^profile: unknown profile"):
        run(profile=name)


@pytest.mark.parametrize("backend", ["cuda", "gpu", "", None])
def test_unknown_backend(backend):
    with pytest.raises(ValueError, match=r"^backend: must be 'auto' or one of"):
        run(backend=backend)


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_known_backends(backend):
    run(backend=backend)


def test_rowwise_not_recorded():
    with pytest.raises(ProfileFeatureError, match=r"profile 'hopper-tensorwise-torch' does not record rowwise scaling"):
        run(profile=TENSORWISE_ONLY, scale_a=np.ones((4, 1), np.float32), scale_b=np.ones((1, 16), np.float32))


def test_out_dtype_not_recorded():
    with pytest.raises(ProfileFeatureError, match=r"does not record out_dtype='float16' with tensorwise scaling"):
        run(profile=TENSORWISE_ONLY, out_dtype="float16")


def test_format_pair_not_recorded():
    a, b = mats(fa=E5M2, fb=E5M2)
    with pytest.raises(ProfileFeatureError, match=r"does not support operand formats a=e5m2, b=e5m2"):
        run(a, b)


def test_profiles_function_not_shadowed():
    cpemu.get_profile(PROF)
    shipped_profiles()  # imports the cpemu.profiles data package
    assert callable(cpemu.profiles)


def test_profile_errors_are_value_errors():
    assert issubclass(ProfileFeatureError, ValueError)
    assert issubclass(cpemu.UnsupportedShape, ValueError)


# --------------------------------------------------------------------------- command line

@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def profile_file(tmp_path):
    p = tmp_path / "hopper-test-torch.json"
    p.write_text(json.dumps(TEST_DATA))
    return str(p)


def test_cli_info(runner):
    r = runner.invoke(main, ["info"])
    assert r.exit_code == 0, r.output
    for name in shipped_profiles():
        assert name in r.output
    assert "reference" in r.output and "Backends" in r.output and "Devices" in r.output


def test_cli_info_json(runner):
    r = runner.invoke(main, ["info", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [p["name"] for p in d["profiles"]] == shipped_profiles()
    for p in d["profiles"]:
        assert p["verification"]["status"] in ("recorded", "instruction-model-only")
        assert {"L", "F", "rounding", "e_zero"} <= set(p["instruction"])
        assert set(p["modes"]) <= {"tensorwise", "rowwise"}
    names = [b["name"] for b in d["backends"]]
    assert names == ["cublaslt-tc", "cuda-rzacc", "cuda-tiled", "cuda-simple", "cpu-fp32", "reference"]
    assert next(b for b in d["backends"] if b["name"] == "reference")["available"] is True
    assert d["devices"]["cpu"]["cpu_count"] >= 1


class _FakeRuntime:
    def __init__(self, count=0, exc=None):
        self.count, self.exc = count, exc

    def getDeviceCount(self):
        if self.exc:
            raise self.exc
        return self.count

    def getDeviceProperties(self, i):
        return {"name": b"NVIDIA H200", "major": 9, "minor": 0, "totalGlobalMem": 141 * 2 ** 30}


def _fake_cupy(monkeypatch, runtime):
    import sys
    import types

    mod = types.ModuleType("cupy")
    mod.__version__ = "0.0-test"
    mod.cuda = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "cupy", mod)


def test_cli_info_cuda_not_usable(runner, monkeypatch):
    _fake_cupy(monkeypatch, _FakeRuntime(exc=RuntimeError("cudaErrorNoDevice: no CUDA-capable device")))
    d = json.loads(runner.invoke(main, ["info", "--json"]).stdout)
    for name in ("cuda-rzacc", "cuda-tiled", "cuda-simple"):
        b = next(b for b in d["backends"] if b["name"] == name)
        assert b["available"] is False and b["detail"]
    assert d["devices"]["cuda"] == []


def test_cli_info_lists_cuda_devices(runner, monkeypatch):
    _fake_cupy(monkeypatch, _FakeRuntime(count=1))
    d = json.loads(runner.invoke(main, ["info", "--json"]).stdout)
    assert d["devices"]["cuda"][0]["name"] == "NVIDIA H200"


@pytest.mark.skipif(cpemu.DEFAULT_PROFILE not in shipped_profiles(), reason="the default profile is not shipped")
def test_cli_gemm_demo_default_profile(runner):
    r = runner.invoke(main, ["gemm", "--demo", "evo2-1b", "--M", "1"])
    assert r.exit_code == 0, r.output
    assert re.search(r"sha256:\s+[0-9a-f]{64}", r.output)
    assert "M=1 N=5760 K=1920" in r.output and "split-K slice" in r.output


def test_cli_gemm_demo_json_matches_api(runner, profile_file):
    r = runner.invoke(main, ["gemm", "--demo", "evo2-1b", "--M", "1", "--profile", profile_file,
                             "--out-dtype", "float32", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    from cpemu.cases import Case, operands

    a, bt, *_ = operands(Case(1, 5760, 1920, data="gauss40", seed=0))
    y = gemm(a.view(E4M3), bt.view(E4M3).T, profile=PROF, out_dtype="float32")
    import hashlib

    assert d["sha256"] == hashlib.sha256(y.tobytes()).hexdigest()
    assert d["plan"]["splits"] == 1 and d["plan"]["promotion"] is None
    assert (d["M"], d["N"], d["K"]) == (1, 5760, 1920)


def test_cli_gemm_files_and_out(runner, profile_file, tmp_path):
    a, b = mats(M=3, K=64, N=32)
    np.save(tmp_path / "a.npy", a.view(np.uint8))
    np.save(tmp_path / "bt.npy", np.ascontiguousarray(b.T).view(np.uint8))
    out = tmp_path / "y.npy"
    r = runner.invoke(main, ["gemm", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "bt.npy"),
                             "--b-transposed", "--profile", profile_file, "--out", str(out)])
    assert r.exit_code == 0, r.output
    y = np.load(out)
    assert y.dtype == np.uint16  # bf16 bit patterns
    assert np.array_equal(y, gemm(a, b, profile=PROF).view(np.uint16))


@pytest.mark.parametrize("args,message", [
    (["--scale-a", "inf"], "Error: scale_a: must be finite"),
    (["--scale-b", "nan"], "Error: scale_b: must be finite"),
    (["--scale-b", "1e39"], "Error: scale_b: 1e+39 overflows float32"),
    (["--backend", "cuda"], "Error: backend: must be 'auto' or one of"),
    (["--profile", "no-such-profile"], "Error: profile: unknown profile"),
    (["--a-format", "e5m2", "--b-format", "e5m2"], "Error: profile 'hopper-test-torch' does not support"),
    (["--out-dtype", "fp8"], "Error: Invalid value for '--out-dtype'"),
])
def test_cli_gemm_bad_argument(runner, profile_file, args, message):
    if "--profile" not in args:
        args = args + ["--profile", profile_file]
    r = runner.invoke(main, ["gemm", "--demo", "evo2-1b", "--M", "1"] + args)
    assert r.exit_code != 0
    assert message in r.output
    assert "Traceback" not in r.output


def test_cli_gemm_scale_rounded_to_float32(runner, profile_file):
    # The API refuses 0.1 (not exact in float32); the command line rounds it as torch.tensor(0.1) does.
    r = runner.invoke(main, ["gemm", "--demo", "evo2-1b", "--M", "1", "--profile", profile_file,
                             "--scale-a", "0.1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["scale_a"] == float(np.float32(0.1))
    assert any("not exactly representable in float32" in n for n in d["notes"])


def test_cli_gemm_bad_file(runner, profile_file, tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 32), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((32, 16), np.uint8))
    r = runner.invoke(main, ["gemm", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"),
                             "--profile", profile_file])
    assert r.exit_code != 0 and "Error: a:" in r.output and "float32" in r.output


def _truth_folder(folder, corrupt: bool):
    """A tiny truth recording made with cpemu itself (optionally with one flipped bit)."""
    from cpemu.cases import Case, sha256_arrays
    from cpemu.truth import _inputs_for_gemm, file_sha256

    cases = [Case(16, 16, 32, data="gauss40", seed=1, out_dtype="float32"),
             Case(3, 32, 64, data="uniform", seed=2, scale="tensor"),
             Case(16, 16, 32, a_format="e5m2", b_format="e5m2")]
    recs, bits = [], {}
    for i, c in enumerate(cases):
        A, B, sa, sb, bias, raw = _inputs_for_gemm(c)
        rec = dict(c.to_json(), inputs_sha256=sha256_arrays(*raw))
        if c.a_format == "e5m2":
            rec["error"] = "torch rejects e5m2 x e5m2"
        else:
            y = gemm(A, B, profile=PROF, scale_a=sa, scale_b=sb, out_dtype=c.out_dtype)
            g = y.view(np.uint32 if y.dtype == np.float32 else np.uint16).copy()
            if corrupt and i == 1:
                g[2, 5] ^= 1
            bits[c.id] = g
            rec.update(output_sha256=sha256_arrays(g), output_shape=list(g.shape), stored="bits", file="t.npz")
        recs.append(rec)
    np.savez(folder / "t.npz", **bits)
    man = {"schema_version": 1, "profile": "hopper-test-torch",
           "provenance": {"gpu": "-", "driver": "-", "torch": "-", "torch_cuda": "-", "cublaslt": {}, "sm_count": 1},
           "generator": {"module": "cpemu.cases", "tool": "test", "seed_scheme": "test"},
           "files": {"t.npz": file_sha256(str(folder / "t.npz"))}, "cases": recs}
    (folder / "manifest.json").write_text(json.dumps(man))


@pytest.mark.parametrize("corrupt", [False, True])
def test_cli_verify(runner, profile_file, tmp_path, corrupt):
    _truth_folder(tmp_path, corrupt)
    r = runner.invoke(main, ["verify", str(tmp_path), "--profile", profile_file])
    assert "rejected-both" in r.stdout and "out-float32" in r.stdout
    if corrupt:
        assert r.exit_code == 1, r.output
        assert "MISMATCH 3x32x64" in r.stdout and "[2,5]" in r.stdout
    else:
        assert r.exit_code == 0, r.output
        assert "MISMATCH" not in r.stdout
    assert "3/3 cases" in r.stderr


def test_cli_verify_missing_manifest(runner, tmp_path):
    r = runner.invoke(main, ["verify", str(tmp_path)])
    assert r.exit_code != 0 and "Error:" in r.output and "Traceback" not in r.output


# ---------------------------------------------------------------- gemm_cuda's static checks
# (kernels._static_config runs on the CPU: everything gemm_cuda checks but the arrays, cached
# per call signature; a refused signature must be refused on every call, not only the first)

def _static_args(**kw):
    from cpemu.schedule import Plan

    args = dict(a_format="e4m3", b_format="e4m3", plan=Plan(slices=((0, 64),), promotion=None),
                model=HOPPER_SM90A, K=64, order_name="acc*(sa*sb)", out_dtype="bfloat16", nan_raw=None)
    args.update(kw)
    return args


@pytest.mark.parametrize("kw, arg", [
    (dict(a_format="e4m4"), "a_format"),
    (dict(b_format="fp16"), "b_format"),
    (dict(model="hopper"), "model"),
    (dict(plan="unsplit"), "plan"),
    (dict(K=32), "plan"),
    (dict(order_name="acc*sa*sb"), "mode"),
    (dict(out_dtype="float64"), "out_dtype"),
])
def test_static_checks_refuse_every_time(kw, arg):
    from cpemu.cuda.kernels import _static_config

    for _ in range(3):
        with pytest.raises(ValueError, match=rf"^{arg}: "):
            _static_config(**_static_args(**kw))


def test_static_checks_cached_result_is_the_checked_one():
    from cpemu.cuda.kernels import _static_config
    from cpemu.schedule import Plan

    plan = Plan(slices=((0, 32), (32, 64)), promotion=4)
    got = _static_config(**_static_args(plan=plan, nan_raw=0x7FC0, out_dtype="float16"))
    assert got == _static_config.__wrapped__(**_static_args(plan=plan, nan_raw=0x7FC0, out_dtype="float16"))
    fa, fb, L, F, R, slices, promotion, order, nan_bits = got
    assert (fa.name, fb.name, L, F, R) == ("e4m3", "e4m3", 32, 13, 13)
    assert (slices, promotion, order, nan_bits) == (((0, 32), (32, 64)), 4, 0, 0x7FC0)


def test_static_checks_unhashable_argument_still_refused():
    from cpemu.cuda.kernels import _static_config

    with pytest.raises(TypeError):  # what gemm_cuda catches before calling the unwrapped checks
        _static_config(**_static_args(plan=[(0, 64)]))
    with pytest.raises(ValueError, match="^plan: must be a cpemu.schedule.Plan"):
        _static_config.__wrapped__(**_static_args(plan=[(0, 64)]))
