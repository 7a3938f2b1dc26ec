"""Profiles: a device + library + caller, as data (``cpemu/profiles/*.json``).

A profile holds the instruction model, the GEMM schedule (promotion interval,
split-K rule, reduction), the epilogue per scaling mode, the operand formats and
output dtypes it covers, its provenance and how it was verified. Each file is
validated against ``schemas/profile.schema.json`` when loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import jsonschema

from .call import Call, Epilogue
from .formats import FP8_FORMATS
from .instruction import InstructionModel
from .schedule import Plan, SplitKRule, UnsupportedShape, kernel_slices
from .splitk import no_algorithm

__all__ = ["Profile", "profiles", "get_profile", "load_schema", "ProfileFeatureError", "read_json_file",
           "check_schema"]

DEFAULT_PROFILE = "hopper-h200-torch"


class ProfileFeatureError(ValueError):
    """The call needs a feature that the profile does not record."""


def load_schema(name: str) -> dict:
    """A JSON schema shipped with the package (``schemas/<name>.schema.json``).

    Installed, the top-level ``schemas/`` folder is the subpackage ``cpemu.schemas``; in a
    source checkout that is not installed it is read from the folder itself."""
    try:
        return json.loads(resources.files("cpemu.schemas").joinpath(f"{name}.schema.json").read_text())
    except ModuleNotFoundError:
        import os

        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas",
                            f"{name}.schema.json")
        with open(path) as f:
            return json.load(f)


@dataclass(frozen=True)
class Profile:
    name: str
    data: dict
    base_dir: str | None = None  # folder of a profile loaded from a file (for its split-K table)
    # derived values (the instruction model, plans per call signature), computed once: a
    # profile's data is not changed after it is loaded
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_file(cls, path: str) -> "Profile":
        """Load and validate a profile JSON file (e.g. one written by ``cpemu record``)."""
        data = read_json_file(path, "profile", "the profile file")
        _validate(data, path)
        return cls(data["name"], data, os.path.dirname(os.path.abspath(path)))

    @property
    def instruction(self) -> InstructionModel:
        model = self._memo.get("instruction")
        if model is None:
            model = self._memo["instruction"] = InstructionModel.from_json(self.data["instruction"])
        return model

    @property
    def status(self) -> str:
        return self.data["verification"]["status"]

    def mode(self, scaling: str) -> dict:
        """The schedule + epilogue of a scaling mode ("tensorwise" or "rowwise")."""
        m = self.data["modes"].get(scaling)
        if m is None:
            raise ProfileFeatureError(
                f"profile {self.name!r} does not record {scaling} scaling "
                f"(recorded modes: {sorted(self.data['modes'])})")
        return m

    def split_rule(self, scaling: str) -> SplitKRule:
        sk = self.mode(scaling)["split_k"]
        return SplitKRule(kind=sk["kind"], granularity=sk.get("granularity", 128), domain=sk.get("domain"),
                          params=sk.get("params"), base_dir=self.base_dir, tail=sk.get("tail"))

    def plan(self, M: int, N: int, K: int, fast_accum: bool, scaling: str = "tensorwise",
             a_format: str = "e4m3", b_format: str = "e4m3", out_dtype: str = "bfloat16") -> Plan:
        """The schedule of one call: split-K slices and promotion (see :mod:`cpemu.schedule`).

        Cached per call signature (a refused shape raises on every call)."""
        key = ("plan", M, N, K, bool(fast_accum), scaling, a_format, b_format, out_dtype)
        plan = self._memo.get(key)
        if plan is None:
            plan = self._plan(M, N, K, fast_accum, scaling, a_format, b_format, out_dtype)
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = plan
        return plan

    def call(self, M: int, N: int, K: int, a_format: str = "e4m3", b_format: str = "e4m3",
             out_dtype: str = "bfloat16", scaling: str = "tensorwise", fast_accum: bool = True,
             bias_dtype: str | None = None, split_k: int | None = None) -> Call:
        """The :class:`~cpemu.call.Call` of one call signature: the profile's features checked
        (:meth:`check_features`), its plan (:meth:`plan`), instruction model and epilogue.

        Built once per signature and cached; a call the profile refuses raises every time
        (:class:`ProfileFeatureError`, :class:`~cpemu.schedule.UnsupportedShape`). M >= 1: an
        empty call (M = 0) has no schedule; its entry returns the empty result itself.

        ``split_k``: the caller's statement of the library's split count (cuBLASLt's
        ``SPLITK_NUM``) in place of the profile's split-K rule and tables; the slicing, the
        chains and the reduction stay the profile's."""
        key = ("call", M, N, K, a_format, b_format, out_dtype, scaling, bool(fast_accum), bias_dtype, split_k)
        call = self._memo.get(key)
        if call is None:
            self.check_features(a_format, b_format, out_dtype, scaling, bias_dtype)
            if split_k is None:
                plan = self.plan(M, N, K, fast_accum, scaling, a_format, b_format, out_dtype)
                why = no_algorithm(self.mode(scaling)["split_k"].get("no_algorithm"), M, N, K, fast_accum,
                                   bias_dtype is not None, (a_format, b_format, out_dtype), self.base_dir)
                if why is not None:
                    raise UnsupportedShape(*why)
            else:
                mode, rule = self.mode(scaling), self.split_rule(scaling)
                plan = Plan(slices=kernel_slices(K, int(split_k), rule),
                            promotion=None if fast_accum else int(mode["promotion_interval"]))
            call = Call(M, N, K, FP8_FORMATS[a_format], FP8_FORMATS[b_format], out_dtype, scaling, bias_dtype,
                        bool(fast_accum), plan, self.instruction, Epilogue.from_mode(self.mode(scaling), out_dtype),
                        self.name)
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = call
        return call

    def _plan(self, M, N, K, fast_accum, scaling, a_format, b_format, out_dtype) -> Plan:
        mode = self.mode(scaling)
        rule = self.split_rule(scaling)
        splits = rule.splits(M, N, K, fast_accum, (a_format, b_format, out_dtype))
        promo = None if fast_accum else int(mode["promotion_interval"])
        return Plan(slices=kernel_slices(K, splits, rule), promotion=promo)

    def check_features(self, a_format: str, b_format: str, out_dtype: str, scaling: str, bias_dtype: str | None):
        pairs = [tuple(p) for p in self.data["formats"]]
        if (a_format, b_format) not in pairs:
            raise ProfileFeatureError(
                f"profile {self.name!r} does not support operand formats a={a_format}, b={b_format} "
                f"(supported pairs: {pairs})")
        mode = self.mode(scaling)
        if out_dtype not in mode["out_dtypes"]:
            raise ProfileFeatureError(
                f"profile {self.name!r} does not record out_dtype={out_dtype!r} with {scaling} scaling "
                f"(recorded: {mode['out_dtypes']})")
        if bias_dtype is not None:
            allowed = mode["bias_dtypes"].get(out_dtype)
            if allowed is None:
                raise ProfileFeatureError(
                    f"profile {self.name!r}: bias is not supported with out_dtype={out_dtype!r} and "
                    f"{scaling} scaling")
            if bias_dtype != allowed:
                raise ProfileFeatureError(
                    f"bias must have dtype {allowed} for out_dtype={out_dtype!r} "
                    f"(profile {self.name!r}), got {bias_dtype}")


def read_json_file(path: str, arg: str, what: str):
    """The JSON document of a file, or a ValueError naming ``arg``, the file and what is wrong."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{arg}: cannot read {what} {path!r}: {getattr(e, 'strerror', None) or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{arg}: {path!r} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") \
            from None


def check_schema(data, schema: str, where: str, arg: str) -> None:
    """``schemas/<schema>.schema.json``'s verdict as a ValueError naming the file, the place and the rule."""
    try:
        jsonschema.validate(data, load_schema(schema))
    except jsonschema.ValidationError as e:
        at = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise ValueError(f"{arg}: {where!r} does not follow schemas/{schema}.schema.json at {at}: "
                         f"{e.message[:300]}") from None


#: per output dtype: (exponent mask, fraction mask) of its bit patterns
_NAN_FIELDS = {"bfloat16": (0x7F80, 0x007F), "float16": (0x7C00, 0x03FF), "float32": (0x7F800000, 0x007FFFFF)}


def _validate(data, where: str) -> None:
    """The profile schema's verdict as a ValueError naming the file, the place and the rule; then
    what the schema cannot say: every ``nan_bits`` pattern is a NaN of its format."""
    check_schema(data, "profile", where, "profile")
    for scaling, mode in data["modes"].items():
        for dt, bits in (mode.get("nan_bits") or {}).items():
            exp, frac = _NAN_FIELDS[dt]
            if bits & exp != exp or not bits & frac:
                raise ValueError(f"profile: {where!r} at modes/{scaling}/nan_bits/{dt}: 0x{bits:x} is not a NaN "
                                 f"bit pattern of {dt}")


@lru_cache(maxsize=None)
def _load(name: str) -> Profile:
    path = resources.files("cpemu.profile_data").joinpath(f"{name}.json")
    data = json.loads(path.read_text())
    _validate(data, f"{name}.json")
    if data["name"] != name:
        raise ValueError(f"profile file {name}.json names itself {data['name']!r}")
    return Profile(name, data)


def profiles() -> list[str]:
    """Names of the profiles shipped with cpemu."""
    return list(_shipped())


@lru_cache(maxsize=1)
def _shipped() -> tuple:
    return tuple(sorted(p.name[:-5] for p in resources.files("cpemu.profile_data").iterdir()
                        if p.name.endswith(".json") and "." not in p.name[:-5]))


def get_profile(name: str | Profile = DEFAULT_PROFILE) -> Profile:
    """Load and validate a shipped profile by name, or a profile JSON file by path."""
    if isinstance(name, Profile):
        return name
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if isinstance(name, str) and (name.endswith(".json") or "/" in name):
        return Profile.from_file(name)
    if name not in _shipped():
        raise ValueError(f"profile: unknown profile {name!r}; available: {profiles()}")
    return _load(name)
