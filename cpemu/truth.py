"""Truth recordings: GPU outputs with provenance, and checking the emulator against them.

A truth folder holds ``manifest.json`` (validated by ``schemas/truth.schema.json``)
and the ``.npz`` files it lists with their sha256. Each case records the
:class:`~cpemu.cases.Case` parameters, the sha256 of the regenerated inputs, and
the GPU's output bits (``stored: "bits"``, in the case's npz file under the case
id) or torch's error when the call was rejected.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .api import gemm
from .cases import Case, operands, sha256_arrays
from .formats import FP8_FORMATS
from .memory import OutputTooLarge, check_output
from .profile import check_schema, read_json_file

__all__ = ["load_manifest", "check_case", "CaseResult", "file_sha256", "features_of"]


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(folder: str, verify_files: bool = True) -> dict:
    """Load and validate ``folder/manifest.json``; check every listed file's sha256. A missing,
    unreadable, malformed or schema-invalid manifest raises ValueError naming the file."""
    path = os.path.join(folder, "manifest.json")
    man = read_json_file(path, "truth", "the truth manifest")
    check_schema(man, "truth", path, "truth")
    if verify_files:
        for name, digest in man["files"].items():
            try:
                got = file_sha256(os.path.join(folder, name))
            except OSError as e:
                raise ValueError(f"truth file {name}: listed in {path} but not readable ({e.strerror})") from None
            if got != digest:
                raise ValueError(f"truth file {name}: sha256 {got} does not match the manifest's {digest}")
    return man


def features_of(rec: dict) -> list[str]:
    """Feature labels of a recorded case, for per-feature counts."""
    f = [f"out-{rec['out_dtype']}", "fast-accum" if rec["fast_accum"] else "promotion",
         f"scale-{rec['scale']}", f"data-{rec['data']}", f"{rec['a_format']}x{rec['b_format']}"]
    if rec["bias"]:
        f.append("bias")
    f += [t for t in rec.get("tags", []) if t in ("evo2", "splitk-probe", "splitk-heldout")]
    if rec.get("splits", 1) > 1:
        f.append("split-k")
    return f


@dataclass
class CaseResult:
    case_id: str
    status: str  # "match", "mismatch", "rejected-both", "error"
    detail: str = ""
    mismatches: int = 0


def _inputs_for_gemm(case: Case):
    raw = operands(case)
    a, bt, sa, sb, bias = raw
    fa, fb = FP8_FORMATS[case.a_format], FP8_FORMATS[case.b_format]
    A = a.view(fa.np_dtype)
    B = bt.view(fb.np_dtype).T  # (K, N) transposed view, like torch's column-major operand
    if bias is not None:
        bias = bias.view(np.float16 if case.out_dtype == "float16" else ml_dtypes.bfloat16)
    sa = sa.reshape(()) if sa.size == 1 else sa
    sb = sb.reshape(()) if sb.size == 1 else sb
    return A, B, sa, sb, bias, raw


def check_case(rec: dict, bits: np.ndarray | None, profile: str, backend: str = "auto",
               max_report: int = 4) -> CaseResult:
    """Recompute one recorded case with cpemu and compare bits with the recording."""
    case = Case.from_json(rec)
    try:  # the regenerated operands and the output must fit before anything is drawn
        check_output(case.M, case.N, case.out_dtype, (case.M + case.N) * case.K)
    except OutputTooLarge as e:
        return CaseResult(case.id, "error", str(e))
    A, B, sa, sb, bias, raw = _inputs_for_gemm(case)
    digest = sha256_arrays(*raw)
    if digest != rec["inputs_sha256"]:
        return CaseResult(case.id, "error", "regenerated inputs differ from the recorded ones (sha256)")
    try:
        y = gemm(A, B, profile=profile, scale_a=sa, scale_b=sb, bias=bias, out_dtype=case.out_dtype,
                 fast_accum=case.fast_accum, backend=backend)
    except ValueError as e:
        if "error" in rec:
            return CaseResult(case.id, "rejected-both", f"torch: {rec['error'][:120]} | cpemu: {e}")
        return CaseResult(case.id, "error", f"cpemu refused a call torch accepted: {e}")
    if "error" in rec:
        return CaseResult(case.id, "error", f"torch rejected the call, cpemu accepted it: {rec['error'][:200]}")
    got = y.view(np.uint32 if y.dtype == np.float32 else np.uint16)
    if list(got.shape) != rec["output_shape"]:
        return CaseResult(case.id, "mismatch", f"shape {got.shape} != recorded {rec['output_shape']}", got.size)
    full_ok = sha256_arrays(got) == rec["output_sha256"]
    if bits is None or full_ok:
        return CaseResult(case.id, "match" if full_ok else "mismatch", "" if full_ok else "output sha256 differs",
                          int(not full_ok))
    if bits.ndim != 2 or bits.dtype != got.dtype or bits.shape[1] != got.shape[1] or bits.shape[0] > got.shape[0]:
        return CaseResult(case.id, "error", f"stored bits ({rec.get('file')}): {bits.dtype} of shape {bits.shape} are "
                                            f"not leading rows of the {got.dtype} output of shape {got.shape}")
    bad = np.argwhere(got[: bits.shape[0]] != bits)
    if len(bad) == 0:
        return CaseResult(case.id, "mismatch", f"output sha256 differs beyond the {bits.shape[0]} stored rows", 1)
    w = 8 if got.dtype == np.uint32 else 4
    lines = [f"[{i},{j}] gpu=0x{int(bits[i, j]):0{w}x} cpemu=0x{int(got[i, j]):0{w}x}" for i, j in bad[:max_report]]
    return CaseResult(case.id, "mismatch", "; ".join(lines), len(bad))


def _check_one(args):
    rec, bits, profile, backend = args
    return check_case(rec, bits, profile, backend)


def verify_folder(folder: str, profile=None, backend: str = "auto", progress=None, jobs: int = 1):
    """Check every case of a truth folder; returns (results, per-feature Counter of (feature, status)).

    ``jobs`` > 1 checks cases in that many processes (the reference is single-threaded)."""
    man = load_manifest(folder)
    profile = profile or man["profile"]
    cache: dict = {}

    def bits_of(rec):
        if rec.get("stored") != "bits":
            return None
        fname = rec.get("file")
        if not isinstance(fname, str):
            raise ValueError(f"truth manifest of {folder}: case {rec.get('id')!r} has stored bits but no 'file'")
        if fname not in cache:
            try:
                cache[fname] = np.load(os.path.join(folder, fname), allow_pickle=False)
            except (OSError, ValueError, EOFError) as e:
                raise ValueError(f"truth file {fname}: not a readable .npz of stored bits ({e})") from None
        if not hasattr(cache[fname], "files") or rec["id"] not in cache[fname].files:
            raise ValueError(f"truth file {fname}: holds no stored bits for case {rec['id']!r}")
        return cache[fname][rec["id"]]

    work = [(rec, bits_of(rec), profile, backend) for rec in man["cases"]]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as ex:
            it = ex.map(_check_one, work, chunksize=4)
            results = []
            for r in it:
                results.append(r)
                if progress:
                    progress(r)
    else:
        results = []
        for w in work:
            results.append(_check_one(w))
            if progress:
                progress(results[-1])
    counts = Counter()
    for rec, r in zip(man["cases"], results):
        for feat in features_of(rec):
            counts[(feat, r.status)] += 1
    return results, counts
