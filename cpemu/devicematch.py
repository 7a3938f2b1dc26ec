"""Which shipped profiles match this machine: GPU name, SM count, cuBLASLt and torch versions.

A profile's bits are the GPU's own only on the device, library and caller it was recorded
with. :func:`detect` reads them here (the GPU through cupy or torch, the libcuBLASLt that
cpemu's tensor-core backend loads, torch's version); :func:`expects` reads them from a
profile (its ``provenance``, else its ``device``, ``library`` and ``caller`` texts);
:func:`match` compares the two. A field the profile does not record is not compared.
Nothing here raises: what cannot be detected is ``None`` with a reason.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys

__all__ = ["FIELDS", "detect", "expects", "match", "verdict_text", "cublaslt_text"]

FIELDS = ("gpu", "sm_count", "cublaslt", "torch")


def _short(e: BaseException) -> str:
    return " ".join((str(e) or type(e).__name__).split())


def cublaslt_text(v) -> str:
    """130100 -> "13.1.0 (130100)"."""
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100} ({v})" if isinstance(v, int) else str(v)


def _torch_version() -> str | None:
    if "torch" in sys.modules:
        return getattr(sys.modules["torch"], "__version__", None)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_gpu() -> tuple[dict | None, str]:
    """GPU 0 as torch sees it, or None and why not."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None, "torch is not installed"
    try:
        import torch

        if not torch.cuda.is_available():
            return None, f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
        p = torch.cuda.get_device_properties(0)
        return {"name": p.name, "sm_count": int(p.multi_processor_count),
                "compute_capability": f"{p.major}.{p.minor}"}, "torch"
    except Exception as e:  # noqa: BLE001 - a broken install means "no GPU found"
        return None, f"torch failed: {_short(e)}"


def _cublaslt() -> tuple[int | None, str]:
    """The version of the libcublasLt cpemu loads (the one torch loaded, when it has), or why none."""
    try:
        from .cuda.cublaslt import CublasLt, find_cublaslt

        path, how, _tried = find_cublaslt(None)
        return CublasLt(path).version(), f"{path} ({how})"
    except Exception as e:  # noqa: BLE001 - no library means "not found"
        return None, "no libcublasLt could be loaded" if "no libcublasLt" in str(e) else _short(e)


def detect(cupy_status: dict | None = None) -> dict:
    """This machine's GPU 0 (from ``cupy_status``, the dict ``cpemu info`` builds from cupy,
    else from torch), the cuBLASLt version and torch's version."""
    gpu, why = None, []
    devices = (cupy_status or {}).get("devices") or []
    if devices:
        d = devices[0]
        gpu = {"name": d["name"], "sm_count": d.get("sm_count"), "compute_capability": d.get("compute_capability")}
        found_by = "cupy"
    else:
        if cupy_status is not None:
            why.append(cupy_status.get("reason") or "cupy sees no CUDA device")
        gpu, how = _torch_gpu()
        found_by = how if gpu else None
        if gpu is None:
            why.append(how)
    lt, lt_how = _cublaslt()
    return {"gpu": gpu, "found_by": found_by, "no_gpu_reason": None if gpu else "; ".join(why),
            "cublaslt": lt, "cublaslt_source": lt_how, "torch": _torch_version()}


def _int_in(pattern: str, text: str | None) -> int | None:
    m = re.search(pattern, text or "")
    return int(m.group(1)) if m else None


def expects(data: dict) -> dict:
    """A profile's recorded device, library and caller: {field: value or None (not recorded)}."""
    prov = data.get("provenance") or {}
    device = data.get("device") or ""
    torch_m = re.search(r"\btorch (\d\S*)", data.get("caller") or "")
    lt = prov.get("cublaslt")
    return {"gpu": prov.get("gpu") or re.sub(r"\s*\([^)]*\)\s*$", "", device) or None,
            "sm_count": prov.get("sm_count") or _int_in(r"\((\d+) SMs\)", device),
            "cublaslt": lt if isinstance(lt, int) else _int_in(r"\((\d{5,})\)", data.get("library")),
            "torch": prov.get("torch") or (torch_m.group(1) if torch_m else None)}


def match(data: dict, found: dict) -> dict:
    """``{"verdict": "matches" | "differs", "differs": [...], "not_recorded": [...], "fields": ...}``
    of one profile's data against :func:`detect`'s result."""
    want = expects(data)
    gpu = found.get("gpu") or {}
    here = {"gpu": gpu.get("name"), "sm_count": gpu.get("sm_count"), "cublaslt": found.get("cublaslt"),
            "torch": found.get("torch")}
    fields, differs, unrecorded = {}, [], []
    for f in FIELDS:
        fields[f] = {"profile": want[f], "here": here[f]}
        if want[f] is None:
            unrecorded.append(f)
        elif here[f] is None or _comparable(f, want[f]) != _comparable(f, here[f]):
            differs.append(f)
    return {"verdict": "differs" if differs else "matches", "differs": differs, "not_recorded": unrecorded,
            "fields": fields}


def _comparable(field: str, value) -> str:
    """A field's value as compared: torch's public version (a wheel's metadata may carry no
    ``+cu130`` build tag where ``torch.__version__`` does; the CUDA build's library is compared
    as ``cublaslt``)."""
    text = str(value).strip()
    return text.split("+", 1)[0] if field == "torch" else text


def verdict_text(m: dict) -> str:
    """One line: "matches" or "differs: torch (profile 2.11.0+cu130, here 2.13.0)"."""
    def show(f, v):
        return "none" if v is None else (cublaslt_text(v) if f == "cublaslt" else str(v))

    text = "matches" if not m["differs"] else "differs: " + ", ".join(
        f"{f} (profile {show(f, m['fields'][f]['profile'])}, here {show(f, m['fields'][f]['here'])})"
        for f in m["differs"])
    return text + (f"; not recorded: {', '.join(m['not_recorded'])}" if m["not_recorded"] else "")
