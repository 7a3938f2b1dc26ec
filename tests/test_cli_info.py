"""`cpemu info`'s device matching: the fields read from each shipped profile, the verdicts
against fake detections, and the CPU path (no GPU found)."""

import json

import pytest
from click.testing import CliRunner

from cpemu import devicematch, get_profile
from cpemu.cli import main

H200 = {"gpu": {"name": "NVIDIA H200", "sm_count": 132, "compute_capability": "9.0"}, "found_by": "torch",
        "no_gpu_reason": None, "cublaslt": 130100, "cublaslt_source": "libcublasLt.so.13 (test)",
        "torch": "2.11.0+cu130"}
NO_GPU = {"gpu": None, "found_by": None, "no_gpu_reason": "cupy is not installed; torch sees no CUDA device",
          "cublaslt": None, "cublaslt_source": "no libcublasLt could be loaded", "torch": "2.13.0+cpu"}


def _with(**kw):
    d = json.loads(json.dumps(H200))
    for k, v in kw.items():
        if k in ("name", "sm_count"):
            d["gpu"][k] = v
        else:
            d[k] = v
    return d


@pytest.mark.parametrize("name, want", [
    ("hopper-h200-torch", {"gpu": "NVIDIA H200", "sm_count": 132, "cublaslt": 130100, "torch": "2.11.0+cu130"}),
    ("ada-rtx4060-torch", {"gpu": "NVIDIA GeForce RTX 4060", "sm_count": None, "cublaslt": None, "torch": None}),
    ("blackwell-rtx5070ti-torch",
     {"gpu": "NVIDIA GeForce RTX 5070 Ti", "sm_count": None, "cublaslt": None, "torch": None}),
])
def test_expects_reads_each_shipped_profile(name, want):
    assert devicematch.expects(get_profile(name).data) == want


def test_expects_from_texts_without_provenance():
    data = {"device": "NVIDIA H100 80GB HBM3 (132 SMs)", "library": "cuBLASLt 12.8.4 (120804)",
            "caller": "torch 2.7.1+cu128 torch._scaled_mm"}
    assert devicematch.expects(data) == {"gpu": "NVIDIA H100 80GB HBM3", "sm_count": 132, "cublaslt": 120804,
                                         "torch": "2.7.1+cu128"}


def test_h200_matches_its_profile():
    m = devicematch.match(get_profile("hopper-h200-torch").data, H200)
    assert (m["verdict"], m["differs"], m["not_recorded"]) == ("matches", [], [])
    assert devicematch.verdict_text(m) == "matches"


def test_torch_build_tag_is_not_compared():
    """The installed metadata of the H200's torch reads 2.11.0 where torch.__version__ reads
    2.11.0+cu130 (seen on the H200): the same release; a different release still differs."""
    m = devicematch.match(get_profile("hopper-h200-torch").data, _with(torch="2.11.0"))
    assert m["verdict"] == "matches", devicematch.verdict_text(m)
    m = devicematch.match(get_profile("hopper-h200-torch").data, _with(torch="2.11.1"))
    assert m["differs"] == ["torch"]


@pytest.mark.parametrize("change, field", [
    ({"torch": "2.12.0+cu130"}, "torch"), ({"cublaslt": 130200}, "cublaslt"),
    ({"sm_count": 114}, "sm_count"), ({"name": "NVIDIA H100 80GB HBM3"}, "gpu"), ({"sm_count": None}, "sm_count"),
])
def test_one_field_differs(change, field):
    m = devicematch.match(get_profile("hopper-h200-torch").data, _with(**change))
    assert m["verdict"] == "differs" and m["differs"] == [field]
    assert devicematch.verdict_text(m).startswith(f"differs: {field} (profile ")


def test_cublaslt_text():
    m = devicematch.match(get_profile("hopper-h200-torch").data, _with(cublaslt=130200))
    assert devicematch.verdict_text(m) == "differs: cublaslt (profile 13.1.0 (130100), here 13.2.0 (130200))"


def test_no_gpu_differs_everywhere():
    for name in ("hopper-h200-torch", "ada-rtx4060-torch"):
        m = devicematch.match(get_profile(name).data, NO_GPU)
        assert m["verdict"] == "differs" and "gpu" in m["differs"]
    m = devicematch.match(get_profile("hopper-h200-torch").data, NO_GPU)
    assert m["differs"] == ["gpu", "sm_count", "cublaslt", "torch"]


def test_unrecorded_fields_are_not_compared():
    found = _with(name="NVIDIA GeForce RTX 4060", sm_count=24, cublaslt=120803, torch="2.7.1+cu128")
    m = devicematch.match(get_profile("ada-rtx4060-torch").data, found)
    assert m["verdict"] == "matches" and m["not_recorded"] == ["sm_count", "cublaslt", "torch"]
    assert devicematch.verdict_text(m) == "matches; not recorded: sm_count, cublaslt, torch"


def test_detect_takes_the_gpu_from_cupy_status(monkeypatch):
    monkeypatch.setattr(devicematch, "_cublaslt", lambda: (130100, "test"))
    st = {"devices": [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132}],
          "reason": None}
    d = devicematch.detect(st)
    assert d["gpu"] == {"name": "NVIDIA H200", "sm_count": 132, "compute_capability": "9.0"}
    assert d["found_by"] == "cupy" and d["cublaslt"] == 130100 and d["no_gpu_reason"] is None


def test_detect_falls_back_to_torch(monkeypatch):
    monkeypatch.setattr(devicematch, "_torch_gpu", lambda: (None, "torch sees no CUDA device"))
    d = devicematch.detect({"devices": [], "reason": "cupy is not installed"})
    assert d["gpu"] is None and d["no_gpu_reason"] == "cupy is not installed; torch sees no CUDA device"
    monkeypatch.setattr(devicematch, "_torch_gpu", lambda: (dict(H200["gpu"]), "torch"))
    d = devicematch.detect({"devices": [], "reason": "cupy is not installed"})
    assert d["gpu"]["sm_count"] == 132 and d["found_by"] == "torch" and d["no_gpu_reason"] is None


def test_cli_info_reports_matches(monkeypatch):
    monkeypatch.setattr(devicematch, "detect", lambda cupy_status=None: H200)
    r = CliRunner().invoke(main, ["info"])
    assert r.exit_code == 0, r.output
    assert "  GPU:      NVIDIA H200, 132 SMs (found by torch)" in r.output
    assert "  cuBLASLt: 13.1.0 (130100), libcublasLt.so.13 (test)" in r.output
    assert "  hopper-h200-torch: matches\n" in r.output
    assert "  ada-rtx4060-torch: differs: gpu (profile NVIDIA GeForce RTX 4060, here NVIDIA H200)" in r.output
    d = json.loads(CliRunner().invoke(main, ["info", "--json"]).stdout)["device_match"]
    assert d["detected"] == H200
    assert d["profiles"]["hopper-h200-torch"]["verdict"] == "matches"
    assert d["profiles"]["blackwell-rtx5070ti-torch"]["differs"] == ["gpu"]


def _gpu_here() -> bool:
    try:
        import torch

        if torch.cuda.is_available():
            return True
    except ImportError:
        pass
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(_gpu_here(), reason="a GPU is visible: the CPU path does not apply")
def test_cli_info_on_the_cpu_says_no_gpu():
    r = CliRunner().invoke(main, ["info"])
    assert r.exit_code == 0, r.output
    assert "  GPU:      no GPU found (" in r.output
    d = json.loads(CliRunner().invoke(main, ["info", "--json"]).stdout)["device_match"]
    assert d["detected"]["gpu"] is None and d["detected"]["no_gpu_reason"]
    assert all(m["verdict"] == "differs" and "gpu" in m["differs"] for m in d["profiles"].values())
