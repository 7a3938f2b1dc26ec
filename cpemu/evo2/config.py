"""The checks of a vortex config before :func:`cpemu.evo2.build_model` builds it.

vortex reads its config's sizes as it builds each block and fails there, from deep inside torch or
vortex (a division by zero, a negative dimension, a layer of no kind), or at the first forward
(a filter group count the channels do not split into). :func:`check_config` names the field and
the rule first, and refuses a model whose parameters would not fit in memory before any is
allocated (:func:`cpemu.memory.check_bytes`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

__all__ = ["check_config", "parameter_count"]

#: the fields vortex reads as sizes of every model: positive integers
SIZES = ("vocab_size", "hidden_size", "num_filters", "num_layers", "num_attention_heads", "state_size",
         "short_filter_length", "model_parallel_size")
#: sizes vortex reads where present (it has defaults; a field given must hold one)
OPTIONAL_SIZES = ("inner_mlp_size", "inner_size_multiple_of")
#: the layer kinds, in the order vortex looks a layer up (a layer has one kind)
LAYER_LISTS = ("attn_layer_idxs", "hcl_layer_idxs", "hcm_layer_idxs", "hcs_layer_idxs")
MLP_ACTIVATIONS = ("gelu", "silu")


def _fail(key: str, rule: str, got) -> None:
    raise ValueError(f"config: {key} {rule} (got {got!r:.200})")


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _size(config: Mapping, key: str) -> int:
    if key not in config:
        raise ValueError(f"config: lacks {key}, a positive integer vortex needs")
    v = config[key]
    if not is_int(v) or v < 1:
        _fail(key, "must be a positive integer", v)
    return int(v)


def _layers(config: Mapping, n_layers: int) -> dict:
    """{list name: set of layer indices}, each layer of ``range(n_layers)`` in exactly one list."""
    kinds = {}
    for key in LAYER_LISTS:
        v = config.get(key)
        if not isinstance(v, (list, tuple)) or not all(is_int(i) and 0 <= i < n_layers for i in v):
            _fail(key, f"must be a list of layer indices from 0 to num_layers - 1 = {n_layers - 1}", v)
        kinds[key] = set(int(i) for i in v)
    for i in range(n_layers):
        where = [k for k in LAYER_LISTS if i in kinds[k]]
        if len(where) != 1:
            raise ValueError(f"config: layer {i} must be in exactly one of {', '.join(LAYER_LISTS)} "
                             f"(it is in {', '.join(where) or 'none'})")
    return kinds


def _filters(config: Mapping, kinds: dict, hidden: int) -> None:
    """The short (hcs) and medium (hcm) filters: lengths and group counts the channels split into."""
    for kind in ("hcs", "hcm"):
        if not kinds[f"{kind}_layer_idxs"]:
            continue
        _size(config, f"{kind}_filter_length")
        groups = _size(config, f"{kind}_filter_groups")
        if hidden % groups:
            _fail(f"{kind}_filter_groups", f"must divide hidden_size = {hidden}", groups)
        if kind == "hcs" and groups == 1 and hidden > 1:  # vortex repeats the filter over the groups only when > 1
            _fail("hcs_filter_groups", "must be at least 2 (vortex does not spread a single group's short filter "
                                       "over the channels)", groups)


def check_config(config) -> int:
    """Raise ValueError naming the field and the rule where ``config`` is no model vortex can
    build and run; returns :func:`parameter_count`."""
    if not isinstance(config, Mapping):
        raise ValueError(f"config: must be a dict (or vortex's dotdict) of the model's fields "
                         f"(got {type(config).__name__})")
    sizes = {key: _size(config, key) for key in SIZES}
    for key in OPTIONAL_SIZES:
        if key in config:
            _size(config, key)
    hidden = sizes["hidden_size"]
    if hidden % sizes["num_filters"]:
        _fail("num_filters", f"must divide hidden_size = {hidden}", sizes["num_filters"])
    kinds = _layers(config, sizes["num_layers"])
    _filters(config, kinds, hidden)
    eps = config.get("eps")
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not math.isfinite(eps) or eps < 0:
        _fail("eps", "must be a finite number >= 0 (RMSNorm's epsilon)", eps)
    if config.get("mlp_activation", "gelu") not in MLP_ACTIVATIONS:
        _fail("mlp_activation", f"must be one of {MLP_ACTIVATIONS}", config.get("mlp_activation"))
    return parameter_count(config, kinds)


def _inner_size(config: Mapping) -> int:
    """The MLP width, as vortex's ParallelGatedMLP computes it."""
    if "inner_mlp_size" in config:
        return int(config["inner_mlp_size"])
    multiple = int(config.get("inner_size_multiple_of", 64)) * int(config["model_parallel_size"])
    return -(-int(2 * config["hidden_size"] * 4 / 3) // multiple) * multiple


def parameter_count(config: Mapping, kinds: dict | None = None) -> int:
    """The parameters vortex allocates for a checked ``config`` (biases of a few widths aside)."""
    h, n_layers = int(config["hidden_size"]), int(config["num_layers"])
    kinds = _layers(config, n_layers) if kinds is None else kinds
    block = 4 * h * h + 3 * h * _inner_size(config) + 3 * h * int(config["short_filter_length"]) + 8 * h
    n = n_layers * block + int(config["vocab_size"]) * h * (1 if config.get("tie_embeddings") else 2)
    for kind in ("hcs", "hcm"):
        layers = len(kinds[f"{kind}_layer_idxs"])
        if layers:
            n += layers * int(config[f"{kind}_filter_groups"]) * int(config[f"{kind}_filter_length"])
    return n + len(kinds["hcl_layer_idxs"]) * 2 * h * int(config["state_size"])
