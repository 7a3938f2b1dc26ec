"""The numpy reference backend: the executable specification of cpemu's numerics.

Everything that decides an output bit is here, in integer arithmetic:

* :func:`tfdpa` -- one T-FDPA step of an :class:`~cpemu.instruction.InstructionModel`
  (MMA-Sim ``t_fdpa``; see :mod:`cpemu.instruction` for the published model);
* :func:`chain` -- a sequence of steps over K, the accumulator fed back as ``c``;
* :func:`accumulate` -- the GEMM schedule of a :class:`~cpemu.schedule.Plan`:
  split-K slices, each a chain from zero (or, without fast accumulation, chains
  of ``promotion`` steps added into an FP32 accumulator), and the FP32 reduction
  of the slice partials;
* :func:`epilogue` -- scales, bias and the output conversion.

Integer representation: an FP8 product is ``P * 2**(E - fa - fb)`` with
``P = m_a*m_b < 2**8`` and ``E = e_a + e_b``; truncating it to ``F`` fraction
bits below ``2**e_max`` is the shift ``P >> (e_max - E + fa + fb - F)`` (a left
shift when negative), exact in int32; the sum of the ``L + 1`` truncated terms
is exact in int64 (|sum| < 2**35). No floating-point operation takes part in a
step except exact scalings by powers of two.

Memory: outputs are processed in blocks of at most ``BLOCK_ELEMS`` (output,
product) pairs, and each block decodes its operands a K range at a time
(:class:`Codes`, at most ``K_CHUNK_BYTES`` of decoded operands). A range ends only
where a step of the chain ends, so blocking never changes a bit. The working set is a
few MiB per worker thread (``CPEMU_THREADS``, default the usable CPUs) beyond the codes
and the output, whatever K is (:func:`working_set_bytes`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from .formats import FP8Format
from .instruction import InstructionModel

__all__ = ["Operand", "Codes", "decode", "tfdpa", "chain", "accumulate", "epilogue", "gemm_codes", "BLOCK_ELEMS",
           "K_CHUNK_BYTES", "working_set_bytes", "Arithmetic", "SPEC"]

#: Upper bound on block_M * block_N * L elements held by one step's temporaries
#: (each temporary is int32 or int64: 2**17 elements -> 0.5-1 MiB, cache-sized).
BLOCK_ELEMS = 1 << 17
#: Output columns per block.
BLOCK_COLS = 256
#: Upper bound on the decoded operand bytes of one block's K range (see :class:`Codes`).
K_CHUNK_BYTES = 1 << 22
#: Bytes of one decoded operand element: sign int8, significand int32, exponent int16, NaN and Inf flags.
DECODED_BYTES = 9
#: Environment variable: worker threads of the reference GEMM (default: the usable CPUs).
THREADS_ENV = "CPEMU_THREADS"

#: Exponent given to zero operands: any product with a zero factor then lies far below
#: every e_zero of the models (-133) and below any nonzero product (>= -28 - 28).
ZERO_EXP = -1000


class Operand:
    """Decoded FP8 operand, K along the last axis: sign, integer significand, exponent."""

    __slots__ = ("sign", "m", "e_nz", "nan", "inf", "frac_bits", "has_special")

    def __init__(self, codes: np.ndarray, fmt: FP8Format):
        sign, m, e, is_nan, is_inf = fmt.tables()
        idx = np.asarray(codes, dtype=np.uint8)
        self.sign = sign[idx]
        self.m = m[idx]
        self.nan = is_nan[idx]
        self.inf = is_inf[idx]
        self.e_nz = np.where(self.m == 0, ZERO_EXP, e[idx]).astype(np.int16)  # exponent, ZERO_EXP for zeros
        self.frac_bits = fmt.frac_bits
        self.has_special = bool(self.nan.any() or self.inf.any())

    def rows(self, sl) -> "Operand":
        out = Operand.__new__(Operand)
        out.sign, out.m, out.e_nz = self.sign[sl], self.m[sl], self.e_nz[sl]
        out.nan, out.inf = self.nan[sl], self.inf[sl]
        out.frac_bits, out.has_special = self.frac_bits, self.has_special
        return out

    @property
    def n(self) -> int:
        return self.m.shape[0]

    def cols(self, k0: int, k1: int) -> "Operand":
        """K elements [k0, k1) (a view)."""
        return self.rows((slice(None), slice(k0, k1)))


class Codes:
    """FP8 codes of an operand, K along the last axis, decoded a K range at a time.

    The same interface as :class:`Operand` for :func:`chain` and :func:`accumulate`
    (``rows``, ``cols``, ``n``): ``cols(k0, k1)`` decodes only that range, so a block holds
    decoded operands of one range at once instead of the whole K (any strides are read)."""

    __slots__ = ("codes", "fmt")

    def __init__(self, codes: np.ndarray, fmt: FP8Format):
        self.codes, self.fmt = codes, fmt

    @property
    def n(self) -> int:
        return self.codes.shape[0]

    def rows(self, sl) -> "Codes":
        return Codes(self.codes[sl], self.fmt)

    def cols(self, k0: int, k1: int) -> Operand:
        return Operand(self.codes[:, k0:k1], self.fmt)


def decode(codes: np.ndarray, fmt: FP8Format) -> Operand:
    return Operand(codes, fmt)


def _split_fp32(c: np.ndarray, e_zero: int):
    """FP32 values -> (sign, 24-bit integer significand, exponent), value = sign*m*2**(e-23).

    Subnormals keep e = -126 (MMA-Sim ``frexp_and_normalize``); zero takes ``e_zero``.
    """
    c64 = c.astype(np.float64)
    c64 = np.where(np.isfinite(c64), c64, 0.0)  # NaN/Inf accumulators are handled by _specials
    mant, ex = np.frexp(np.abs(c64))  # |c| = mant * 2**ex, 0.5 <= mant < 1
    e = (ex - 1).astype(np.int32)
    sub = e < -126
    e = np.where(sub, -126, e)
    m = np.ldexp(np.abs(c64), 23 - e).astype(np.int64)  # exact: fits 24 bits
    zero = m == 0
    e = np.where(zero, e_zero, e)
    sign = np.where(c64 < 0, -1, 1).astype(np.int64)
    return sign, m, e


def _round_sum(S: np.ndarray, scale_exp: np.ndarray, frac_bits: int) -> np.ndarray:
    """Round the exact sum ``S * 2**scale_exp`` toward zero to ``frac_bits`` fraction
    bits, with exponents floored at -126 (MMA-Sim ``ldexp_and_normalize``, RZ)."""
    absS = np.abs(S)
    _, bl = np.frexp(absS.astype(np.float64))  # bit length of |S| (exact below 2**53)
    e_res = np.maximum(scale_exp + bl.astype(np.int32) - 1, -126)
    drop = np.clip(e_res - frac_bits - scale_exp, 0, 62)
    absS = (absS >> drop) << drop
    val = np.ldexp(np.where(S < 0, -absS, absS).astype(np.float64), scale_exp)
    return val.astype(np.float32) + np.float32(0.0)  # -0 -> +0


def tfdpa(c: np.ndarray, a: Operand, b: Operand, model: InstructionModel) -> np.ndarray:
    """One T-FDPA step for every output of a block.

    ``c``: (Mb, Nb) float32 accumulators; ``a``: (Mb, Lk) operand; ``b``: (Nb, Lk)
    operand (K last), ``Lk <= model.L``. Missing products of a short step are zero
    products, which never change e_max or the sum. Returns (Mb, Nb) float32.

    A product ``P * 2**(E - fa - fb)`` truncated to F fraction bits below ``2**e_max`` is
    ``trunc(P * 2**(E - e_max + F - fa - fb))``; with ``S0 = F - fa - fb >= 0`` this is
    ``(P << S0) >> (e_max - E)``, exact in int32 (``P << S0 < 2**27``). Zero operands carry
    the exponent ``ZERO_EXP``, so a zero product never sets e_max; when every product and
    c are zero, e_max = e_zero (from c) as in the model, and the sum is 0 either way.
    """
    F = model.F
    S0 = F - a.frac_bits - b.frac_bits
    assert S0 >= 0
    P = (a.m[:, None, :] << S0) * b.m[None, :, :]
    E = a.e_nz[:, None, :].astype(np.int32) + b.e_nz[None, :, :]
    cs, cm, ce = _split_fp32(c, model.e_zero)
    e_max = np.maximum(E.max(axis=-1), ce)
    E -= e_max[..., None]  # -(e_max - E) <= 0
    np.maximum(E, -31, out=E)
    T = P >> -E
    T *= a.sign[:, None, :] * b.sign[None, :, :]
    S = T.sum(axis=-1, dtype=np.int64)
    rc = e_max - ce + (23 - F)  # the accumulator's 24-bit significand, truncated likewise
    S += cs * np.where(rc >= 0, cm >> np.clip(rc, 0, 62), cm << np.clip(-rc, 0, 62))
    out = _round_sum(S, e_max - F, model.result_fraction_bits)
    if a.has_special or b.has_special or not np.isfinite(c).all():
        out = _specials(out, c, a, b)
    return out


def _specials(out, c, a: Operand, b: Operand):
    """IEEE semantics for NaN/Inf terms (MMA-Sim sums them in float64): any NaN,
    inf*0, or infinities of both signs give NaN (0x7FFFFFFF); else +-inf."""
    a_zero = (a.m == 0) & ~a.nan & ~a.inf
    b_zero = (b.m == 0) & ~b.nan & ~b.inf
    nan = (a.nan[:, None, :] | b.nan[None, :, :]
           | (a.inf[:, None, :] & b_zero[None, :, :]) | (a_zero[:, None, :] & b.inf[None, :, :])).any(-1)
    inf_p = a.inf[:, None, :] | b.inf[None, :, :]
    psign = a.sign[:, None, :] * b.sign[None, :, :]
    pos = (inf_p & (psign > 0)).any(-1) | (c == np.inf)
    neg = (inf_p & (psign < 0)).any(-1) | (c == -np.inf)
    nan |= np.isnan(c) | (pos & neg)
    out = np.where(pos, np.float32(np.inf), out)
    out = np.where(neg, np.float32(-np.inf), out)
    out = np.where(nan, np.uint32(0x7FFFFFFF).view(np.float32), out)
    return out.astype(np.float32)


def k_range(rows: int, L: int) -> int:
    """K elements decoded at once for a block of ``rows`` operand rows (A's and B's together):
    a multiple of ``L`` holding at most ``K_CHUNK_BYTES`` decoded bytes (at least one step)."""
    return max(1, K_CHUNK_BYTES // (DECODED_BYTES * max(1, rows) * L)) * L


def chain(a: Operand | Codes, b: Operand | Codes, k0: int, k1: int, model: InstructionModel,
          c: np.ndarray | None = None, tick=None, step=tfdpa) -> np.ndarray:
    """Steps over K elements [k0, k1) in ascending order, L at a time, from ``c`` (default 0).
    ``step``: the step function (:func:`tfdpa`, or another with its arguments and its bits).

    The operands are read a K range at a time (:func:`k_range`), each range a whole number
    of steps from ``k0``: the accumulator carries over between ranges as between steps, so
    the bits do not depend on the range length. ``tick(products)``, if given, is called
    after each range with the number of products it computed."""
    if c is None:
        c = np.zeros((a.n, b.n), dtype=np.float32)
    L = model.L
    span = k_range(a.n + b.n, L)
    for r0 in range(k0, k1, span):
        r1 = min(r0 + span, k1)
        ar, br = a.cols(r0, r1), b.cols(r0, r1)
        for k in range(0, r1 - r0, L):
            ke = min(k + L, r1 - r0)
            c = step(c, ar.cols(k, ke), br.cols(k, ke), model)
        if tick is not None:
            tick(a.n * b.n * (r1 - r0))
    return c


def accumulate(a: Operand | Codes, b: Operand | Codes, plan, model: InstructionModel, tick=None,
               step=tfdpa) -> np.ndarray:
    """The FP32 accumulator of the GEMM as ``plan`` (a :class:`cpemu.schedule.Plan`) schedules it.

    Each slice [k0, k1) is accumulated from zero: with ``plan.promotion`` None as one
    chain (fast accumulation), otherwise as chains of ``plan.promotion`` steps, each
    from zero, added in order into an FP32 accumulator with round-to-nearest
    (CUTLASS ``GmmaFP8Accumulation``, ``mma_promotion_interval``). The slice partials
    are then added in slice order in FP32 round-to-nearest (split-K reduction).
    """
    partial = None
    for k0, k1 in plan.slices:
        if plan.promotion is None:
            p = chain(a, b, k0, k1, model, tick=tick, step=step)
        else:
            span = plan.promotion * model.L
            p = None
            for s in range(k0, k1, span):
                part = chain(a, b, s, min(s + span, k1), model, tick=tick, step=step)
                with np.errstate(invalid="ignore", over="ignore"):  # inf - inf -> NaN, as on the GPU
                    p = part if p is None else (p + part)  # float32 + float32: IEEE RN
        with np.errstate(invalid="ignore", over="ignore"):
            partial = p if partial is None else (partial + p)
    return partial


def blocks(M: int, N: int, L: int, block_elems: int = BLOCK_ELEMS):
    """(row slice, column slice) output blocks of at most ``block_elems // L`` outputs."""
    rows = min(M, max(1, block_elems // (BLOCK_COLS * L)))
    cols = min(N, max(1, block_elems // (rows * L)))
    for i in range(0, M, rows):
        for j in range(0, N, cols):
            yield slice(i, min(i + rows, M)), slice(j, min(j + cols, N))


def epilogue(acc: np.ndarray, scale_a, scale_b, bias, ep: dict) -> np.ndarray:
    """Apply scales and bias to the FP32 accumulator, in FP32 round-to-nearest.

    ``scale_a`` is a float32 scalar or (Mb, 1) column, ``scale_b`` a float32 scalar
    or (1, Nb) row, ``bias`` None or a float32 (Nb,) row (bf16 values widened
    exactly). ``ep`` is the profile's epilogue description: ``order`` is one of
    ``"acc*(sa*sb)"``, ``"(acc*sa)*sb"``, ``"(acc*sb)*sa"``; bias is added after
    the scaling with one FP32 round-to-nearest add.
    """
    acc = acc.astype(np.float32, copy=False)
    sa = np.float32(scale_a) if np.ndim(scale_a) == 0 else scale_a.astype(np.float32)
    sb = np.float32(scale_b) if np.ndim(scale_b) == 0 else scale_b.astype(np.float32)
    order = ep["order"]
    with np.errstate(over="ignore", invalid="ignore"):
        if order == "acc*(sa*sb)":
            y = acc * (sa * sb)
        elif order == "(acc*sa)*sb":
            y = (acc * sa) * sb
        elif order == "(acc*sb)*sa":
            y = (acc * sb) * sa
        else:
            raise ValueError(f"unknown epilogue order {order!r}")
        if bias is not None:
            y = y + bias.astype(np.float32)
    return y.astype(np.float32, copy=False)


def threads_default() -> int:
    """Worker threads of :func:`gemm_codes`: ``CPEMU_THREADS`` if set, else the CPUs this
    process may run on (at most 32)."""
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"{THREADS_ENV}: must be a positive integer (got {env!r})")
        return int(env)
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 32))


@dataclass(frozen=True)
class Arithmetic:
    """How :func:`gemm_codes` computes its steps: ``step`` (:func:`tfdpa`'s arguments and bits),
    the (output, product) pairs of one block (:func:`blocks`), and an upper bound on the bytes
    of the step's temporaries per pair (:func:`working_set_bytes`)."""

    step: Callable
    block_elems: int
    temp_bytes_per_elem: int


#: the specification's arithmetic: P, E, T (int32), S (int64), signs and the specials' masks
SPEC = Arithmetic(tfdpa, BLOCK_ELEMS, 48)


def working_set_bytes(M: int, N: int, L: int, threads: int, arith: Arithmetic = SPEC) -> int:
    """An upper bound on the bytes :func:`gemm_codes` holds beyond its codes and its output:
    per worker thread, one block's step temporaries (a few arrays of at most
    ``arith.block_elems`` elements), its decoded K range and its accumulator. It does not grow
    with K, and with M and N only up to the block size."""
    rows, cols = next(blocks(M, N, L, arith.block_elems), (slice(0, 0), slice(0, 0)))
    nr, nc = rows.stop - rows.start, cols.stop - cols.start
    step = arith.temp_bytes_per_elem * arith.block_elems
    decoded = DECODED_BYTES * (nr + nc) * k_range(nr + nc, L)
    return threads * (step + decoded + 16 * nr * nc)


def gemm_codes(a_codes, bt_codes, a_fmt, b_fmt, plan, model: InstructionModel, ep: dict, scale_a, scale_b, bias,
               out_dtype: str, nan_bits: int | None = None, threads: int | None = None,
               progress=None, arith: Arithmetic = SPEC) -> np.ndarray:
    """The whole GEMM on FP8 codes: ``a_codes`` (M, K) and ``bt_codes`` (N, K) uint8, block by
    block (:func:`blocks`): accumulate as ``plan`` schedules, then the epilogue ``ep``, then the
    output conversion. ``scale_a``: () or (M, 1); ``scale_b``: () or (1, N); ``bias``: None or
    (N,) float32. Returns a C-contiguous (M, N) array of ``out_dtype``.

    Blocks are independent and write disjoint parts of the output, so ``threads`` workers
    (default :func:`threads_default`; numpy releases the GIL inside its loops) compute them
    in any order with the same bits. Each block reads its operands a K range at a time
    (:class:`Codes`), so memory beyond the codes and the output stays within
    :func:`working_set_bytes`. An output larger than the memory available is refused before
    it is allocated (:func:`cpemu.memory.check_output`). ``progress``: None or an object with
    ``add(products)`` (:class:`cpemu.progress.Progress`), told of each K range computed.
    ``arith``: how the steps are computed (:data:`SPEC`; a backend may pass another
    :class:`Arithmetic` whose step has the same bits)."""
    from .formats import OUT_DTYPES, encode_output
    from .memory import check_output

    M, N = a_codes.shape[0], bt_codes.shape[0]
    n = max(1, threads_default() if threads is None else int(threads))
    check_output(M, N, out_dtype, working_set_bytes(M, N, model.L, n, arith))
    a_ops, b_ops = Codes(a_codes, a_fmt), Codes(bt_codes, b_fmt)
    out = np.empty((M, N), dtype=OUT_DTYPES[out_dtype])
    tick = None if progress is None else progress.add

    def block(rc):
        rb, cb = rc
        acc = accumulate(a_ops.rows(rb), b_ops.rows(cb), plan, model, tick, arith.step)
        y = epilogue(acc, scale_a if np.ndim(scale_a) == 0 else scale_a[rb],
                     scale_b if np.ndim(scale_b) == 0 else scale_b[:, cb], None if bias is None else bias[cb], ep)
        out[rb, cb] = encode_output(y, out_dtype, nan_bits)

    # blocks of arith.block_elems, smaller where that leaves fewer than 4 per worker (never below BLOCK_ELEMS)
    be = max(BLOCK_ELEMS, min(arith.block_elems, M * N * model.L // (4 * n)))
    todo = blocks(M, N, model.L, be)
    if n <= 1 or M * N <= 1:
        for rc in todo:
            block(rc)
    else:
        _run_bounded(block, todo, n)
    return out


def _run_bounded(fn, items, n: int) -> None:
    """``fn`` on every item in ``n`` worker threads, at most ``2 n`` items in flight (a lazy
    iterator of millions of blocks is never held whole); re-raises the first exception."""
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="cpemu-ref") as pool:
        pending = set()
        for item in items:
            if len(pending) >= 2 * n:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    f.result()
            pending.add(pool.submit(fn, item))
        for f in pending:
            f.result()
