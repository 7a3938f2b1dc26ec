"""tools/bench_kernels.py: the CPU smoke run, the exit status on a wrong output, and (with a
stand-in for cupy, nvidia-smi and the GPU parts of torch) the CUDA and native code paths."""

import importlib.util
import json
import stat
import sys
import time
import types
from contextlib import nullcontext
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

import cpemu
from cpemu import reference as ref
from cpemu.formats import FP8_FORMATS, OUT_DTYPES, encode_output

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["--kernels", "reference", "--shape", "64x32", "--M", "16", "--window-s", "0.05", "--windows", "3",
         "--no-native"]


def _tool():
    spec = importlib.util.spec_from_file_location("cpemu_tools_bench_kernels", ROOT / "tools" / "bench_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _tool()
sys.path.insert(0, str(ROOT / "tools"))  # the tool's own modules
from benchkit import clocks, gpu, kernels_record, options, provenance, timing  # noqa: E402


def _run(args, out):
    result = CliRunner().invoke(bench.main, args + ["--out", str(out)], catch_exceptions=False)
    data = json.loads(out.read_text()) if out.exists() else None
    return result, data


def test_smoke_reference_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(clocks, "find_nvidia_smi", lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", None)  # the reference path must not import cupy
    result, d = _run(SMOKE, tmp_path / "b.json")
    assert result.exit_code == 0, result.output
    assert d["complete"] is True and d["interrupted"] is False and d["failures"] == []
    assert d["tool"] == "tools/bench_kernels.py" and d["tool_version"] == kernels_record.TOOL_VERSION
    assert "--kernels reference" in d["command_line_explicit"] and "--no-native" in d["command_line_explicit"]
    assert d["kernels"] == ["reference"]
    assert d["device"] is None and d["clock"]["samples"] == [] and "nvidia-smi not found" in d["clock"]["note"]
    assert d["native"] == [] and d["native_setting"]["on"] is False
    for k in ("numpy", "ml_dtypes", "click"):
        assert d["packages"][k]
    assert [x["cpemu_cases_kind"] for x in d["config"]["data"]] == ["gauss40", "spread"]
    assert len(d["results"]) == 2
    for r in d["results"]:
        assert r["status"] == "ok" and r["kernel"] == "reference" and r["M"] == 16 and (r["N"], r["K"]) == (64, 32)
        assert r["timing"] == "windows" and len(r["windows_ms_per_call"]) == 3
        assert all(w >= 0.05 for w in r["window_s"])
        assert r["ms"] == pytest.approx(sorted(r["windows_ms_per_call"])[1])
        assert r["tmacs"] == pytest.approx(16 * 64 * 32 / (r["ms"] / 1e3) / 1e12)
        assert r["clock"] is None and r["mac_per_clock_per_sm"] is None
        assert len(r["output_sha256"]) == 64
    assert len(d["exactness"]) == 2
    for e in d["exactness"]:
        assert e["ok"] is True and e["vs_reference_rows"]["ok"] is True
        assert e["vs_reference_rows"]["rows"] == 2 and e["vs_reference_rows"]["compared"] == 2 * 64
    table = [line.split() for line in result.output.splitlines() if line.startswith("64x32")]
    assert [row[-1] for row in table] == ["rows", "rows"]  # reference rows compared; no cuda-simple here


def test_corrupted_output_exits_1(tmp_path, monkeypatch):
    monkeypatch.setattr(clocks, "find_nvidia_smi", lambda: None)
    real = cpemu.gemm

    def corrupted(*args, **kw):
        y = np.array(real(*args, **kw))
        y.view(np.uint16)[1, 5] ^= 1
        return y

    monkeypatch.setattr(cpemu, "gemm", corrupted)
    result, d = _run(SMOKE, tmp_path / "b.json")
    assert result.exit_code == 1
    assert d is not None and d["complete"] is True  # the JSON is written before the exit
    bad = [e for e in d["exactness"] if e["ok"] is False]
    assert len(bad) == 2
    assert bad[0]["vs_reference_rows"]["mismatches"] == 1
    assert bad[0]["vs_reference_rows"]["first_mismatches"][0]["at"] == [1, 5]
    assert any("differ from the reference" in f for f in d["failures"])


def test_parsing():
    assert options.parse_shape("evo2-40b") == ("evo2-40b", 24576, 8192)
    assert options.parse_shape("EVO2-1B") == ("evo2-1b", 5760, 1920)
    assert options.parse_shape("64x32") == ("64x32", 64, 32)
    for bad in ("64x33", "64", "axb", "0x16"):
        with pytest.raises(click.BadParameter, match="NxK|multiples"):
            options.parse_shape(bad)
    assert options.parse_data("gauss40,adversarial") == [("gauss40", "gauss40"), ("adversarial", "spread")]
    with pytest.raises(click.BadParameter, match="data kind"):
        options.parse_data("nonsense")
    with pytest.raises(click.BadParameter, match="LADDER"):
        options.parse_kernels("cuda-tiled,cuda-fast")
    assert options.parse_int_list("16, 64", "--M") == [16, 64]


def test_cli_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(clocks, "find_nvidia_smi", lambda: None)
    r = CliRunner().invoke(bench.main, ["--kernels", "nonsense", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "LADDER" in r.output
    r = CliRunner().invoke(bench.main, SMOKE + ["--profile", "no-such-profile", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2


def test_reference_cap_and_unsupported_shape(tmp_path, monkeypatch):
    monkeypatch.setattr(clocks, "find_nvidia_smi", lambda: None)
    args = ["--kernels", "reference", "--shape", "64x32", "--shape", "16x16384", "--M", "16", "--data", "gauss40",
            "--window-s", "0.01", "--windows", "1", "--no-native", "--reference-max-macs", "1e3"]
    result, d = _run(args, tmp_path / "b.json")
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in d["results"]] == ["skipped", "skipped"]
    assert "reference-max-macs" in d["results"][0]["reason"]
    assert len(d["skipped"]) == 2


# ---------------------------------------------------------------- stand-ins for the GPU machine


class FakeArray(np.ndarray):
    """A numpy array that cpemu.api takes for a cupy array (its type's module is 'cupy')."""

    @property
    def device(self):
        return FAKE_DEVICE

    def get(self, stream=None, **kw):
        return np.array(self)


FakeArray.__module__ = "cupy"


class GpuClock:
    """The stand-in GPU's own time: events read it, and only a stand-in launch advances it (by its
    ``seconds``), so the timed windows do not depend on how busy the test machine is."""

    t = 0.0

    @classmethod
    def advance(cls, seconds: float) -> None:
        cls.t += seconds


FAKE_KERNEL_S = 1e-3  # what one stand-in CUDA kernel launch takes on the stand-in GPU
FAKE_NATIVE_S = 0.5e-3  # what one stand-in torch._scaled_mm takes


def _fake_cupy():
    cp = types.ModuleType("cupy")
    cp.__version__ = "0-fake"
    cuda = types.SimpleNamespace()

    class Stream:
        ptr = 1234

        def __init__(self, non_blocking=False):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def synchronize(self):
            pass

    class Event:
        def record(self, stream=None):
            self.t = GpuClock.t

        def synchronize(self):
            pass

    class Device:
        id = 0
        attributes = types.MappingProxyType({"MultiProcessorCount": 132})
        compute_capability = "90"
        pci_bus_id = "0000:18:00.0"

    cuda.Stream, cuda.Event, cuda.Device = Stream, Event, Device
    cuda.get_elapsed_time = lambda s, e: (e.t - s.t) * 1e3
    cuda.runtime = types.SimpleNamespace(
        getDeviceProperties=lambda i: {"name": b"NVIDIA H200 (fake)", "totalGlobalMem": 1 << 37},
        driverGetVersion=lambda: 13000, runtimeGetVersion=lambda: 13000, getDevice=lambda: 0,
        getDeviceCount=lambda: 1)
    cp.cuda = cuda
    cp.ndarray = FakeArray
    cp.asarray = lambda x: x if isinstance(x, FakeArray) else np.array(x).view(FakeArray)
    cp.asnumpy = lambda x, **kw: np.array(x)
    cp.count_nonzero = np.count_nonzero
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    return cp


FAKE_DEVICE = types.SimpleNamespace(id=0)


def _fake_gemm_cuda(corrupt=None):
    """gemm_cuda computed by the reference (and optionally corrupted for one kernel family)."""

    def gemm_cuda(kernel_family, a_codes, bt_codes, a_format, b_format, plan, model, mode, scale_a, scale_b,
                  bias_f32, out_dtype, *, defines=()):
        a, bt = np.asarray(a_codes), np.asarray(bt_codes)
        M, N = a.shape[0], bt.shape[0]
        sa, sb = np.asarray(scale_a, np.float32), np.asarray(scale_b, np.float32)
        sa = sa.reshape(()) if sa.size == 1 else sa.reshape(M, 1)
        sb = sb.reshape(()) if sb.size == 1 else sb.reshape(1, N)
        fa, fb = FP8_FORMATS[a_format], FP8_FORMATS[b_format]
        ao, bo = ref.decode(a, fa), ref.decode(bt, fb)
        out = np.empty((M, N), OUT_DTYPES[out_dtype])
        bias = None if bias_f32 is None else np.asarray(bias_f32, np.float32)
        for rb, cb in ref.blocks(M, N, model.L):
            acc = ref.accumulate(ao.rows(rb), bo.rows(cb), plan, model)
            y = ref.epilogue(acc, sa if sa.ndim == 0 else sa[rb], sb if sb.ndim == 0 else sb[:, cb],
                             None if bias is None else bias[cb], mode["epilogue"])
            out[rb, cb] = encode_output(y, out_dtype, (mode.get("nan_bits") or {}).get(out_dtype))
        bits = out.view(np.uint32 if out_dtype == "float32" else np.uint16).copy()
        if kernel_family == corrupt:
            bits[M - 1, N - 1] ^= 1
        GpuClock.advance(FAKE_KERNEL_S)
        return bits.view(FakeArray)

    return gemm_cuda


def _fake_launch(corrupt=None):
    """kernels.launch (the backends' path) computed by the same stand-in as gemm_cuda."""
    fake = _fake_gemm_cuda(corrupt)

    def launch(kernel_family, call, ops, **kw):
        mode = {"epilogue": call.epilogue.spec(), "nan_bits": {call.out_dtype: call.epilogue.nan_bits}}
        return fake(kernel_family, ops.a, ops.bt, call.a_format.name, call.b_format.name, call.plan, call.model,
                    mode, ops.scale_a, ops.scale_b, ops.bias, call.out_dtype)

    return launch


def _fake_nvidia_smi(tmp_path):
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n"
                   "case \"$*\" in\n"
                   "  *pci.bus_id*) echo '0, 00000000:18:00.0, NVIDIA H200, 580.159.04, 1980, 700.00';"
                   " echo '1, 00000000:2A:00.0, NVIDIA H200, 580.159.04, 1980, 700.00' ;;\n"
                   "  *clocks.sm*) echo '1980, 350.51, 45' ;;\n"
                   "  *) exit 9 ;;\n"
                   "esac\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    from cpemu import backends
    from cpemu.cuda import kernels

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    # cuBLASLt is not part of the stand-in (else its availability would depend on whether the
    # environment carries libcublasLt, as a CUDA build of torch does)
    monkeypatch.setattr(backends, "_available", {"cuda-tiled": (True, "fake"), "cuda-simple": (True, "fake"),
                                                 "cublaslt-tc": (False, "not part of the stand-in GPU")})
    monkeypatch.setattr(backends, "_validated", {})
    monkeypatch.setattr(kernels, "gemm_cuda", _fake_gemm_cuda())
    monkeypatch.setattr(kernels, "launch", _fake_launch())
    smi = _fake_nvidia_smi(tmp_path)
    monkeypatch.setattr(clocks, "find_nvidia_smi", lambda: smi)
    return kernels


GPU_ARGS = ["--kernels", "cuda-tiled,cuda-simple", "--shape", "64x32", "--M", "16,48", "--data", "gauss40",
            "--window-s", "0.02", "--windows", "2"]


def test_cuda_paths_with_stand_ins(tmp_path, fake_gpu):
    result, d = _run(GPU_ARGS + ["--no-native"], tmp_path / "b.json")
    assert result.exit_code == 0, result.output
    assert d["failures"] == [] and d["validation"]["cuda-tiled"]["ok"] is True
    assert d["device"]["sm_count"] == 132 and d["device"]["driver_version"] == "580.159.04"
    assert {r["tiled_module"] for r in d["results"] if r["kernel"] == "cuda-tiled"} == {"gemm_tiled_small_m"}
    assert d["clock"]["nvidia_smi_index"] == "0" and d["clock"]["samples"]
    assert d["clock"]["samples"][0][1:] == [1980.0, 350.51, 45.0]
    assert len(d["results"]) == 4
    for r in d["results"]:
        assert r["status"] == "ok" and r["timing"] == "windows" and r["call"].startswith("direct")
        assert len(r["windows_ms_per_call"]) == 2 and all(w >= 0.02 for w in r["window_s"])
        assert r["discarded_short_windows"] == [] and r["ms"] == pytest.approx(FAKE_KERNEL_S * 1e3, rel=1e-9)
        assert r["clock"]["sm_mhz_median"] == 1980.0
        assert r["mac_per_clock_per_sm"] == pytest.approx(r["macs"] / (r["ms"] / 1e3) / 1.98e9 / 132)
        assert r["api"]["matches_direct"]["ok"] is True and r["api"]["timing"] == "windows"
        assert r["host_ms_per_call"] is not None
    ex = {(e["kernel"], e["M"]): e for e in d["exactness"]}
    assert ex[("cuda-tiled", 48)]["vs_cuda_simple"]["ok"] is True
    assert ex[("cuda-tiled", 48)]["vs_cuda_simple"]["compared"] == 48 * 64
    assert all(e["ok"] for e in d["exactness"])
    table = [line.split() for line in result.output.splitlines() if line.startswith("64x32")]
    assert [row[-1] for row in table] == ["yes", "yes"]


def test_cuda_mismatch_caps_and_skips(tmp_path, fake_gpu, monkeypatch):
    monkeypatch.setattr(fake_gpu, "gemm_cuda", _fake_gemm_cuda(corrupt="cuda-tiled"))
    monkeypatch.setattr(fake_gpu, "launch", _fake_launch(corrupt="cuda-tiled"))
    args = GPU_ARGS + ["--no-native", "--max-call-s", "0", "--max-check-call-s", "1e-12"]
    result, d = _run(args, tmp_path / "b.json")
    assert result.exit_code == 1
    assert d["validation"]["cuda-tiled"]["ok"] is False  # the hard cases catch it too
    first = [r for r in d["results"] if r["M"] == 16]
    assert all(r["timing"] == "single-call" for r in first)
    assert all(r["status"] == "skipped" and "max-check-call-s" in r["reason"] for r in d["results"] if r["M"] == 48)
    tiled = next(e for e in d["exactness"] if e["kernel"] == "cuda-tiled" and e["M"] == 16)
    assert tiled["vs_cuda_simple"]["mismatches"] == 1 and tiled["vs_reference_rows"]["ok"] is True
    assert any("differs from cuda-simple" in f for f in d["failures"])


def test_native_path_with_cpu_torch(tmp_path, fake_gpu, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda ptr, device=None: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake")
    monkeypatch.setattr(gpu, "torch_device", lambda t, i: t.device("cpu"))
    scaled_mm = torch._scaled_mm

    def timed_scaled_mm(*a, **k):
        GpuClock.advance(FAKE_NATIVE_S)
        return scaled_mm(*a, **k)

    monkeypatch.setattr(torch, "_scaled_mm", timed_scaled_mm)
    result, d = _run(GPU_ARGS, tmp_path / "b.json")  # --native by default: torch "with CUDA" is importable
    assert result.exit_code == 0, result.output
    assert d["native_setting"]["on"] is True
    assert len(d["native"]) == 2
    for n in d["native"]:
        assert n["status"] == "ok" and n["tmacs"] > 0 and n["clock"]["sm_mhz_median"] == 1980.0
        assert set(n["kernel_tmacs_over_native"]) == {"cuda-tiled", "cuda-simple"}
        assert n["matches_cpemu"]["against"] == "cuda-simple" and n["matches_cpemu"]["compared"] == n["M"] * 64
    r = next(r for r in d["results"] if r["kernel"] == "cuda-tiled")
    assert r["vs_native"] == pytest.approx(r["tmacs"] / d["native"][0]["tmacs"])
    assert "native TMAC/s" in result.output


def test_clock_summary():
    s = clocks.ClockSampler("nvidia-smi", None)
    s.samples = [[10.0, 1500.0, 100.0, 40.0], [10.5, 1980.0, 300.0, 50.0], [11.0, 1970.0, None, 51.0],
                 [20.0, 1000.0, 90.0, 30.0]]
    c = s.summary(10.2, 11.2)
    assert c["samples"] == 2 and c["sm_mhz_median"] == 1975.0 and c["power_w_median"] == 300.0
    assert c["temp_c_max"] == 51.0 and c["nearest_only"] is False
    c = s.summary(19.5, 19.6)
    assert c["samples"] == 1 and c["nearest_only"] is True and c["sm_mhz_median"] == 1000.0
    assert s.summary(30.0, 31.0) is None
    assert clocks._pci_key("00000000:1B:00.0") == clocks._pci_key("0000:1b:00.0")
    assert clocks._num("[N/A]") is None and clocks._num(" 1980 ") == 1980.0


def test_time_device_windows_reach_the_window_length():
    cp = _fake_cupy()
    calls = []

    def launch():  # 1 ms on the stand-in GPU, at least 1.5 ms of host time: host-bound
        calls.append(1)
        GpuClock.advance(FAKE_KERNEL_S)
        time.sleep(0.0015)

    _, r = timing.time_device(cp, cp.cuda.Stream(), launch, window_s=0.03, windows=3, max_call_s=1.0,
                              warmup_s=0.02)
    assert r["timing"] == "windows" and len(r["window_s"]) == 3 and all(w >= 0.03 for w in r["window_s"])
    assert r["ms"] == pytest.approx(FAKE_KERNEL_S * 1e3, rel=1e-9) and r["warmup"]["s"] >= 0.02
    assert len(calls) == 1 + sum(b[0] for b in r["warmup"]["batches_n_gpu_s_host_s"]) \
        + sum(r["launches_per_window"]) + sum(w["launches"] for w in r["discarded_short_windows"])
    assert r["host_ms_per_call"] >= 1.5 and r["host_bound"] is True


def test_default_kernels_unavailable_and_api_only_backends(tmp_path, fake_gpu, monkeypatch):
    from cpemu import backends

    # default: every available CUDA backend of the ladder
    result, d = _run(GPU_ARGS[2:] + ["--no-native", "--M", "16"], tmp_path / "a.json")
    assert result.exit_code == 0, result.output
    assert d["kernels"] == ["cuda-tiled", "cuda-simple"]
    # a backend of the ladder without a direct launcher is timed through cpemu.gemm; a requested
    # backend that cannot run is recorded and fails the run
    ladder = ("cuda-future",) + backends.LADDER
    monkeypatch.setattr(backends, "LADDER", ladder)
    monkeypatch.setattr(options, "LADDER", ladder)
    monkeypatch.setitem(backends._available, "cuda-future", (True, "fake"))
    from cpemu.backends.cuda_kernels import CudaKernel

    monkeypatch.setitem(backends._backends, "cuda-future", CudaKernel("cuda-future"))
    monkeypatch.setitem(backends._available, "cuda-simple", (False, "no fatbin for this GPU"))
    args = ["--kernels", "cuda-future,cuda-simple", "--shape", "64x32", "--M", "16", "--data", "gauss40",
            "--window-s", "0.02", "--windows", "2", "--no-native"]
    result, d = _run(args, tmp_path / "b.json")
    assert result.exit_code == 1
    assert d["kernels_unavailable"] == {"cuda-simple": "no fatbin for this GPU"}
    fut, simple = d["results"]
    assert fut["status"] == "ok" and fut["call"].startswith("api") and "api" not in fut
    assert simple["status"] == "skipped" and "no fatbin" in simple["reason"]
    ex = d["exactness"][0]
    assert ex["ok"] is True and ex["vs_cuda_simple"]["ok"] is None
    assert any("cuda-simple: requested but cannot run here" in f for f in d["failures"])


def test_explicit_native_without_cuda_fails(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch has CUDA here")
    monkeypatch.setattr(clocks, "find_nvidia_smi", lambda: None)
    args = [a for a in SMOKE if a != "--no-native"] + ["--native", "--data", "gauss40"]
    result, d = _run(args, tmp_path / "b.json")
    assert result.exit_code == 1
    assert d["native_setting"] == {"on": False, "reason": "torch is importable but CUDA is not available to it"}
    assert d["results"][0]["status"] == "ok" and d["native"] == []


def test_code_fingerprint_follows_the_code(tmp_path):
    """The record's `code` sha256 changes with any byte of the package, the CUDA sources or the
    fatbins, and with nothing else."""
    for rel, data in (("cpemu/__init__.py", b"x = 1\n"), ("cpemu/cuda/k.py", b""), ("cuda_src/k.cu", b"//\n"),
                      ("bin/k.fatbin", b"\x00\x01"), ("bin/manifest.json", b"{}"), ("README.md", b"r")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    first = provenance.code_fingerprint(str(tmp_path))
    assert first["files"] == 5 and len(first["sha256"]) == 64
    assert provenance.code_fingerprint(str(tmp_path)) == first
    (tmp_path / "README.md").write_bytes(b"other")
    assert provenance.code_fingerprint(str(tmp_path)) == first
    (tmp_path / "bin" / "k.fatbin").write_bytes(b"\x00\x02")
    second = provenance.code_fingerprint(str(tmp_path))
    assert second["sha256"] != first["sha256"]
    (tmp_path / "cpemu" / "cuda" / "k.py").rename(tmp_path / "cpemu" / "cuda" / "j.py")  # same bytes, new name
    assert provenance.code_fingerprint(str(tmp_path))["sha256"] != second["sha256"]
    assert provenance.code_fingerprint()["files"] > 20  # the checkout's own
