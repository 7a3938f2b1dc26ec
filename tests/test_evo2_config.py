"""cpemu.evo2.build_model and tiny_model check their arguments before vortex builds anything: a
config vortex cannot build (or run) and sizes that would not fit in memory are refused with a
ValueError naming the field and the rule, not an error from inside torch or vortex.

The refusals need torch only (vortex is imported after the checks); building needs vortex (vtx).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import cpemu  # noqa: E402
import cpemu.evo2 as ce  # noqa: E402
from cpemu import memory  # noqa: E402
from cpemu.evo2.config import check_config, parameter_count  # noqa: E402


def _without(key):
    cfg = ce.tiny_config()
    del cfg[key]
    return cfg


@pytest.mark.parametrize("config, match", [
    ([1], r"^config: must be a dict \(or vortex's dotdict\) of the model's fields \(got list\)"),
    (None, r"^config: must be a dict .*\(got NoneType\)"),
    (_without("hidden_size"), r"^config: lacks hidden_size, a positive integer vortex needs"),
    (_without("num_layers"), r"^config: lacks num_layers"),
    (dict(ce.tiny_config(), hidden_size=0), r"^config: hidden_size must be a positive integer \(got 0\)"),
    (dict(ce.tiny_config(), hidden_size=-64), r"^config: hidden_size must be a positive integer \(got -64\)"),
    (dict(ce.tiny_config(), hidden_size=64.0), r"^config: hidden_size must be a positive integer \(got 64.0\)"),
    (dict(ce.tiny_config(), vocab_size="512"), r"^config: vocab_size must be a positive integer \(got '512'\)"),
    (dict(ce.tiny_config(), num_layers=True), r"^config: num_layers must be a positive integer \(got True\)"),
    (dict(ce.tiny_config(), short_filter_length=0), r"^config: short_filter_length must be a positive integer"),
    (dict(ce.tiny_config(), inner_mlp_size=None), r"^config: inner_mlp_size must be a positive integer \(got None\)"),
    (dict(ce.tiny_config(), num_filters=48), r"^config: num_filters must divide hidden_size = 64 \(got 48\)"),
    (dict(ce.tiny_config(), hcl_layer_idxs=[2, 9]),
     r"^config: hcl_layer_idxs must be a list of layer indices from 0 to num_layers - 1 = 3 \(got \[2, 9\]\)"),
    (dict(ce.tiny_config(), attn_layer_idxs=None), r"^config: attn_layer_idxs must be a list of layer indices"),
    (dict(ce.tiny_config(), hcl_layer_idxs=[]), r"^config: layer 2 must be in exactly one of attn_layer_idxs, "
                                                r"hcl_layer_idxs, hcm_layer_idxs, hcs_layer_idxs \(it is in none\)"),
    (dict(ce.tiny_config(), attn_layer_idxs=[1]), r"^config: layer 1 must be in exactly one of .*\(it is in "
                                                  r"attn_layer_idxs, hcm_layer_idxs\)"),
    (dict(ce.tiny_config(), hcs_filter_groups=3), r"^config: hcs_filter_groups must divide hidden_size = 64 \(got 3\)"),
    (dict(ce.tiny_config(), hcs_filter_groups=1), r"^config: hcs_filter_groups must be at least 2"),
    (dict(ce.tiny_config(), hcm_filter_groups=0), r"^config: hcm_filter_groups must be a positive integer"),
    (dict(ce.tiny_config(), hcm_filter_length=-1), r"^config: hcm_filter_length must be a positive integer"),
    (dict(ce.tiny_config(), eps=None), r"^config: eps must be a finite number >= 0"),
    (dict(ce.tiny_config(), eps=math.nan), r"^config: eps must be a finite number >= 0"),
    (dict(ce.tiny_config(), mlp_activation="relu"), r"^config: mlp_activation must be one of \('gelu', 'silu'\)"),
])
def test_bad_configs_are_refused_before_vortex_builds(config, match):
    with pytest.raises(ValueError, match=match):
        ce.build_model(config)


def test_bfloat16_must_be_a_bool():
    with pytest.raises(ValueError, match=r"^bfloat16: must be a bool \(got str\)"):
        ce.build_model(ce.tiny_config(), bfloat16="no")


@pytest.mark.parametrize("kw, match", [
    (dict(hidden=0), r"^hidden: must be an integer from 32 that hidden // 16 \(the filters' group count\) divides"),
    (dict(hidden=24), r"^hidden: must be an integer from 32"),
    (dict(hidden=56), r"^hidden: must be an integer from 32 .*\(got 56\)"),
    (dict(hidden=64.0), r"^hidden: must be an integer from 32 .*\(got 64.0\)"),
    (dict(layers=0), r"^layers: must be a positive integer \(got 0\)"),
    (dict(layers=2.5), r"^layers: must be a positive integer \(got 2.5\)"),
    (dict(seed="a"), r"^seed: must be an integer from -2\*\*63 to 2\*\*64 - 1"),
    (dict(seed=2 ** 64), r"^seed: must be an integer"),
    (dict(vocab_size=0), r"^config: vocab_size must be a positive integer \(got 0\)"),
])
def test_bad_tiny_model_arguments_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        ce.tiny_model(**kw)


def test_a_model_that_does_not_fit_is_refused_before_any_allocation():
    cfg = dict(ce.tiny_config(), hidden_size=1 << 20, num_filters=1 << 20, inner_mlp_size=1 << 21,
               hcs_filter_groups=1 << 16, hcm_filter_groups=1 << 16, num_layers=1000,
               hcs_layer_idxs=list(range(0, 1000, 3)), hcm_layer_idxs=list(range(1, 1000, 3)),
               hcl_layer_idxs=list(range(2, 1000, 3)))
    with pytest.raises(cpemu.OutputTooLarge, match=r"^config: a model of [\d,]+ parameters \(float32, as vortex "
                                                   r"builds it\) needs [\d.]+ GiB, and [\d.]+ GiB are available on "):
        ce.build_model(cfg)


def test_the_memory_check_uses_what_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 19)  # 0.5 MiB: the tiny model's 0.8 MiB do not fit
    with pytest.raises(cpemu.OutputTooLarge, match=r"0.00 GiB are available on this machine"):
        ce.tiny_model()


def test_parameter_count_is_vortex_s():
    """The estimate the memory check uses is within 1 % of the parameters vortex allocates."""
    pytest.importorskip("vortex", reason="vortex (PyPI vtx) is not installed: pip install -e '.[evo2]'")
    for cfg in (ce.tiny_config(), ce.tiny_config(128, 7), dict(ce.tiny_config(64, 5), attn_layer_idxs=[4],
                                                                 hcm_layer_idxs=[1])):
        model = ce.build_model(cfg, bfloat16=False)
        got = sum(p.numel() for p in model.parameters())
        assert got <= check_config(cfg) == parameter_count(cfg) <= 1.01 * got


def test_configs_vortex_builds_are_taken():
    pytest.importorskip("vortex", reason="vortex (PyPI vtx) is not installed: pip install -e '.[evo2]'")
    for kw in (dict(hidden=40), dict(hidden=32, layers=1), dict(hcm_filter_groups=1), dict(num_attention_heads=3)):
        model = ce.tiny_model(**kw)
        logits, _ = model(torch.randint(0, 10, (1, 20)))
        assert torch.isfinite(logits.float()).all()
