"""Transformer Engine's ``_extra_state``, read without TE (cpemu.torch.te_state); row chunks.

* Both of TE's formats are read: TE >= 2.0 (uint8 tensor of pickle bytes, with a pickled
  ``DelayedScaling`` recipe naming TE's own classes) and TE 1.x (io.BytesIO of torch.save,
  with ``scale_inv_fwd``); an empty state or None holds no scales.
* The unpickler refuses every global a TE state never holds (a pickle that would call
  ``os.system``), and never leaves stand-in TE modules behind.
* ``row_chunks`` chunks only where every chunk and the whole call are unsplit; FP8Linear's
  chunked rows equal its one-call rows bit for bit.
"""

from __future__ import annotations

import io
import pickle
import sys

import pytest

torch = pytest.importorskip("torch")

import cpemu  # noqa: E402
from cpemu.torch import FP8Linear  # noqa: E402
from cpemu.torch.chunking import row_chunks  # noqa: E402
from cpemu.torch.te_state import read_extra_state, write_extra_state  # noqa: E402
from evo2_fixtures import evil_pickle, te1_extra_state, te2_extra_state  # noqa: E402

SCALE = torch.tensor([0.75, 3.5, 1.0])
HIST = torch.arange(48, dtype=torch.float32).reshape(16, 3) / 7


def _bits(t):
    return t.reshape(-1).view(torch.int32).tolist()


def test_te2_format_with_recipe():
    raw = te2_extra_state(SCALE, HIST)
    assert raw.dtype == torch.uint8 and raw.dim() == 1
    st = read_extra_state(raw)
    assert _bits(st.scale_fwd) == _bits(SCALE)
    assert _bits(st.amax_history_fwd) == _bits(HIST)
    assert st.input_scale == 0.75 and st.weight_scale == 3.5
    assert st.scale_inv_fwd is None
    assert st.recipe["class"] == "transformer_engine.common.recipe.DelayedScaling"
    assert st.recipe["amax_history_len"] == 16 and st.recipe["amax_compute_algo"] == "max"
    assert "448" in st.recipe["fp8_format"] and "57344" in st.recipe["fp8_format"]  # Format.HYBRID
    assert not [m for m in sys.modules if m.startswith("transformer_engine")]


def test_te1_format_bytesio():
    raw = te1_extra_state(SCALE, HIST)
    assert isinstance(raw, io.BytesIO)
    st = read_extra_state(raw)
    assert _bits(st.scale_fwd) == _bits(SCALE)
    assert st.scale_inv_fwd.tolist() == [1 / 0.75, 1 / 3.5, 1.0] or \
        _bits(st.scale_inv_fwd) == _bits(torch.tensor([1 / 0.75, 1 / 3.5, 1.0], dtype=torch.float32))
    assert st.recipe is None and "1.x" in st.source


def test_dict_and_empty_states():
    assert read_extra_state(None) is None
    assert read_extra_state(torch.empty(0, dtype=torch.uint8)) is None
    assert read_extra_state({"recipe": None}) is None
    st = read_extra_state({"scale_fwd": SCALE, "amax_history_fwd": HIST})
    assert st.weight_scale == 3.5


def test_refuses_code_in_a_pickle():
    with pytest.raises(ValueError, match="posix.system|os.system"):
        read_extra_state(evil_pickle(), "blocks.0.projections._extra_state")
    buf = io.BytesIO()
    torch.save({"scale_fwd": SCALE, "x": print}, buf)
    with pytest.raises(ValueError, match=r"builtins?_*\.print"):
        read_extra_state(buf)


@pytest.mark.parametrize("value, msg", [
    (torch.zeros(4, dtype=torch.float32), "uint8"),
    (b"\x80\x04", "io.BytesIO, a uint8 tensor, a dict or None"),
    (torch.frombuffer(bytearray(b"not a pickle"), dtype=torch.uint8), "not a readable"),
    (torch.frombuffer(bytearray(pickle.dumps([1, 2])), dtype=torch.uint8), "not TE's state dict"),
])
def test_bad_states_name_the_key(value, msg):
    with pytest.raises(ValueError, match=msg) as e:
        read_extra_state(value, "blocks.3.projections._extra_state")
    assert "blocks.3.projections._extra_state" in str(e.value)


def test_writer_rejects_unknown_format():
    with pytest.raises(ValueError, match="fmt"):
        write_extra_state(SCALE, HIST, fmt="te3")


# --- row chunks -------------------------------------------------------------------------

def test_row_chunks_one_call_inside_the_domain():
    assert row_chunks("hopper-h200-torch", 4096, 5760, 1920) == [(0, 4096)]


@pytest.mark.parametrize("N, K", [(5760, 1920), (12288, 4096), (24576, 8192)])
def test_row_chunks_long_context_evo2(N, K):
    M = 1 << 20  # a million tokens: past the domain's M, unsplit by the bound
    chunks = row_chunks("hopper-h200-torch", M, N, K)
    assert chunks[0][0] == 0 and chunks[-1][1] == M and len(chunks) == 8
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    assert all((j - i) % 16 == 0 for i, j in chunks)


def test_row_chunks_refuse_a_split_shape():
    # (64, 4096, 14336): cuBLASLt splits K at M = 64 in the H200 profile's tables or bound
    prof = cpemu.get_profile("hopper-h200-torch")
    try:
        splits = prof.plan(16, 4096, 14336, True).splits
    except cpemu.UnsupportedShape:
        splits = None
    if splits == 1:
        pytest.skip("the profile does not split this shape")
    with pytest.raises(cpemu.UnsupportedShape):
        row_chunks(prof, 64, 4096, 14336, max_rows=16)


def test_row_chunks_max_rows_rule():
    with pytest.raises(ValueError, match="max_rows"):
        row_chunks("hopper-h200-torch", 64, 64, 64, max_rows=24)


def test_fp8linear_chunked_rows_equal_one_call():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(96, 160, generator=g)
    x = torch.randn(3, 37, 160, generator=g).to(torch.bfloat16)
    one = FP8Linear.from_weight(w, input_amax=4.0)
    chunked = FP8Linear.from_weight(w, input_amax=4.0, max_rows=16)
    a, b = one(x), chunked(x)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    with pytest.raises(ValueError, match="max_rows"):
        FP8Linear.from_weight(w, input_amax=4.0, max_rows=10)


def test_load_checkpoint_without_running_code(tmp_path):
    from cpemu.torch.te_state import load_checkpoint

    sd = {"blocks.0.projections.weight": torch.randn(48, 16).to(torch.bfloat16),
          "blocks.0.projections._extra_state": te1_extra_state(SCALE, HIST),
          "blocks.1.projections._extra_state": te2_extra_state(SCALE, HIST)}
    path = tmp_path / "ckpt.pt"
    torch.save(sd, path)
    got = load_checkpoint(path)
    assert torch.equal(got["blocks.0.projections.weight"].view(torch.int16),
                       sd["blocks.0.projections.weight"].view(torch.int16))
    for k in ("blocks.0.projections._extra_state", "blocks.1.projections._extra_state"):
        assert _bits(read_extra_state(got[k]).scale_fwd) == _bits(SCALE)
    torch.save({"w": torch.ones(2), "x": print}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="print"):
        load_checkpoint(tmp_path / "bad.pt")
