"""The smaller benchmark tools on a machine without a GPU: tools/bench_dropin.py (the torch
drop-in against torch._scaled_mm) and tools/bench_tiled_geometry.py (builds of the tiled kernels
side by side). Argument errors name the option and write nothing; without a GPU they refuse to
run; the shared ending (bench_kernels.finish) writes the record and exits 1 on a failure; on the
stand-in GPU of test_bench_kernels the builds run forced, probe builds' bits are not compared and
an exact build with other bits fails the run."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from click.testing import CliRunner

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(tool: str):
    spec = importlib.util.spec_from_file_location(f"cpemu_tools_{tool}", os.path.join(HERE, "..", "tools", f"{tool}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TOOLS = {name: _load(name) for name in ("bench_dropin", "bench_tiled_geometry")}


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize("args, hint", [
    (["--M", "0"], "--M"),
    (["--shape", "5760x1921"], "--shape"),
    (["--data", "nonsense"], "--data"),
    (["--windows", "0"], "--windows"),
])
def test_bad_arguments_name_the_option(tool, args, hint, tmp_path):
    r = CliRunner().invoke(TOOLS[tool].main, args + ["--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and hint in r.output, r.output
    assert not (tmp_path / "x.json").exists()


def _has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, or a cupy without a GPU
        return False


def test_dropin_without_a_cuda_gpu_refuses(tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    r = CliRunner().invoke(TOOLS["bench_dropin"].main, ["--M", "16", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 1 and "needs torch with a CUDA GPU" in r.output, r.output
    assert not (tmp_path / "x.json").exists()


def test_geometry_without_a_gpu_refuses(tmp_path):
    if _has_gpu():
        pytest.skip("a CUDA GPU is present")
    r = CliRunner().invoke(TOOLS["bench_tiled_geometry"].main, ["--M", "16", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 1 and "needs cupy and a CUDA GPU" in r.output, r.output
    assert not (tmp_path / "x.json").exists()


def test_finish_writes_the_record_and_exits_1_on_a_failure(tmp_path):
    import click

    finish = TOOLS["bench_dropin"].finish

    @click.command()
    @click.option("--fail", is_flag=True)
    def run(fail):
        finish({"results": [1], "failures": ["evo2-1b M=16: 3 outputs differ"] if fail else []},
               str(tmp_path / "sub" / "r.json"))

    ok = CliRunner().invoke(run, [])
    assert ok.exit_code == 0 and "wrote" in ok.output
    assert json.loads((tmp_path / "sub" / "r.json").read_text())["failures"] == []
    bad = CliRunner().invoke(run, ["--fail"])
    assert bad.exit_code == 1 and "FAIL: evo2-1b M=16: 3 outputs differ" in bad.output
    assert json.loads((tmp_path / "sub" / "r.json").read_text())["failures"] == ["evo2-1b M=16: 3 outputs differ"]
    assert not (tmp_path / "sub" / "r.json.tmp").exists()


@pytest.mark.parametrize("build, why", [
    ("gemm_nonsense", "the module must be one of"),
    ("gemm_rzacc_pre:CPT_PROBE_SKIP", "macros are NAME=VALUE"),
    ("gemm_rzacc:cpt_tm=4", "macros are NAME=VALUE"),
])
def test_bad_build_names_the_option(build, why, tmp_path):
    r = CliRunner().invoke(TOOLS["bench_tiled_geometry"].main, ["--build", build, "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "--build" in r.output and why in r.output, r.output
    assert not (tmp_path / "x.json").exists()


def _stand_in_builds(monkeypatch, tmp_path, corrupt_define=None):
    """The stand-in GPU of test_bench_kernels, with a gemm_cuda that takes the tuning arguments:
    a probe build (CPT_PROBE_SKIP) and the build with ``corrupt_define`` flip one output bit."""
    import sys

    import numpy as np

    import test_bench_kernels as tbk
    from benchkit import clocks
    from cpemu.cuda import kernels

    monkeypatch.setitem(sys.modules, "cupy", tbk._fake_cupy())
    fake, seen = tbk._fake_gemm_cuda(), []

    def gemm_cuda(family, *args, tiled_module=None, defines=()):
        seen.append((family, tiled_module, tuple(defines)))
        out = np.array(fake(family, *args))
        if any(d.startswith("CPT_PROBE_SKIP=") for d in defines) or corrupt_define in defines:
            out[0, 0] ^= 1
        return out.view(tbk.FakeArray)

    monkeypatch.setattr(kernels, "gemm_cuda", gemm_cuda)
    smi = tbk._fake_nvidia_smi(tmp_path)
    monkeypatch.setattr(clocks, "find_nvidia_smi", lambda: smi)
    return seen


BUILD_ARGS = ["--shape", "64x32", "--M", "16", "--window-s", "0.02", "--windows", "2",
              "--build", "gemm_rzacc_pre", "--build", "gemm_rzacc_pre:CPT_PROBE_SKIP=1",
              "--build", "gemm_rzacc_pre:CPT_MINBLOCKS=2,CPT_TM=4"]


def test_builds_side_by_side_with_stand_ins(tmp_path, monkeypatch):
    """Every build runs forced onto its module with its macros; the probe's bits are recorded,
    not compared; MAC per clock per SM comes from the sampled clock (1980 MHz, 132 SMs)."""
    seen = _stand_in_builds(monkeypatch, tmp_path)
    out = tmp_path / "b.json"
    r = CliRunner().invoke(TOOLS["bench_tiled_geometry"].main, BUILD_ARGS + ["--out", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["failures"] == [] and len(d["results"]) == 1
    res = d["results"][0]
    assert [(b["family"], b["module"], b["defines"], b["probe"]) for b in res["builds"]] == [
        ("cuda-rzacc", "gemm_rzacc_pre", [], False), ("cuda-rzacc", "gemm_rzacc_pre", ["CPT_PROBE_SKIP=1"], True),
        ("cuda-rzacc", "gemm_rzacc_pre", ["CPT_MINBLOCKS=2", "CPT_TM=4"], False)]
    assert {(f, m, d_) for f, m, d_ in seen} == {("cuda-rzacc", "gemm_rzacc_pre", ()),
                                                 ("cuda-rzacc", "gemm_rzacc_pre", ("CPT_PROBE_SKIP=1",)),
                                                 ("cuda-rzacc", "gemm_rzacc_pre", ("CPT_MINBLOCKS=2", "CPT_TM=4"))}
    shas = [b["output_sha256"] for b in res["builds"]]
    assert res["same_bits"] is True and shas[0] == shas[2] != shas[1]
    for b in res["builds"]:
        assert b["clock"]["sm_mhz_median"] == 1980.0
        assert b["mac_per_clock_per_sm"] == pytest.approx(16 * 64 * 32 / (b["ms"] / 1e3) / 1.98e9 / 132)
    assert res["builds"][0]["speedup_over_first"] == 1.0
    assert res["picked"] == {"cuda-rzacc": "gemm_rzacc_small_m"}  # M = 16: the family's small-M geometry


def test_builds_whose_exact_bits_differ_exit_1(tmp_path, monkeypatch):
    _stand_in_builds(monkeypatch, tmp_path, corrupt_define="CPT_TM=4")
    out = tmp_path / "b.json"
    r = CliRunner().invoke(TOOLS["bench_tiled_geometry"].main, BUILD_ARGS + ["--out", str(out)])
    assert r.exit_code == 1, r.output
    d = json.loads(out.read_text())
    assert d["failures"] == ["64x32 gauss40 M=16: the exact builds' outputs differ"]
    assert d["results"][0]["same_bits"] is False


def test_default_builds_are_the_two_tiled_geometries(tmp_path, monkeypatch):
    seen = _stand_in_builds(monkeypatch, tmp_path)
    out = tmp_path / "b.json"
    r = CliRunner().invoke(TOOLS["bench_tiled_geometry"].main, BUILD_ARGS[:6] + ["--out", str(out)])
    assert r.exit_code == 0, r.output
    assert {m for _, m, _ in seen} == {"gemm_tiled", "gemm_tiled_small_m"}
    assert [b["module"] for b in json.loads(out.read_text())["builds"]] == ["gemm_tiled", "gemm_tiled_small_m"]
