"""Memory checks made before a call allocates: its output must fit in the memory available.

The reference's working set beyond its operands and output is bounded by construction
(:func:`cpemu.reference.working_set_bytes`, a few MiB per worker thread), so the output is
what can outgrow the machine (with host copies of strided operands, which the caller counts).
"Available" is the least of what the machine, the process's memory control group and its
address-space limit (``ulimit -v``) leave, so a container's or a job's own limit counts.
:func:`check_output` refuses such a call before anything is allocated, naming the size it
would need, when it would take more than :data:`USABLE_SHARE` of the memory available.
"""

from __future__ import annotations

import os

__all__ = ["OutputTooLarge", "available_bytes", "machine_bytes", "cgroup_bytes", "address_space_bytes",
           "check_output", "check_bytes", "gib", "USABLE_SHARE"]

#: the share of the available memory a call may take (the rest stays for the machine's other work)
USABLE_SHARE = 0.8


class OutputTooLarge(ValueError):
    """The call's output (plus the working set), or what a builder would allocate, needs more memory
    than this machine has available."""


def gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def available_bytes() -> int | None:
    """Memory available to a new allocation: the least of what the machine, the process's control
    group and its address-space limit leave (:func:`machine_bytes`, :func:`cgroup_bytes`,
    :func:`address_space_bytes`); None when none of them is known (nothing is refused)."""
    known = [x for x in (machine_bytes(), cgroup_bytes(), address_space_bytes()) if x is not None]
    return min(known) if known else None


def machine_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo, else the free physical pages, else None."""
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


#: a control-group limit at or above this is no limit (the kernel writes 2^63 rounded to a page)
_NO_LIMIT = 1 << 60


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _reclaimable(stat_path: str, key: str) -> int:
    """The page cache the kernel can drop before it refuses (``key`` of a memory.stat file), or 0."""
    try:
        with open(stat_path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


#: where a memory control group states its limit, use and reclaimable cache: v2, then v1
CGROUP_FILES = (("/sys/fs/cgroup", "memory.max", "memory.current", "memory.stat", "inactive_file"),
                ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat",
                 "total_inactive_file"))


def cgroup_bytes() -> int | None:
    """What the process's memory control group leaves: its limit less its use (less the page cache it can
    reclaim), cgroup v2 (memory.max) or v1 (memory.limit_in_bytes); None without a limit."""
    for base, limit, usage, stat, cache in CGROUP_FILES:
        lim = _read_int(os.path.join(base, limit))
        if lim is None or lim >= _NO_LIMIT:
            continue
        used = _read_int(os.path.join(base, usage)) or 0
        used -= min(used, _reclaimable(os.path.join(base, stat), cache))
        return max(0, lim - used)
    return None


def address_space_bytes() -> int | None:
    """What the soft address-space limit (``RLIMIT_AS``, ``ulimit -v``) leaves beyond the process's
    virtual size (``VmSize`` of /proc/self/status); None without a limit."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    size = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    size = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return max(0, soft - size)


def check_output(M: int, N: int, out_dtype: str, working_bytes: int = 0) -> None:
    """Raise :class:`OutputTooLarge` when an (M, N) ``out_dtype`` output and ``working_bytes``
    do not fit in :func:`available_bytes`."""
    from .formats import OUT_DTYPES

    out = M * N * OUT_DTYPES[out_dtype].itemsize
    have = _refused(out + working_bytes)
    if have is not None:
        raise OutputTooLarge(
            f"out: the ({M}, {N}) {out_dtype} output needs {gib(out)} (plus {gib(working_bytes)} of working "
            f"memory and operand copies) and this process has {gib(have)} available, of which cpemu uses at most "
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
