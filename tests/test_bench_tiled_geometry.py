"""tools/bench_tiled_geometry.py on a machine without a GPU: argument errors and the refusal to run."""

from __future__ import annotations

import importlib.util
import os

import pytest
from click.testing import CliRunner

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("cpemu_tools_bench_tiled_geometry",
                                               os.path.join(HERE, "..", "tools", "bench_tiled_geometry.py"))
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)


@pytest.mark.parametrize("args, hint", [
    (["--M", "0"], "--M"),
    (["--shape", "5760x1921"], "--shape"),
    (["--data", "nonsense"], "--data"),
    (["--windows", "0"], "--windows"),
])
def test_bad_arguments_name_the_option(args, hint, tmp_path):
    r = CliRunner().invoke(_mod.main, args + ["--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and hint in r.output, r.output
    assert not (tmp_path / "x.json").exists()


def test_without_a_gpu_it_refuses(tmp_path):
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a CUDA GPU is present")
    except Exception:  # noqa: BLE001 - no cupy, or no GPU: the case under test
        pass
    r = CliRunner().invoke(_mod.main, ["--M", "16", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 1 and "needs cupy and a CUDA GPU" in r.output, r.output
    assert not (tmp_path / "x.json").exists()
