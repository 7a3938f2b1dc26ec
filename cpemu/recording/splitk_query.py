"""One cuBLASLt heuristic answer per call, as a small integer tuple, in worker processes.

Wraps :func:`cpemu.recording.cublaslt_heuristic.query_case` (descriptors set exactly as
torch 2.11 sets them) for the split-K recorders: :mod:`.splitk_measure` and
:mod:`.splitk_enum`. An answer is ``FIELDS`` (the algorithm configuration and the
workspace it needs) or ``None`` where the heuristic returns no algorithm (torch raises).
"""

from __future__ import annotations

import os
import tempfile

from . import cublaslt_heuristic as ch

FIELDS = ("algo_id", "tile_id", "stages_id", "cluster_shape_id", "splitk_num", "reduction_scheme",
          "cta_swizzling", "custom_option", "inner_shape_id", "workspace_size")
CONFIG_FIELDS = FIELDS[:-1]  # what identifies a kernel configuration
SPLITK = FIELDS.index("splitk_num")
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"  # split counts as one character (base 36)

__all__ = ["FIELDS", "CONFIG_FIELDS", "SPLITK", "DIGITS", "Querier", "probe_workspace", "runtime_info"]


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
