"""The smaller benchmark tools on a machine without a GPU: tools/bench_dropin.py (the torch
drop-in against torch._scaled_mm) and tools/bench_tiled_geometry.py (the two cuda-tiled
geometries). Argument errors name the option and write nothing; without a GPU they refuse to
run; the shared ending (bench_kernels.finish) writes the record and exits 1 on a failure."""

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
