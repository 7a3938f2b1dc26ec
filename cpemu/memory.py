"""Memory checks made before a call allocates: its output must fit in the memory available.

The reference's working set beyond its operands and output is bounded by construction
(:func:`cpemu.reference.working_set_bytes`, a few MiB per worker thread), so the output is
what can outgrow the machine (with host copies of strided operands, which the caller counts).
:func:`check_output` refuses such a call before anything is allocated, naming the size it
would need, when it would take more than :data:`USABLE_SHARE` of the memory available.
"""

from __future__ import annotations

import os

__all__ = ["OutputTooLarge", "available_bytes", "check_output", "check_bytes", "gib", "USABLE_SHARE"]

#: the share of the available memory a call may take (the rest stays for the machine's other work)
USABLE_SHARE = 0.8


class OutputTooLarge(ValueError):
    """The call's output (plus the working set), or what a builder would allocate, needs more memory
    than this machine has available."""


def gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def available_bytes() -> int | None:
    """Memory available to a new allocation: ``MemAvailable`` of /proc/meminfo, else the free
    physical pages, else None (unknown: nothing is refused)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_output(M: int, N: int, out_dtype: str, working_bytes: int = 0) -> None:
    """Raise :class:`OutputTooLarge` when an (M, N) ``out_dtype`` output and ``working_bytes``
    do not fit in :func:`available_bytes`."""
    from .formats import OUT_DTYPES

    out = M * N * OUT_DTYPES[out_dtype].itemsize
    have = _refused(out + working_bytes)
    if have is not None:
        raise OutputTooLarge(
            f"out: the ({M}, {N}) {out_dtype} output needs {gib(out)} (plus {gib(working_bytes)} of working "
            f"memory and operand copies) and this machine has {gib(have)} available, of which cpemu uses at most "
            f"{USABLE_SHARE:.0%}; cpemu refuses before allocating it")


def check_bytes(what: str, need: int, have: int | None = None, where: str = "this machine") -> None:
    """Raise :class:`OutputTooLarge` when ``need`` bytes (``what`` needs them) do not fit in ``have``
    (default: :func:`available_bytes`), of which cpemu uses at most :data:`USABLE_SHARE`."""
    have = _refused(need, have)
    if have is not None:
        raise OutputTooLarge(f"{what} needs {gib(need)}, and {gib(have)} are available on {where}, of which cpemu uses "
                             f"at most {USABLE_SHARE:.0%}; cpemu refuses before allocating it")


def _refused(need: int, have: int | None = None) -> int | None:
    """The memory available (``have``, default :func:`available_bytes`) when ``need`` bytes do not fit
    in cpemu's share of it; None when they fit or nothing is known."""
    have = available_bytes() if have is None else have
    return have if have is not None and need > have * USABLE_SHARE else None
