"""Transformer Engine's forward FP8 GEMM as a caller of cuBLASLt: its descriptors and the verdict.

TE's ``cublas_gemm`` (``transformer_engine/common/gemm/cublaslt_gemm.cu``) differs from
torch's ``scaled_gemm`` for Evo 2's projections (bf16 output, no bias, tensorwise scales)
in the preference only; the matmul description is the same (docs/te-caller.md):

* workspace: ``get_cublas_workspace_size_bytes()`` is 32 MiB on sm_90 up to TE 2.7 and
  32 MiB + 1024 from TE 2.8; the heuristic is told that size minus ``256 -
  alignment(workspace)`` (0 for the caching allocator's 256-byte-aligned blocks);
* ``CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES`` set to the operands' alignments
  (256 for fresh allocations, which is cuBLASLt's default);
* ``CUBLASLT_MATMUL_DESC_EPILOGUE`` set to ``CUBLASLT_EPILOGUE_DEFAULT`` explicitly.

:func:`build_te_descs` makes them on top of torch's; :func:`cases` lists the queries of the
check (Evo 2's shapes at every M, each workspace, both callers); :func:`verdict` turns the
answers into the JSON that ``cpemu/profile_data/<profile>.te-caller.json`` holds.
"""

from __future__ import annotations

import ctypes

from cpemu.cuda.cublaslt import (CUBLASLT_EPILOGUE_DEFAULT, DESC_EPILOGUE, PREF_MIN_ALIGNMENT_BYTES, Case,
                                 build_descs, destroy_descs)
from cpemu.recording.splitk_query import CONFIG_FIELDS

__all__ = ["EVO2_SHAPES", "WORKSPACES", "te_heuristic_workspace", "build_te_descs", "m_values", "cases",
           "verdict", "run_check"]

#: Evo 2's FP8 projections, hidden -> 3*hidden: (N, K).
EVO2_SHAPES = {"evo2-1b": (5760, 1920), "evo2-7b": (12288, 4096), "evo2-40b": (24576, 8192)}

MIB = 1 << 20
#: The workspaces asked: torch's 1 MiB, 4 MiB (TE before sm_90), TE's 32 MiB (<= 2.7) and 32 MiB + 1 KiB (>= 2.8).
WORKSPACES = {"1MiB": MIB, "4MiB": 4 * MIB, "32MiB": 32 * MIB, "32MiB+1KiB": 32 * MIB + 1024}


def te_heuristic_workspace(allocated: int, address_alignment: int = 256) -> int:
    """The MAX_WORKSPACE_BYTES TE gives the heuristic for a workspace of ``allocated`` bytes
    whose address is ``address_alignment``-aligned (capped at 256: TE's ``_getAlignment``)."""
    align = 256
    while align > 1 and address_alignment % align:
        align //= 2
    return allocated - 256 + align


def build_te_descs(lt, c: Case, ptrs: dict, workspace_bytes: int, alignment: int = 256) -> dict:
    """The descriptors TE's ``cublas_gemm`` makes for ``c`` (torch's plus TE's extras above)."""
    made = build_descs(lt, c, ptrs, workspace_bytes)
    try:
        if not c.bias:
            lt.set_desc(made["desc"], DESC_EPILOGUE, ctypes.c_uint32(CUBLASLT_EPILOGUE_DEFAULT), "set EPILOGUE")
        for key, attr in PREF_MIN_ALIGNMENT_BYTES.items():
            v = ctypes.c_uint32(alignment)
            lt._check(f"set MIN_ALIGNMENT_{key}_BYTES",
                      lt.pref_set(made["pref"], attr, ctypes.byref(v), ctypes.sizeof(v)))
    except Exception:
        destroy_descs(lt, made)
        raise
    return made


def m_values(lo: int = 16, hi: int = 16384, step: int = 16) -> list:
    """Every multiple of ``step`` from ``lo`` to ``hi`` (vortex pads tokens to 16)."""
    if lo < 1 or hi < lo or step < 1:
        raise ValueError(f"M range: need 1 <= lo <= hi and step >= 1 (got {lo}, {hi}, {step})")
    return list(range(lo - lo % step if lo % step else lo, hi + 1, step)) if step > 1 else list(range(lo, hi + 1))


def cases(ms=None, shapes=None, workspaces=None, callers=("torch", "te")):
    """``(model, caller, workspace name, workspace bytes, Case)`` for every query of the check:
    e4m3 x e4m3, bf16 out, fast accumulation, no bias, tensorwise (TE's forward GEMM)."""
    ms = m_values() if ms is None else ms
    shapes = EVO2_SHAPES if shapes is None else shapes
    workspaces = WORKSPACES if workspaces is None else workspaces
    for model, (N, K) in shapes.items():
        for caller in callers:
            for wname, wbytes in workspaces.items():
                ask = te_heuristic_workspace(wbytes) if caller == "te" else wbytes
                for M in ms:
                    yield model, caller, wname, ask, Case(M, N, K, "e4m3", "e4m3", "bfloat16", True, False,
                                                          "tensorwise")


def _config(row: dict):
    return tuple(row.get(k) for k in CONFIG_FIELDS)


def verdict(rows: list, provenance: dict) -> dict:
    """The check's JSON: per model, caller and workspace, whether any M split K, the M that did,
    the configurations seen, and whether TE's answer equals torch's (1 MiB) at every M.

    ``rows``: dicts with ``model``, ``caller``, ``workspace``, ``M``, ``status`` and the algo
    fields of :func:`cpemu.recording.cublaslt_query.query_case`."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["caller"], r["workspace"]), []).append(r)
    torch_at = {(r["model"], r["M"]): _config(r) for r in rows if r["caller"] == "torch" and r["workspace"] == "1MiB"}
    out = {"kind": "te-caller", "provenance": provenance, "shapes": {}}
    for (model, caller, ws), rs in sorted(groups.items()):
        ok = [r for r in rs if r["status"] == "OK"]
        split = sorted(r["M"] for r in ok if (r.get("splitk_num") or 1) > 1)
        entry = {"N": rs[0]["N"], "K": rs[0]["K"], "M": [min(r["M"] for r in rs), max(r["M"] for r in rs)],
                 "queries": len(rs), "answered": len(ok), "split_M": split,
                 "no_split": not split and len(ok) == len(rs),
                 "configs": sorted({"/".join(str(v) for v in _config(r)) for r in ok})}
        if torch_at:
            same = [r["M"] for r in ok if torch_at.get((model, r["M"])) == _config(r)]
            entry["equal_to_torch_1MiB"] = len(same) == len(rs)
            entry["differs_from_torch_1MiB_at_M"] = sorted({r["M"] for r in rs} - set(same))[:64]
        out["shapes"].setdefault(model, {}).setdefault(caller, {})[ws] = entry
    te = [e for m in out["shapes"].values() for w in m.get("te", {}).values() for e in [w]]
    out["te_no_split"] = bool(te) and all(e["no_split"] for e in te)
    return out


def run_check(ask, queries) -> list:
    """Ask every query; ``ask(caller, case, workspace_bytes)`` returns a query_case row.
    Returns the rows with ``model``, ``caller`` and ``workspace`` added."""
    rows = []
    for model, caller, wname, wbytes, case in queries:
        row = dict(ask(caller, case, wbytes))
        row.update(model=model, caller=caller, workspace=wname, workspace_asked=wbytes)
        rows.append(row)
    return rows
