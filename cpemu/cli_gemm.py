"""The operands, early checks and report of ``cpemu gemm`` (the command itself is in :mod:`cpemu.cli`).

Operands come from ``.npy`` files (uint8 codes, or the records np.save writes for ml_dtypes
arrays) or from a demo call (:mod:`cpemu.demo`); a demo call is checked against the profile, the
backend and the memory available before its inputs are drawn.
"""

from __future__ import annotations

import hashlib
import os
import sys

import click
import ml_dtypes
import numpy as np

from .cases import Case, operands, sha256_arrays
from .formats import FP8_FORMATS
from .profile import Profile

__all__ = ["file_operands", "demo_call", "check_before_inputs", "demo_operands", "scale", "save", "gemm_call",
           "gemm_record", "print_gemm"]

#: the descr np.save writes for an ml_dtypes float8_e5m2 array (np.load cannot read it)
_E5M2_DESCR = ("<f1", "|f1", ">f1")


def _npy_header(path: str):
    """(header dict, offset of the data, bytes after it) of a .npy file, parsed without numpy's
    dtype check (which refuses float8_e5m2's '<f1'); None where there is no readable header
    (np.load then says why)."""
    import ast

    try:
        with open(path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            size = int.from_bytes(f.read(2 if major == 1 else 4), "little")
            head = ast.literal_eval(f.read(size).decode("latin1"))
            offset = f.tell()
            held = os.fstat(f.fileno()).st_size - offset
    except (OSError, ValueError, SyntaxError, TypeError, MemoryError):
        return None
    return (head, offset, held) if isinstance(head, dict) else None


def _check_npy_size(path: str, arg: str, header) -> None:
    """Compare a .npy header's shape with the bytes the file holds, before anything is allocated
    (a header may claim any size). Shapes and dtypes numpy cannot parse are left to np.load."""
    head, _, held = header
    shape, e5m2 = head.get("shape"), head.get("descr") in _E5M2_DESCR
    bad = f"{arg}: {path} is not a readable .npy file of FP8 codes"
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                               for d in shape):
        if e5m2:
            raise click.ClickException(f"{bad} (float8_e5m2 codes with shape {shape!r}: not a tuple of sizes)")
        return
    try:
        dtype = np.dtype("u1" if e5m2 else head.get("descr"))
    except (TypeError, ValueError):
        return
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if e5m2 and need != held:
        raise click.ClickException(f"{bad} (its header says float8_e5m2 codes of shape {shape}, {need} bytes, "
                                   f"and the file holds {held})")
    if dtype.hasobject or need != held:
        raise click.ClickException(f"{bad} (its header says shape {shape} of {dtype}, {need} bytes, and the file "
                                   f"holds {held})")


def _read_npy(path: str, arg: str) -> np.ndarray:
    """The array of a .npy file, or a ClickException naming the option, the file and the rule.
    np.save writes an ml_dtypes float8_e5m2 array with descr '<f1'; its codes are read as
    float8_e5m2."""
    header = _npy_header(path)
    if header is not None:
        _check_npy_size(path, arg, header)
    try:
        x = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        if header is None or header[0].get("descr") not in _E5M2_DESCR:
            raise click.ClickException(f"{arg}: {path} is not a readable .npy file of FP8 codes "
                                       f"({type(e).__name__}: {' '.join(str(e).split())})") from None
        head, offset, held = header
        codes = np.fromfile(path, dtype=np.uint8, count=held, offset=offset)  # held: checked against the shape
        x = codes.reshape(head["shape"], order="F" if head.get("fortran_order") else "C").view(ml_dtypes.float8_e5m2)
    if not isinstance(x, np.ndarray):  # an .npz archive under another name
        raise click.ClickException(f"{arg}: {path} is an .npz archive, not a .npy file of one array")
    return x


def _load_operand(path: str, fmt_name: str | None, arg: str) -> np.ndarray:
    """An FP8 operand from .npy: uint8 codes viewed as ``fmt_name`` (default e4m3), an array of an
    FP8 dtype (np.save writes float8_e5m2 as '<f1', read back as e5m2), or the raw 1-byte records
    ('V1') np.save writes for the other ml_dtypes arrays, float8_e4m3fn among them: those carry no
    format, so ``--a-format``/``--b-format`` must name it."""
    x = _read_npy(path, arg)
    if x.dtype in (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)):
        got = "e4m3" if x.dtype == np.dtype(ml_dtypes.float8_e4m3fn) else "e5m2"
        if fmt_name is not None and fmt_name != got:
            raise click.ClickException(f"{arg}: {path} holds {x.dtype} but --{arg}-format is {fmt_name}")
        return x
    if x.dtype == np.dtype("V1") and fmt_name is None:
        raise click.ClickException(
            f"{arg}: {path} holds raw 1-byte records (dtype V1: np.save writes float8_e4m3fn and other 1-byte "
            f"ml_dtypes arrays so), which do not say their format; give --{arg}-format e4m3 or e5m2, "
            f"or save the codes as uint8")
    if x.dtype == np.uint8 or x.dtype == np.dtype("V1"):
        return x.view(np.uint8).view(FP8_FORMATS[fmt_name or "e4m3"].np_dtype)
    raise click.ClickException(
        f"{arg}: {path} must hold FP8 codes as uint8 (with --{arg}-format e4m3|e5m2), got dtype {x.dtype}")


def scale(value: float, name: str, notes: list) -> np.ndarray:
    """A command-line scale as the float32 tensor torch would get (0-d float32 array).

    ``cpemu.gemm`` refuses Python floats that float32 cannot hold exactly; on the command
    line the value is rounded to float32 (as ``torch.tensor(value)`` does) and a note says so.
    """
    with np.errstate(over="ignore"):
        s = np.array(value, dtype=np.float32)
    if np.isfinite(value) and not np.isfinite(s):
        raise click.ClickException(f"{name}: {value!r} overflows float32 (largest finite float32 is 3.4028235e38)")
    if np.isfinite(value) and float(s) != value:
        notes.append(f"{name} {value!r} is not exactly representable in float32; "
                     f"using float32 {float(s)!r} (torch.tensor({value!r}) rounds the same way)")
    return s


def save(path: str, y: np.ndarray) -> str:
    if y.dtype == np.dtype(ml_dtypes.bfloat16):
        # np.save does not keep ml_dtypes dtypes (bfloat16 is written as raw 'V2' records
        # that np.load cannot turn back into bfloat16), so store the bit patterns.
        np.save(path, y.view(np.uint16))
        return "bfloat16 output saved as uint16 bit patterns (read with np.load(...).view(ml_dtypes.bfloat16))"
    np.save(path, y)
    return f"{y.dtype} output saved"


def file_operands(a_path, b_path, a_format, b_format, b_transposed, demo, m_rows):
    """A (M, K) and B (K, N) from .npy files, and the text naming them."""
    if (a_path is None) != (b_path is None):
        raise click.UsageError("--a and --b go together")
    if demo is not None:
        raise click.UsageError("give either --a/--b or --demo, not both")
    if m_rows is not None:
        raise click.UsageError("--M applies to --demo only (M is A's number of rows)")
    A = _load_operand(a_path, a_format, "a")
    B = _load_operand(b_path, b_format, "b")
    if b_transposed:
        if B.ndim != 2:
            raise click.ClickException(f"b: --b-transposed needs a 2-D (N, K) array, got shape {B.shape}")
        B = B.T
    return A, B, f"a={a_path} b={b_path}{' (transposed)' if b_transposed else ''}"


#: Options that --recorded fixes to the recorded call (an option given with it is refused).
_RECORDED_FIXES = {"m_rows": "--M", "seed": "--seed", "scale_a": "--scale-a", "scale_b": "--scale-b",
                   "out_dtype": "--out-dtype", "fast_accum": "--fast-accum/--no-fast-accum",
                   "a_format": "--a-format", "b_format": "--b-format"}


def demo_call(demo, m_rows, seed, recorded, a_format, b_format, fast_accum, out_dtype, scale_a, scale_b):
    """The :class:`~cpemu.cases.Case` of a demo run: the H200's recorded call with ``--recorded``;
    else the options' call (``scale`` "unit" for unit scales, "custom" for others)."""
    from click.core import ParameterSource

    from .demo import demo_case, recorded_case

    if recorded:
        ctx = click.get_current_context()
        given = [flag for name, flag in _RECORDED_FIXES.items()
                 if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
        if given:
            raise click.UsageError(f"--recorded runs the call as the H200 recorded it; drop {', '.join(given)}")
        return recorded_case(demo)
    if m_rows is not None and m_rows < 1:
        raise click.BadParameter("must be at least 1", param_hint="--M")
    kind = "unit" if scale_a == 1.0 and scale_b == 1.0 else "custom"
    return demo_case(demo, m_rows, seed, a_format, b_format, fast_accum, out_dtype, kind)


def check_before_inputs(prof: Profile, case: Case, backend: str) -> None:
    """Refuse a demo call before its inputs are drawn: the profile's call (shape, domain,
    features), the backend, and the memory its inputs and output need."""
    from .backends import select
    from .memory import check_output

    call = prof.call(case.M, case.N, case.K, case.a_format, case.b_format, case.out_dtype, "tensorwise",
                     case.fast_accum)
    select(backend, prof, call)
    check_output(case.M, case.N, case.out_dtype, (case.M + case.N) * case.K)


def demo_operands(case: Case, scale_a: float, scale_b: float, notes: list):
    """A (M, K) and B (K, N) of a demo call (gauss40 data), and its scales: the recorded call's own,
    else the options' as float32."""
    from dataclasses import replace

    from .progress import is_terminal

    codes = (case.M + case.N) * case.K
    if codes >= 1 << 26 and is_terminal(sys.stderr):  # a few seconds of drawing before the compute's progress
        click.echo(f"[cpemu gemm] drawing the demo's {codes / 1e6:.0f} M input codes", err=True)
    a, bt, sa, sb, _ = operands(replace(case, scale="unit") if case.scale == "custom" else case)
    A = a.view(FP8_FORMATS[case.a_format].np_dtype)
    B = bt.view(FP8_FORMATS[case.b_format].np_dtype).T  # (K, N) view of column-major B
    if case.scale != "tensor":
        sa, sb = scale(scale_a, "scale_a", notes), scale(scale_b, "scale_b", notes)
    return A, B, sa.reshape(()), sb.reshape(())


def gemm_call(prof: Profile, A: np.ndarray, B: np.ndarray, fast_accum: bool, out_dtype: str):
    """The profile's Call, or None where the operands do not make one (gemm explains why)."""
    if not (A.ndim == 2 and B.ndim == 2 and A.shape[1] == B.shape[0] and A.shape[0]):
        return None
    M, K = A.shape
    try:
        return prof.call(M, B.shape[1], K, _fmt_name(A), _fmt_name(B), out_dtype, "tensorwise", fast_accum)
    except (ValueError, KeyError):
        return None


def gemm_record(source, A, B, y, prof, used_backend, out_dtype, fast_accum, sa, sb, plan, elapsed, out_path,
                 notes) -> dict:
    """What ``cpemu gemm --json`` prints."""
    M, K = A.shape
    N = B.shape[1]
    return {"source": source, "M": M, "N": N, "K": K, "a_format": _fmt_name(A), "b_format": _fmt_name(B),
            "profile": prof.name, "backend": used_backend, "out_dtype": out_dtype, "fast_accum": fast_accum,
            "scale_a": float(sa), "scale_b": float(sb),
            "plan": None if plan is None else {"splits": plan.splits, "slices": [list(s) for s in plan.slices],
                                               "promotion": plan.promotion},
            "sha256": hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest(),
            # what a truth manifest records as output_sha256 (cpemu.cases.sha256_arrays of the bit patterns)
            "manifest_sha256": sha256_arrays(y.view(np.uint32 if y.dtype == np.float32 else np.uint16)),
            "seconds": elapsed, "mac_per_s": M * N * K / elapsed if elapsed > 0 else None,
            "out": out_path, "notes": notes}


def print_gemm(rec: dict, prof: Profile, plan, y: np.ndarray):
    echo = click.echo
    echo(f"input:    {rec['source']}")
    echo(f"shape:    M={rec['M']} N={rec['N']} K={rec['K']}  (a {rec['a_format']}, b {rec['b_format']})")
    echo(f"profile:  {prof.name} ({prof.data['device']}; {prof.data['verification']['status']})")
    echo(f"call:     out_dtype={rec['out_dtype']} fast_accum={rec['fast_accum']} scale_a={rec['scale_a']!r} "
         f"scale_b={rec['scale_b']!r} backend={rec['backend']}")
    if plan is not None:
        promo = ("fast accumulation (one chain per slice)" if plan.promotion is None else
                 f"promotion every {plan.promotion} steps ({plan.promotion * prof.instruction.L} K elements)")
        sl = ", ".join(f"[{k0},{k1})" for k0, k1 in plan.slices[:8]) + (" ..." if plan.splits > 8 else "")
        echo(f"plan:     {plan.splits} split-K slice(s) {sl}; {promo}")
    echo(f"output:   {y.dtype} {y.shape}")
    echo(f"sha256:   {rec['sha256']}  (raw output bytes, C order)")
    if rec.get("h200"):
        echo(f"h200:     {rec['h200']['text']}")
    echo(f"time:     {rec['seconds']:.3f} s, {rec['mac_per_s'] / 1e6:.1f} M MAC/s")
    for n in rec["notes"]:
        echo(f"note:     {n}")
    if rec["out"]:
        echo(f"saved:    {rec['out']}")


def _fmt_name(x: np.ndarray) -> str:
    return "e4m3" if x.dtype == np.dtype(ml_dtypes.float8_e4m3fn) else "e5m2"
