"""Callers of a profile's GPU library other than torch: what was checked for them.

A profile describes ``torch._scaled_mm`` on its GPU. Another caller of the same library
(Transformer Engine's ``te.Linear``, Evo 2's projections) configures cuBLASLt itself, so
its schedule is the profile's only where that was checked. The check's verdict lies beside
the profile as ``<profile>.te-caller.json`` (written by ``tools/te_caller_check.py`` on the
GPU, schema ``schemas/te_caller.schema.json``, with its provenance). :func:`te_caller`
reads it; :func:`te_schedule` says what it holds for one projection shape.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import jsonschema

from .profile import get_profile, load_schema

__all__ = ["te_caller", "te_schedule"]


@lru_cache(maxsize=None)
def _read(name: str):
    path = resources.files("cpemu.profile_data").joinpath(f"{name}.te-caller.json")
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    try:
        jsonschema.validate(doc, load_schema("te_caller"))
    except jsonschema.ValidationError as e:
        raise ValueError(f"{name}.te-caller.json does not follow schemas/te_caller.schema.json: {e.message[:300]}") \
            from None
    return doc


def te_caller(profile="hopper-h200-torch") -> dict | None:
    """The Transformer Engine caller verdict shipped beside ``profile``; None where none was recorded."""
    prof = get_profile(profile)
    return _read(prof.name)


def te_schedule(profile, N: int, K: int, M: int | None = None) -> str:
    """One line on whether TE's cuBLASLt schedule for (M, N, K) was checked to be the profile's (unsplit)."""
    doc = te_caller(profile)
    if doc is None:
        return "TE's cuBLASLt choice not recorded for this profile (torch's is emulated)"
    for model, callers in doc["shapes"].items():
        te = callers.get("te") or {}
        for ws in ("32MiB+1KiB", "32MiB"):  # TE's sm_90 workspaces (>= 2.8, <= 2.7)
            e = te.get(ws)
            if e is None or (e["N"], e["K"]) != (N, K) or not e["no_split"]:
                continue
            lo, hi = e["M"]
            if M is None or lo <= M <= hi:
                where = f"M = {lo}..{hi}" if M is None else f"M = {M}"
                return (f"TE's cuBLASLt choice checked unsplit for {model} ({where}, workspace {ws}) on "
                        f"{doc['provenance'].get('device_name')}")
    return f"TE's cuBLASLt choice not checked unsplit for N={N}, K={K}" + ("" if M is None else f", M={M}")
