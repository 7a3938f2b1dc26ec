"""cpemu.evo2: a tiny random-weight StripedHyena 2 (vortex, PyPI vtx 1.1.0) with TE-format scales.

* The dry run lists every FP8 projection (vortex ``TELinear``) and changes nothing.
* After the swap, a forward pass runs on the CPU; each projection's output equals
  ``cpemu.gemm`` on the same quantised operands bit for bit (the operands are quantised
  here with ml_dtypes from the scales the fixture wrote, the GEMM sees vortex's padded M)
  and differs from the bf16 projection.
* Both TE formats (1.x BytesIO, >= 2.0 uint8 pickle) are read; a missing or empty
  ``_extra_state`` keeps the projection; vortex's stand-in modules do not outlive the import.

Skipped without vtx (``pip install -e ".[evo2]"``).
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vortex", reason="vortex (PyPI vtx) is not installed: pip install -e '.[evo2]'")

import cpemu  # noqa: E402
import cpemu.evo2 as ce  # noqa: E402
from evo2_fixtures import tiny_checkpoint, tiny_config  # noqa: E402,F401


@pytest.fixture(scope="module")
def built():
    return ce.tiny_model()


def _fresh(fmt="te2"):
    model = ce.tiny_model()
    return model, tiny_checkpoint(model, fmt=fmt)


def _scales(sd, name):
    """The (input, weight) scales the fixture wrote, read back through TE's own layout."""
    from cpemu.torch.te_state import read_extra_state
    st = read_extra_state(sd[f"{name}._extra_state"])
    return np.float32(st.scale_fwd[0]), np.float32(st.scale_fwd[1])


def _e4m3(x: np.ndarray, scale: np.float32) -> np.ndarray:
    """TE's cast: x * scale in float32, saturated to +-448, round to nearest even (ml_dtypes)."""
    y = np.clip(x.astype(np.float32) * scale, -448.0, 448.0)
    return y.astype(ml_dtypes.float8_e4m3fn)


def test_no_stand_in_modules_remain(built):
    assert not [m for m in ("triton", "triton.language", "flash_attn_2_cuda")
                if m in sys.modules and "stand-in" in (sys.modules[m].__doc__ or "")]


def test_dry_run_lists_every_projection():
    model, sd = _fresh()
    names = [n for n, m in model.named_modules() if type(m).__name__ == "TELinear"]
    assert names == [f"blocks.{i}.projections" for i in range(4)]
    entries = ce.swap_fp8_projections(model, sd, dry_run=True)
    assert [e.name for e in entries] == names and {e.action for e in entries} == {"swap"}
    assert all(e.in_features == 64 and e.out_features == 192 for e in entries)
    assert all(str(e).startswith(f"swap {e.name}: 64 -> 192") for e in entries)
    assert [n for n, m in model.named_modules() if type(m).__name__ == "TELinear"] == names  # unchanged


def test_missing_or_empty_state_keeps_the_projection():
    model, sd = _fresh()
    del sd["blocks.1.projections._extra_state"]
    sd["blocks.2.projections._extra_state"] = torch.empty(0, dtype=torch.uint8)
    entries = {e.name: e for e in ce.swap_fp8_projections(model, sd)}
    assert entries["blocks.1.projections"].action == "keep" and "has no" in entries["blocks.1.projections"].reason
    assert entries["blocks.2.projections"].action == "keep" and "no FP8" in entries["blocks.2.projections"].reason
    assert type(model.blocks[1].projections).__name__ == "TELinear"
    assert isinstance(model.blocks[0].projections, ce.TEProjection)


@pytest.mark.parametrize("fmt", ["te2", "te1"])
def test_swapped_projections_equal_cpemu_gemm(fmt):
    model, sd = _fresh(fmt)
    names = [f"blocks.{i}.projections" for i in range(4)]
    weights = {n: sd[f"{n}.weight"].float().numpy() for n in names}
    ce.swap_fp8_projections(model, sd)
    seen = {}

    def hook(name):
        def _record(mod, args, out):
            seen[name] = (args[0].detach().clone(), out[0].detach().clone())
        return _record

    for n in names:
        model.get_submodule(n).register_forward_hook(hook(n))
    tokens = torch.randint(0, 512, (2, 21), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, _ = model(tokens)
    assert logits.shape == (2, 21, 512) and torch.isfinite(logits.float()).all()
    assert sorted(seen) == names
    for n in names:
        x, y = seen[n]
        assert x.shape == (2, 21, 64) and y.shape == (2, 21, 192) and y.dtype == torch.bfloat16
        s_in, s_w = _scales(sd, n)
        xp = np.zeros((2, 32, 64), np.float32)  # vortex pads the sequence to a multiple of 16
        xp[:, :21] = x.float().numpy()
        a = _e4m3(xp.reshape(64, 64), s_in)
        w = _e4m3(weights[n], s_w)
        ref = cpemu.gemm(a, w.T, profile="hopper-h200-torch", scale_a=np.float32(1) / s_in,
                         scale_b=np.float32(1) / s_w, out_dtype="bfloat16", fast_accum=True, backend="reference")
        ref = np.asarray(ref).reshape(2, 32, 192)[:, :21]
        got = y.view(torch.int16).numpy()
        assert np.array_equal(got, ref.view(np.int16)), n
        bf16 = torch.nn.functional.linear(x, sd[f"{n}.weight"]).view(torch.int16).numpy()
        live = bf16 != 0
        assert live.mean() > 0.9 and (bf16 != got)[live].mean() > 0.5, n  # FP8 quantisation changes most


def test_bias_projection_is_refused():
    model, sd = _fresh()
    proj = model.blocks[0].projections
    proj.bias = torch.nn.Parameter(torch.zeros(192, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="blocks.0.projections: has a bias"):
        ce.swap_fp8_projections(model, sd, dry_run=True)


def test_bad_arguments():
    model, sd = _fresh()
    with pytest.raises(ValueError, match="state_dict"):
        ce.swap_fp8_projections(model, [1, 2])
    with pytest.raises(ValueError, match="profile"):
        ce.swap_fp8_projections(model, sd, profile="no-such-gpu")
    with pytest.raises(ValueError, match="use_fp8_input_projections"):
        ce.build_model(dict(tiny_config(), use_fp8_input_projections=True))


P0, K0 = "blocks.0.projections.weight", "blocks.0.projections._extra_state"


def _big_scale_state():
    import pickle
    expanded = torch.ones(1).expand(1 << 32)  # 4 bytes that claim 16 GiB
    return torch.frombuffer(bytearray(pickle.dumps({"scale_fwd": expanded, "amax_history_fwd": torch.ones(1)})),
                            dtype=torch.uint8)


@pytest.mark.parametrize("edit, match", [
    (lambda sd: sd.update({P0: torch.randn(16, 64).bfloat16()}),
     r"^blocks.0.projections.weight: must have the module's shape \(out_features, in_features\) = \(192, 64\) "
     r"\(got \(16, 64\)\)"),
    (lambda sd: sd.update({P0: torch.ones(1, 1).bfloat16().expand(1 << 22, 4096)}), r"got \(4194304, 4096\)"),
    (lambda sd: sd.update({P0: "abc"}), r"^blocks.0.projections.weight: must be a bf16/fp16/fp32 tensor"),
    (lambda sd: sd.update({K0: _big_scale_state()}), r"scale_fwd has 4294967296 elements"),
    (lambda sd: sd.update({K0: {"scale_fwd": "abc", "amax_history_fwd": torch.ones(1)}}),
     r"^blocks.0.projections._extra_state: scale_fwd must be a tensor of numbers"),
    (lambda sd: sd.update({K0: {"scale_fwd": torch.ones(3), "amax_history_fwd": torch.ones(1),
                                "extra_fp8_variables": 5}}), r"extra_fp8_variables must be a dict"),
    (lambda sd: sd.update({"blocks.2.projections._extra_state": __import__("cpemu.torch.te_state", fromlist=["x"])
                           .write_extra_state([1.0, 0.0, 1.0], torch.ones(16, 3))}),
     r"^blocks.2.projections._extra_state: the weight scale \(scale_fwd\) must be positive and finite \(got 0.0\)"),
])
def test_bad_checkpoints_are_refused_before_any_swap(edit, match):
    """Checked for every projection before the first is swapped (and by a dry run alike); a
    wrong-shaped weight is never quantised, and an expanded scale tensor is never copied."""
    model, sd = _fresh()
    edit(sd)
    before = [type(m).__name__ for _, m in model.named_modules()]
    for dry in (True, False):
        with pytest.raises(ValueError, match=match):
            ce.swap_fp8_projections(model, sd, dry_run=dry)
    assert [type(m).__name__ for _, m in model.named_modules()] == before


def test_model_must_be_a_module():
    with pytest.raises(ValueError, match=r"^model: must be a torch.nn.Module"):
        ce.swap_fp8_projections(None, {})


def test_forward_fp8_takes_e4m3_matrices_only():
    import cpemu.torch as ct
    layer = ct.FP8Linear(torch.zeros(32, 64).to(torch.float8_e4m3fn), 1.0, 1.0)
    for x in ((torch.randn(5, 64) * 4).to(torch.float8_e5m2), torch.zeros(64).to(torch.float8_e4m3fn)):
        with pytest.raises(ValueError, match=r"^input: forward_fp8 takes a 2-D float8_e4m3fn tensor"):
            layer.forward_fp8(x)
    assert layer.forward_fp8(torch.zeros(5, 64).to(torch.float8_e4m3fn)).shape == (5, 32)


def test_example_runs():
    import os
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(root, "examples", "evo2_vortex.py"), "--format", "te1"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("   swap blocks.") == 4 and "differ from the bf16 model's" in r.stdout


def test_import_leaves_no_log_file(tmp_path):
    import os
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = "import cpemu.evo2 as ce, sys; ce.import_vortex(); print(sorted(m for m in sys.modules if 'triton' in m))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not list(tmp_path.iterdir())  # vortex's activations_debug.log is opened lazily


def test_stale_scale_inv_is_named_and_not_used():
    import io
    model, sd = _fresh("te1")
    key = "blocks.0.projections._extra_state"
    state = torch.load(sd[key], weights_only=False)
    state["scale_inv_fwd"] = state["scale_inv_fwd"] * 2  # as if saved before the last scale update
    buf = io.BytesIO()
    torch.save(state, buf)
    sd[key] = buf
    entry = ce.swap_fp8_projections(model, sd)[0]
    assert "stored scale_inv is not 1/scale" in entry.source
    lin = model.blocks[0].projections.linear
    want = torch.reciprocal(state["scale_fwd"][:2].float())
    assert torch.equal(lin.input_scale_inv.reshape(1), want[:1])
    assert torch.equal(lin.weight_scale_inv.reshape(1), want[1:])
