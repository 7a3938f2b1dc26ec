"""Transformer Engine's delayed-scaling ``_extra_state``, read without Transformer Engine.

A TE linear layer saves its FP8 metadata in the state dict under ``<prefix>._extra_state``.
Three formats exist (Transformer Engine's ``transformer_engine/pytorch/module/base.py``,
``TransformerEngineBaseModule.get_extra_state`` / ``set_extra_state``):

* TE 1.x (v1.13): an ``io.BytesIO`` holding ``torch.save(state)``, with ``scale_fwd``,
  ``scale_inv_fwd``, ``amax_history_fwd``, the same three for ``bwd``, and
  ``extra_fp8_variables``. Evo 2's checkpoints and vortex's loader use this form.
* TE >= 2.0 (PR #1335, "Store module extra state in tensor"): a 1-D ``torch.uint8`` tensor
  holding ``pickle.dumps(state)``; ``state`` adds ``recipe`` (a ``DelayedScaling`` object)
  and drops the ``scale_inv`` entries.
* An empty tensor or ``None``: no FP8 state (the layer never ran in FP8).

``scale_fwd`` has three entries per GEMM, indexed by TE's ``FP8FwdTensors``
(``transformer_engine/pytorch/csrc/common.h``): 0 the input, 1 the weight, 2 the output.

Pickles can run code when loaded. :func:`read_extra_state` never imports Transformer Engine
and never runs a pickle freely: its unpickler allows only what TE's state holds (torch's
tensor rebuild functions, ``collections.OrderedDict``, plain Python values); TE's own classes
(the recipe, its ``Format`` enum) load as inert :class:`TEObject` records of their fields.
Anything else raises ``ValueError`` naming the global.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field

import torch

__all__ = ["DelayedScalingState", "TEObject", "read_extra_state", "write_extra_state", "load_checkpoint",
           "GEMM1_INPUT", "GEMM1_WEIGHT", "GEMM1_OUTPUT"]

#: TE's FP8FwdTensors indices (transformer_engine/pytorch/csrc/common.h).
GEMM1_INPUT, GEMM1_WEIGHT, GEMM1_OUTPUT = 0, 1, 2


class TEObject:
    """An inert stand-in for an object of Transformer Engine's classes in a pickle.

    ``cls`` is the class's dotted name; ``args`` what the pickle called it with (an enum's
    value); ``state`` its attributes (a dataclass's fields)."""

    def __init__(self, cls: str, args: tuple = ()):
        self.cls, self.args, self.state = cls, tuple(args), {}

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.state = dict(state) if isinstance(state, dict) else {"state": state}

    def __repr__(self) -> str:
        inner = ", ".join([repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.state.items()])
        return f"{self.cls.rsplit('.', 1)[-1]}({inner})"


#: the most elements an _extra_state scale or amax history may hold (TE keeps 3 scales per GEMM and
#: an amax history of at most a few thousand steps)
_MAX_STATE_ELEMENTS = 1 << 20


def _te_class(dotted: str):
    """A callable that the unpickler uses for TE's class ``dotted``: calls and ``__new__`` give a TEObject."""

    class _Stand(TEObject):
        def __new__(cls, *args, **kwargs):  # pickle's NEWOBJ calls __new__ only
            obj = TEObject.__new__(cls)
            TEObject.__init__(obj, dotted, args)
            return obj

        def __init__(self, *args, **kwargs):
            pass

        def __reduce__(self):  # pragma: no cover - never re-pickled
            raise TypeError(f"{dotted}: a stand-in read from a checkpoint; it cannot be pickled")

    _Stand.__name__ = _Stand.__qualname__ = dotted.rsplit(".", 1)[-1]
    return _Stand


def _storage_from_bytes(b: bytes):
    """torch.storage._load_from_bytes, with torch's weights-only loader (a bare storage)."""
    return torch.load(io.BytesIO(b), map_location="cpu", weights_only=True)


_ALLOWED = {
    ("torch._utils", "_rebuild_tensor"): lambda: torch._utils._rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): lambda: torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): lambda: torch._utils._rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): lambda: torch._tensor._rebuild_from_type_v2,
    ("torch", "Tensor"): lambda: torch.Tensor,
    ("torch", "Size"): lambda: torch.Size,
    ("torch.storage", "_load_from_bytes"): lambda: _storage_from_bytes,
    ("collections", "OrderedDict"): lambda: __import__("collections").OrderedDict,
    ("builtins", "set"): lambda: set,
    ("builtins", "frozenset"): lambda: frozenset,
    ("builtins", "slice"): lambda: slice,
    ("builtins", "complex"): lambda: complex,
}


class _Refused(pickle.UnpicklingError):
    """A global that a TE extra state never holds."""


class _Unpickler(pickle.Unpickler):
    """Loads TE's extra state only: see the module docstring."""

    def find_class(self, module, name):
        if module == "transformer_engine" or module.startswith("transformer_engine."):
            return _te_class(f"{module}.{name}")
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        make = _ALLOWED.get((module, name))
        if make is None:
            raise _Refused(f"{module}.{name}")
        return make()


class _PickleModule:
    """What ``torch.load(pickle_module=...)`` needs: an Unpickler class and ``load``."""

    Unpickler = _Unpickler
    __name__ = "cpemu_te_state_pickle"

    @staticmethod
    def load(f, **kw):
        return _Unpickler(f, **kw).load()


class _CheckpointUnpickler(_Unpickler):
    """A whole checkpoint: also the ``io.BytesIO`` objects that hold TE 1.x extra states."""

    def find_class(self, module, name):
        if (module, name) == ("_io", "BytesIO"):
            return io.BytesIO
        if (module, name) == ("_codecs", "encode"):  # protocol 2 spells bytes as encode(str, "latin1")
            return _latin1
        return super().find_class(module, name)


def _latin1(text, encoding="latin1"):
    if encoding != "latin1" or not isinstance(text, str):
        raise _Refused(f"_codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode("latin1")


class _CheckpointPickleModule(_PickleModule):
    Unpickler = _CheckpointUnpickler

    @staticmethod
    def load(f, **kw):
        return _CheckpointUnpickler(f, **kw).load()


def load_checkpoint(f, map_location="cpu") -> dict:
    """A TE model's checkpoint (``torch.save`` of its state dict), loaded without running code.

    Like ``torch.load(f, weights_only=True)``, but it also loads what TE's checkpoints hold
    and the weights-only loader refuses: the ``io.BytesIO`` extra states of TE 1.x and the
    pickled recipes of TE >= 2.0 (as inert records). Any other global raises ValueError."""
    name = f if isinstance(f, (str, bytes)) or hasattr(f, "__fspath__") else type(f).__name__
    if not (isinstance(f, (str, bytes)) or hasattr(f, "__fspath__") or hasattr(f, "read")):
        raise ValueError(f"checkpoint: must be a file path or a binary file object (got {name})")
    try:
        sd = torch.load(f, map_location=map_location, weights_only=False, pickle_module=_CheckpointPickleModule)
    except _Refused as e:
        raise ValueError(f"checkpoint: holds {e}, which a Transformer Engine checkpoint never holds; refused "
                         f"(a pickle can run code)") from None
    except (OSError, EOFError, RuntimeError, ValueError, TypeError, AttributeError, pickle.UnpicklingError) as e:
        raise ValueError(f"checkpoint: {name!s} is not a torch.save checkpoint "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    if not isinstance(sd, dict):
        raise ValueError(f"checkpoint: {name!s} holds a {type(sd).__name__}, not a state dict")
    return sd


@dataclass(frozen=True)
class DelayedScalingState:
    """The forward FP8 metadata of one TE layer, as its checkpoint holds it.

    ``scale_fwd`` (3 per GEMM) and ``amax_history_fwd`` (history, 3 per GEMM) are float32
    CPU tensors; ``scale_inv_fwd`` is present in TE 1.x checkpoints only (TE recomputes it
    as ``1/scale`` when it casts, so cpemu does too). ``recipe`` holds the stored recipe's
    fields (TE >= 2.0), ``extra`` TE's ``extra_fp8_variables``, ``source`` the format read."""

    scale_fwd: torch.Tensor
    amax_history_fwd: torch.Tensor
    scale_inv_fwd: torch.Tensor | None = None
    recipe: dict | None = None
    extra: dict = field(default_factory=dict)
    source: str = ""

    def scale(self, index: int) -> float:
        """One forward scale (``GEMM1_INPUT``, ``GEMM1_WEIGHT`` or ``GEMM1_OUTPUT``) as a Python float."""
        return float(self.scale_fwd.reshape(-1)[index])

    @property
    def input_scale(self) -> float:
        return self.scale(GEMM1_INPUT)

    @property
    def weight_scale(self) -> float:
        return self.scale(GEMM1_WEIGHT)


def _recipe_fields(obj) -> dict | None:
    if obj is None:
        return None
    if not isinstance(obj, TEObject):
        return {"recipe": repr(obj)}
    out = {"class": obj.cls}
    for k, v in obj.state.items():
        out[k] = repr(v) if isinstance(v, TEObject) else v
    return out


def _unpickle(raw, what: str):
    try:
        if isinstance(raw, io.BytesIO):
            raw.seek(0)
            return torch.load(raw, map_location="cpu", weights_only=False, pickle_module=_PickleModule)
        return _Unpickler(io.BytesIO(raw)).load()
    except _Refused as e:
        raise ValueError(f"{what}: holds {e}, which a Transformer Engine extra state never holds; "
                         f"refused (a pickle can run code)") from None
    except Exception as e:  # noqa: BLE001 - a damaged payload: name it
        raise ValueError(f"{what}: not a readable Transformer Engine extra state ({type(e).__name__}: {e})") from None


def read_extra_state(value, what: str = "_extra_state") -> DelayedScalingState | None:
    """The delayed-scaling state of one TE layer's ``_extra_state``; None where it holds none.

    ``value`` is what the state dict holds: an ``io.BytesIO`` (TE 1.x), a uint8 tensor
    (TE >= 2.0), an already loaded dict, an empty tensor or None. ``what`` names it in errors."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:
            return None
        if value.dtype != torch.uint8:
            raise ValueError(f"{what}: a tensor extra state must be torch.uint8 pickle bytes (got {value.dtype})")
        state, source = _unpickle(value.detach().cpu().contiguous().numpy().tobytes(), what), \
            "TE >= 2.0: uint8 tensor of pickle bytes"
    elif isinstance(value, io.BytesIO):
        state, source = _unpickle(value, what), "TE 1.x: io.BytesIO of torch.save"
    elif isinstance(value, dict):
        state, source = value, "dict"
    else:
        raise ValueError(f"{what}: must be an io.BytesIO, a uint8 tensor, a dict or None "
                         f"(got {type(value).__name__})")
    if state is None:
        return None
    if not isinstance(state, dict):
        raise ValueError(f"{what}: holds a {type(state).__name__}, not TE's state dict")
    if "scale_fwd" not in state:
        return None  # a stateless recipe, or only a recipe: no delayed-scaling scales
    missing = [k for k in ("amax_history_fwd",) if k not in state]
    if missing:
        raise ValueError(f"{what}: has scale_fwd but not {missing}")
    recipe = state.get("recipe")
    if isinstance(recipe, TEObject) and not recipe.cls.endswith(".DelayedScaling"):
        raise ValueError(f"{what}: recipe {recipe.cls} is not delayed scaling")
    def f32(field):
        t = state[field]
        if not isinstance(t, torch.Tensor):  # a list or number: its size is the pickle's own
            try:
                t = torch.as_tensor(t)
            except (TypeError, ValueError, RuntimeError) as e:
                raise ValueError(f"{what}: {field} must be a tensor of numbers (got {type(state[field]).__name__}: "
                                 f"{e})") from None
        if t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{what}: {field} must be a real tensor (got {t.dtype})")
        if t.numel() > _MAX_STATE_ELEMENTS:  # checked before the copy (an expanded view may claim any size)
            raise ValueError(f"{what}: {field} has {t.numel()} elements; TE keeps a few per GEMM "
                             f"(at most {_MAX_STATE_ELEMENTS} accepted)")
        return t.detach().to("cpu", torch.float32).clone()

    extra = state.get("extra_fp8_variables") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{what}: extra_fp8_variables must be a dict (got {type(extra).__name__})")
    return DelayedScalingState(
        scale_fwd=f32("scale_fwd").reshape(-1), amax_history_fwd=f32("amax_history_fwd"),
        scale_inv_fwd=f32("scale_inv_fwd").reshape(-1) if state.get("scale_inv_fwd") is not None else None,
        recipe=_recipe_fields(recipe), extra=dict(extra), source=source)


def write_extra_state(scale_fwd, amax_history_fwd, *, fmt: str = "te2", scale_bwd=None, amax_history_bwd=None,
                      recipe=None, extra: dict | None = None):
    """An ``_extra_state`` value in TE's format, for tests and for tools that build checkpoints.

    ``fmt="te2"``: the uint8 tensor of ``pickle.dumps(state)`` (TE >= 2.0); ``recipe`` is put
    in as given (None leaves it out). ``fmt="te1"``: the ``io.BytesIO`` of ``torch.save(state)``
    with ``scale_inv_*`` as TE 1.x wrote them (``1/scale``)."""
    scale_fwd = torch.as_tensor(scale_fwd, dtype=torch.float32).reshape(-1)
    hist = torch.as_tensor(amax_history_fwd, dtype=torch.float32)
    sb = torch.ones(2, dtype=torch.float32) if scale_bwd is None else torch.as_tensor(scale_bwd, dtype=torch.float32)
    hb = torch.zeros(hist.shape[0], 2) if amax_history_bwd is None else torch.as_tensor(amax_history_bwd)
    state = {"scale_fwd": scale_fwd, "amax_history_fwd": hist, "scale_bwd": sb, "amax_history_bwd": hb}
    state["extra_fp8_variables"] = dict(extra or {"num_gemms": 1, "fp8_checkpoint": True})
    if fmt == "te1":
        state["scale_inv_fwd"] = torch.reciprocal(scale_fwd)
        state["scale_inv_bwd"] = torch.reciprocal(sb)
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        return buf
    if fmt != "te2":
        raise ValueError(f"fmt: must be 'te1' or 'te2' (got {fmt!r})")
    if recipe is not None:
        state["recipe"] = recipe
    return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)
