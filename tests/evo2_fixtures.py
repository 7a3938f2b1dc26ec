"""Test fixtures for the Evo 2 swap: TE-format extra states and a tiny vortex model.

``te_recipe()`` pickles as Transformer Engine's own ``DelayedScaling`` does: while it is
pickled, modules named ``transformer_engine.common.recipe`` (with a ``Format`` enum whose
values are ``_FormatHelper`` named tuples, and a ``DelayedScaling`` dataclass, as in TE's
``transformer_engine/common/recipe/__init__.py``) stand in sys.modules, so the pickle names
TE's classes exactly as a TE checkpoint does. Transformer Engine itself is never imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import pickle
import sys
import types
from typing import NamedTuple

import torch

from cpemu.torch.te_state import write_extra_state


def _te_recipe_module():
    mod = types.ModuleType("transformer_engine.common.recipe")

    class _FormatHelper(NamedTuple):
        max_fwd: float
        max_bwd: float

    class Format(enum.Enum):
        E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
        E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
        HYBRID = _FormatHelper(max_fwd=E4M3.max_fwd, max_bwd=E5M2.max_bwd)

    @dataclasses.dataclass
    class DelayedScaling:
        margin: int = 0
        fp8_format: Format = Format.HYBRID
        amax_history_len: int = 1024
        amax_compute_algo: str = "max"
        scaling_factor_compute_algo: object = None
        reduce_amax: bool = True
        fp8_dpa: bool = False
        fp8_mha: bool = False

    for obj in (_FormatHelper, Format, DelayedScaling):
        obj.__module__, obj.__qualname__ = mod.__name__, obj.__name__
        setattr(mod, obj.__name__, obj)
    return mod


@contextlib.contextmanager
def _te_modules():
    names = ("transformer_engine", "transformer_engine.common", "transformer_engine.common.recipe")
    saved = {n: sys.modules.get(n) for n in names}
    rec = _te_recipe_module()
    sys.modules.update({names[0]: types.ModuleType(names[0]), names[1]: types.ModuleType(names[1]), names[2]: rec})
    try:
        yield rec
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:  # pragma: no cover
                sys.modules[n] = m


def te2_extra_state(scale_fwd, amax_history) -> torch.Tensor:
    """A TE >= 2.0 extra state (uint8 pickle bytes) with Evo 2's recipe, as vortex sets it:
    DelayedScaling(Format.HYBRID, amax_history_len=16, amax_compute_algo="max")."""
    with _te_modules() as rec:
        recipe = rec.DelayedScaling(fp8_format=rec.Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
        return write_extra_state(scale_fwd, amax_history, fmt="te2", recipe=recipe)


def te1_extra_state(scale_fwd, amax_history):
    """A TE 1.x extra state (io.BytesIO of torch.save, with scale_inv), as Evo 2's checkpoints hold."""
    return write_extra_state(scale_fwd, amax_history, fmt="te1")


def evil_pickle() -> torch.Tensor:
    """Pickle bytes that would run ``os.system`` when loaded by plain pickle."""
    class Evil:
        def __reduce__(self):
            import os
            return (os.system, ("echo pwned",))
    return torch.frombuffer(bytearray(pickle.dumps({"scale_fwd": Evil()})), dtype=torch.uint8)


def tiny_config(hidden: int = 64, layers: int = 4) -> dict:
    """evo2-1b-8k.yml with ``hidden`` channels and ``layers`` Hyena blocks (no attention), without
    FP8 (vortex refuses FP8 configs without Transformer Engine)."""
    return dict(
        model_name="tiny-evo2-test", vocab_size=512, hidden_size=hidden, num_filters=hidden,
        attn_layer_idxs=[], hcs_layer_idxs=list(range(0, layers, 3)), hcm_layer_idxs=list(range(1, layers, 3)),
        hcl_layer_idxs=list(range(2, layers, 3)), hcm_filter_length=128, hcl_filter_groups=hidden,
        hcm_filter_groups=hidden // 16, hcs_filter_groups=hidden // 16, hcs_filter_length=7, num_layers=layers,
        short_filter_length=3, num_attention_heads=4, short_filter_bias=False,
        mlp_init_method="torch.nn.init.xavier_uniform_", mlp_output_init_method="torch.nn.init.xavier_uniform_",
        eps=1e-6, state_size=16, rotary_emb_base=10000, make_vocab_size_divisible_by=8, inner_size_multiple_of=16,
        inner_mlp_size=2 * hidden, log_intermediate_values=False, proj_groups=1, hyena_filter_groups=1,
        column_split_hyena=False, column_split=True, interleave=True, evo2_style_activations=True,
        model_parallel_size=1, pipe_parallel_size=1, tie_embeddings=True, mha_out_proj_bias=True,
        hyena_out_proj_bias=True, hyena_flip_x1x2=False, qkv_proj_bias=False, use_fp8_input_projections=False,
        max_seqlen=8192, max_batch_size=1, final_norm=True, use_flash_attn=False, use_flash_rmsnorm=False,
        use_flash_depthwise=False, use_flashfft=False, use_laughing_hyena=False, inference_mode=True,
        tokenizer_type="CharLevelTokenizer", prefill_style="fft", mlp_activation="gelu", print_activations=False)


def tiny_checkpoint(model, fmt: str = "te2", seed: int = 0) -> dict:
    """The model's state dict plus a TE-format ``_extra_state`` for every projection, with scales
    from each projection's weight amax and a random input amax history (as delayed scaling
    leaves them after training)."""
    from cpemu.torch.linear import delayed_scaling_scale

    g = torch.Generator().manual_seed(seed)
    sd = dict(model.state_dict())
    for name, mod in model.named_modules():
        if type(mod).__name__ != "TELinear":
            continue
        w_amax = mod.weight.detach().abs().max().float()
        hist = torch.rand(16, 3, generator=g) * 4 + 0.5
        hist[:, 1] = w_amax
        amax = hist.max(dim=0).values
        scale = torch.stack([delayed_scaling_scale(a) for a in amax])
        make = te2_extra_state if fmt == "te2" else te1_extra_state
        sd[f"{name}._extra_state"] = make(scale, hist)
    return sd
