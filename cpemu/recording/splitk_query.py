"""One cuBLASLt heuristic answer per call, as a small integer tuple, in worker processes.

Wraps :func:`cpemu.recording.cublaslt_heuristic.query_case` (descriptors set exactly as
torch 2.11 sets them) for the split-K recorders: :mod:`.splitk_measure` and
:mod:`.splitk_enum`. An answer is ``FIELDS`` (the algorithm configuration and the
workspace it needs) or ``None`` where the heuristic returns no algorithm (torch raises).

:class:`LeanQuerier` asks the same question with less host work per answer: the matmul
descriptor, the C and D layouts and the preference are kept while M, N and the combination stay
(only the A and B layouts, which hold K, are made anew, from the same :func:`torch_lt_plan`),
and an answer's configuration is read from the returned algorithm once per distinct algorithm.
It checks itself against :meth:`Querier.ask` on its first :data:`LEAN_SELF_CHECK` answers and on
every :data:`LEAN_CHECK_EVERY`-th after, and raises on any difference.
"""

from __future__ import annotations

import ctypes
import os
import tempfile

from ..cuda.cublaslt import CONFIG_DESCRIPTION, HeuristicResult, LtError, torch_lt_plan
from . import cublaslt_heuristic as ch

FIELDS = ("algo_id", "tile_id", "stages_id", "cluster_shape_id", "splitk_num", "reduction_scheme",
          "cta_swizzling", "custom_option", "inner_shape_id", "workspace_size")
CONFIG_FIELDS = FIELDS[:-1]  # what identifies a kernel configuration
SPLITK = FIELDS.index("splitk_num")
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"  # split counts as one character (base 36)

__all__ = ["FIELDS", "CONFIG_FIELDS", "SPLITK", "DIGITS", "Querier", "LeanQuerier", "probe_workspace", "runtime_info"]

#: LeanQuerier compares itself with Querier.ask on this many first answers ...
LEAN_SELF_CHECK = 256
#: ... and on every this many-th answer after them
LEAN_CHECK_EVERY = 1024


def probe_workspace() -> tuple[int, str]:
    """torch's cuBLASLt workspace on this machine (probed from torch's own heuristic call)."""
    rt = ch.Runtime()
    with tempfile.TemporaryDirectory() as wd:
        ws, source, _ = ch.resolve_workspace("auto", rt.info, wd, None, 300.0)
    rt.close()
    return ws, source


def runtime_info(rt) -> dict:
    return {k: rt.info.get(k) for k in ("cublaslt_version", "library_path", "torch_version", "device_name",
                                        "sm_count", "compute_capability")}


class Querier:
    """A runtime, a handle and device pointers, opened once per process."""

    def __init__(self, workspace_bytes: int, max_m: int = 1 << 17, max_n: int = 1 << 17):
        self.rt = ch.Runtime()
        self.rt.open_handle()
        self.ptrs = self.rt.pointers(max_m, max_n)
        self.ws = int(workspace_bytes)

    def ask(self, M: int, N: int, K: int, combo: dict) -> tuple | None:
        row = ch.query_case(self.rt.lt, self.rt.handle, ch.Case(M, N, K, **combo), self.ptrs, self.ws, 1)
        if row["status"] != "OK":
            return None
        return tuple(int(row[f]) for f in FIELDS)

    def info(self) -> dict:
        return dict(runtime_info(self.rt), pid=os.getpid(), workspace_bytes=self.ws)


class LeanQuerier(Querier):
    """:class:`Querier` with the host work per answer cut (module docstring); the same answers."""

    def __init__(self, workspace_bytes: int, **kw):
        super().__init__(workspace_bytes, **kw)
        assert CONFIG_DESCRIPTION["heuristic"].endswith("result[0].algo")  # one algorithm asked, as torch
        self._key, self._made = None, None
        self._configs = {}  # algorithm bytes -> configuration fields
        self.asked = 0
        self.compared = 0

    def _column(self, M, N, combo):
        key = (M, N, tuple(sorted(combo.items())))
        if key != self._key:
            self.close()
            self._made = ch.build_descs(self.rt.lt, ch.Case(M, N, 16 * 2, **combo), self.ptrs, self.ws)
            self._key = key
        return self._made

    def _lean(self, M, N, K, combo):
        lt = self.rt.lt
        made = self._column(M, N, combo)
        plan = torch_lt_plan(ch.Case(M, N, K, **combo))
        for name in ("A", "B"):
            lt.layout_destroy(made[name])
            made[name] = None
            made[name] = lt.new_layout(plan[name], f"MatrixLayoutCreate {name}")
        result = HeuristicResult()
        count = ctypes.c_int(0)
        st = lt.get_heuristic(self.rt.handle, made["desc"], made["A"], made["B"], made["C"], made["D"],
                              made["pref"], 1, ctypes.byref(result), ctypes.byref(count))
        if st != 0 or count.value <= 0 or result.state != 0:
            return None  # the row Querier.ask reads as not OK
        algo = bytes(result.algo.data)
        cfg = self._configs.get(algo)
        if cfg is None:
            fields = lt.read_algo(result.algo)
            cfg = self._configs[algo] = tuple(int(fields[f]) for f in CONFIG_FIELDS)
        return cfg + (int(result.workspaceSize),)

    def ask(self, M: int, N: int, K: int, combo: dict) -> tuple | None:
        try:
            got = self._lean(M, N, K, combo)
        except LtError:
            self.close()
            got = None
        self.asked += 1
        if self.asked <= LEAN_SELF_CHECK or self.asked % LEAN_CHECK_EVERY == 0:
            want = super().ask(M, N, K, combo)
            self.compared += 1
            if got != want:
                raise RuntimeError(f"LeanQuerier answered {got} for (M={M}, N={N}, K={K}, {combo}), "
                                   f"Querier {want}: the lean path is not the same question")
        return got

    def close(self):
        if self._made is not None:
            ch.destroy_descs(self.rt.lt, self._made)
        self._key, self._made = None, None
