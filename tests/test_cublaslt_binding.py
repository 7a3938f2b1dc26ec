"""The runtime's cuBLASLt binding (cpemu.cuda.cublaslt), checked without a GPU.

* the descriptors: a stand-in library records every call of ``build_descs``; the calls,
  their order and their values are those of torch 2.11's ``at::cuda::blas::scaled_gemm``
  (written out here by hand from tools/CUBLASLT_HEURISTIC.md);
* the entry points: each symbol is bound with the C signature of cublasLt.h, including
  the matmul and algorithm calls of the tensor-core backend, which ``tensorcore._lt()``
  gets from the binding;
* the library search: its order and its message when nothing loads;
* the layering: no module of the runtime imports cpemu.recording, no import circle runs
  through the cuBLASLt modules, and the recording tool still exports every name it had.
"""

from __future__ import annotations

import ast
import ctypes
import ctypes.util
import json
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cpemu.cuda import cublaslt
from cpemu.cuda import tensorcore as tc

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- descriptors
class _RecordingLt(cublaslt.CublasLt):
    """The binding's own methods over a stand-in library that records every call."""

    def __init__(self, fail_at: str | None = None):  # no library is loaded
        self.calls, self.fail_at, self._next = [], fail_at, 0x100

    def _handle(self, ref):
        self._next += 0x100
        ref._obj.value = self._next
        return self._next

    def desc_create(self, ref, compute, scale):
        self.calls.append(("desc_create", compute, scale, self._handle(ref)))
        return 0

    def desc_set(self, desc, attr, ref, size):
        self.calls.append(("desc_set", attr, type(ref._obj).__name__, size, ref._obj.value))
        return 0

    def layout_create(self, ref, dtype, rows, cols, ld):
        if self.fail_at == "layout" and len([c for c in self.calls if c[0] == "layout_create"]) == 2:
            return 7  # INVALID_VALUE on the third layout (C)
        self.calls.append(("layout_create", dtype, rows, cols, ld, self._handle(ref)))
        return 0

    def pref_create(self, ref):
        self.calls.append(("pref_create", self._handle(ref)))
        return 0

    def pref_set(self, pref, attr, ref, size):
        self.calls.append(("pref_set", attr, type(ref._obj).__name__, size, ref._obj.value))
        return 0

    def layout_destroy(self, h):
        self.calls.append(("layout_destroy", h.value))

    def pref_destroy(self, h):
        self.calls.append(("pref_destroy", h.value))

    def desc_destroy(self, h):
        self.calls.append(("desc_destroy", h.value))


PTRS = {"scale_a": 0x7F0000001000, "scale_b": 0x7F0000002000, "bias": 0x7F0000003000}


def test_descriptors_rowwise_bias():
    """a e4m3 (16 x 1920), b e5m2 (1920 x 5760), bf16 out, fast accumulation, bias, rowwise scales."""
    lt = _RecordingLt()
    c = cublaslt.Case(16, 5760, 1920, "e4m3", "e5m2", "bfloat16", True, True, "rowwise")
    made = cublaslt.build_descs(lt, c, PTRS, 1 << 20)
    assert lt.calls == [
        ("desc_create", 68, 0, 0x200),  # CUBLAS_COMPUTE_32F, CUDA_R_32F
        ("desc_set", 3, "c_int", 4, 1),  # TRANSA = OP_T
        ("desc_set", 4, "c_int", 4, 0),  # TRANSB = OP_N
        ("desc_set", 17, "c_void_p", 8, 0x7F0000001000),  # A_SCALE_POINTER
        ("desc_set", 18, "c_void_p", 8, 0x7F0000002000),  # B_SCALE_POINTER
        ("desc_set", 25, "c_byte", 1, 1),  # FAST_ACCUM
        ("layout_create", 29, 1920, 5760, 1920, 0x300),  # A = torch b: e5m2, rows K, cols N, ld K
        ("layout_create", 28, 1920, 16, 1920, 0x400),  # B = torch a: e4m3, rows K, cols M, ld K
        ("layout_create", 14, 5760, 16, 5760, 0x500),  # C: the bias dtype (bf16), N x M
        ("layout_create", 14, 5760, 16, 5760, 0x600),  # D: bf16, N x M
        ("desc_set", 8, "c_void_p", 8, 0x7F0000003000),  # BIAS_POINTER
        ("desc_set", 7, "c_uint", 4, 4),  # EPILOGUE = BIAS
        ("desc_set", 26, "c_int", 4, 14),  # BIAS_DATA_TYPE = CUDA_R_16BF
        ("desc_set", 31, "c_int", 4, 3),  # A_SCALE_MODE = OUTER_VEC_32F
        ("desc_set", 32, "c_int", 4, 3),  # B_SCALE_MODE = OUTER_VEC_32F
        ("pref_create", 0x700),
        ("pref_set", 1, "c_ulong", 8, 1 << 20),  # MAX_WORKSPACE_BYTES
    ]
    assert {k: v.value for k, v in made.items()} == {"desc": 0x200, "A": 0x300, "B": 0x400, "C": 0x500,
                                                     "D": 0x600, "pref": 0x700}
    lt.calls.clear()
    cublaslt.destroy_descs(lt, made)
    assert lt.calls == [("layout_destroy", 0x300), ("layout_destroy", 0x400), ("layout_destroy", 0x500),
                        ("layout_destroy", 0x600), ("pref_destroy", 0x700), ("desc_destroy", 0x200)]


def test_descriptors_tensorwise_fp32():
    """M = 1, fp32 out, no bias, no fast accumulation, tensorwise scales: no bias attributes, scalar scales."""
    lt = _RecordingLt()
    c = cublaslt.Case(1, 16, 32, "e4m3", "e4m3", "float32", False, False, "tensorwise")
    cublaslt.build_descs(lt, c, PTRS, 33554432)
    assert lt.calls == [
        ("desc_create", 68, 0, 0x200),
        ("desc_set", 3, "c_int", 4, 1),
        ("desc_set", 4, "c_int", 4, 0),
        ("desc_set", 17, "c_void_p", 8, 0x7F0000001000),
        ("desc_set", 18, "c_void_p", 8, 0x7F0000002000),
        ("desc_set", 25, "c_byte", 1, 0),
        ("layout_create", 28, 32, 16, 32, 0x300),
        ("layout_create", 28, 32, 1, 32, 0x400),
        ("layout_create", 0, 16, 1, 16, 0x500),  # C and D: CUDA_R_32F
        ("layout_create", 0, 16, 1, 16, 0x600),
        ("desc_set", 31, "c_int", 4, 0),  # SCALAR_32F
        ("desc_set", 32, "c_int", 4, 0),
        ("pref_create", 0x700),
        ("pref_set", 1, "c_ulong", 8, 33554432),
    ]


def test_descriptors_failure_destroys_what_was_made():
    lt = _RecordingLt(fail_at="layout")
    c = cublaslt.Case(16, 16, 32, "e4m3", "e4m3", "bfloat16", False, False, "tensorwise")
    with pytest.raises(cublaslt.LtError, match=r"^MatrixLayoutCreate C -> 7 \(INVALID_VALUE\)$"):
        cublaslt.build_descs(lt, c, PTRS, 1 << 20)
    assert lt.calls[-3:] == [("layout_destroy", 0x300), ("layout_destroy", 0x400), ("desc_destroy", 0x200)]


# --------------------------------------------------------------------------- entry points
class _FakeFn:
    restype = argtypes = None


class _FakeCDLL:
    """A library where every symbol exists; remembers the path it was opened with."""

    def __init__(self, path):
        self.path, self.fns = path, {}

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.fns.setdefault(name, _FakeFn())


def test_tensorcore_gets_every_entry_point_from_the_binding(monkeypatch):
    """tensorcore._lt() loads the library torch mapped and binds matmul, AlgoInit, AlgoConfigSetAttribute and
    AlgoCheck with cublasLt.h's signatures."""
    monkeypatch.setattr(ctypes, "CDLL", _FakeCDLL)
    monkeypatch.setattr(cublaslt, "loaded_libs", lambda fragment: ["/opt/x/libcublasLt.so.13"])
    monkeypatch.setattr(tc, "_state", {})
    lt = tc._lt()
    assert tc._lt() is lt
    assert lt.h is cublaslt and lt.path == "/opt/x/libcublasLt.so.13" and lt.lib.path == lt.path
    vp, i32, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    palgo, pres = ctypes.POINTER(cublaslt.MatmulAlgo), ctypes.POINTER(cublaslt.HeuristicResult)
    want = {
        "matmul": ("cublasLtMatmul", [vp] * 12 + [palgo, vp, sz, vp]),
        "algo_init": ("cublasLtMatmulAlgoInit", [vp, i32, i32, i32, i32, i32, i32, i32, palgo]),
        "algo_config_set": ("cublasLtMatmulAlgoConfigSetAttribute", [palgo, i32, vp, sz]),
        "algo_check": ("cublasLtMatmulAlgoCheck", [vp, vp, vp, vp, vp, vp, palgo, pres]),
        "get_heuristic": ("cublasLtMatmulAlgoGetHeuristic", [vp] * 7 + [i32, pres, ctypes.POINTER(i32)]),
        "algo_config_get": ("cublasLtMatmulAlgoConfigGetAttribute", [palgo, i32, vp, sz, ctypes.POINTER(sz)]),
        "desc_set": ("cublasLtMatmulDescSetAttribute", [vp, i32, vp, sz]),
        "create": ("cublasLtCreate", [ctypes.POINTER(vp)]),
    }
    for attr, (symbol, argtypes) in want.items():
        fn = getattr(lt, attr)
        assert fn is lt.lib.fns[symbol], attr
        assert fn.restype is i32 and fn.argtypes == argtypes, attr


def test_struct_layouts():
    assert ctypes.sizeof(cublaslt.MatmulAlgo) == 64 and ctypes.sizeof(cublaslt.HeuristicResult) == 96
    assert (cublaslt.HeuristicResult.workspaceSize.offset, cublaslt.HeuristicResult.state.offset,
            cublaslt.HeuristicResult.wavesCount.offset) == (64, 72, 76)


def test_describe_algo():
    cfg = {"tile_id": 20, "stages_id": 36, "cluster_shape_id": 2, "inner_shape_id": 0, "reduction_scheme": 2}
    assert cublaslt.describe_algo(cfg) == {"tile": "128x128", "stages": "128xAUTO", "cluster_shape": "1x1x1",
                                           "inner_shape": "UNDEFINED", "reduction": "COMPUTE_TYPE"}
    assert cublaslt.describe_algo({"tile_id": 99999, "stages_id": 29})["tile"] == "#99999"
    assert cublaslt.describe_algo({"stages_id": 29})["stages"] == "#29"


# --------------------------------------------------------------------------- library search
def _nothing_loads(monkeypatch, candidates=(), by_name=None):
    def refuse(path):
        raise OSError(f"cannot open {path}")

    monkeypatch.setattr(cublaslt, "loaded_libs", lambda fragment: [])
    monkeypatch.setattr(cublaslt, "candidate_paths", lambda names, subdirs: list(candidates))
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: by_name)
    monkeypatch.setattr(ctypes, "CDLL", refuse)


def test_search_order_and_message(monkeypatch):
    _nothing_loads(monkeypatch, ["/a/libcublasLt.so.13", "/b/libcublasLt.so.12"], "libcublasLt.so.12")
    with pytest.raises(click.ClickException) as e:
        cublaslt.find_cublaslt(None)
    assert e.value.message == ("no libcublasLt could be loaded; tried ['/a/libcublasLt.so.13', "
                               "'/b/libcublasLt.so.12', 'libcublasLt.so.12', 'libcublasLt.so.13', "
                               "'libcublasLt.so.12', 'libcublasLt.so']")
    assert cublaslt.find_cublaslt("/mine/libcublasLt.so") == ("/mine/libcublasLt.so", "--lib", [])
    monkeypatch.setattr(cublaslt, "loaded_libs", lambda fragment: ["/t/libcublasLt.so.13", "/u/libcublasLt.so"])
    assert cublaslt.find_cublaslt(None) == ("/t/libcublasLt.so.13", "/proc/self/maps (already loaded by torch)", [])


def test_tensorcore_reports_and_keeps_the_search_failure(monkeypatch):
    _nothing_loads(monkeypatch)
    monkeypatch.setattr(tc, "_state", {})
    with pytest.raises(OSError) as e:
        tc._lt()
    assert str(e.value) == ("libcublasLt unusable: ClickException: no libcublasLt could be loaded; "
                            "tried ['libcublasLt.so.13', 'libcublasLt.so.12', 'libcublasLt.so']")
    with pytest.raises(OSError) as again:
        tc._lt()
    assert again.value is e.value


# --------------------------------------------------------------------------- layering
def _imports(path: Path) -> set[str]:
    """Absolute names of the cpemu modules a file imports (anywhere in it, lazy imports included)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "cpemu"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "cpemu":
                continue
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}  # "from pkg import module"
    return out


def _modules() -> dict[str, Path]:
    mods = {}
    for p in sorted((ROOT / "cpemu").rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def test_runtime_never_imports_recording():
    """Outside cpemu/recording only the ``cpemu record`` command (cpemu/cli.py) imports it."""
    importers = {name for name, p in _modules().items() if not name.startswith("cpemu.recording")
                 and any(m.startswith("cpemu.recording") for m in _imports(p))}
    assert importers <= {"cpemu.cli"}, importers
    assert not any(m.startswith("cpemu.") for m in _imports(ROOT / "cpemu/cuda/cublaslt.py"))


def test_no_import_circle_through_the_cublaslt_modules():
    mods = _modules()
    graph = {name: {m for m in _imports(p) if m in mods and m != name} for name, p in mods.items()}
    ours = ["cpemu.cuda.cublaslt", "cpemu.cuda.tensorcore", "cpemu.recording.cli_output"] + [
        n for n in mods if n.startswith("cpemu.recording.cublaslt_")]
    assert len(ours) == 8

    def reaches(start, goal):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    assert [n for n in ours if reaches(n, n)] == []


def test_recording_tool_keeps_its_names():
    from cpemu.recording import cublaslt_heuristic as ch

    for name in ("Case", "CublasLt", "LtError", "MatmulAlgo", "HeuristicResult", "build_descs", "destroy_descs",
                 "describe_algo", "find_cublaslt", "loaded_libs", "torch_lt_plan", "DTYPES", "ALGO_CONFIG_FIELDS",
                 "CONFIG_DESCRIPTION", "DESC_A_SCALE_POINTER"):
        assert getattr(ch, name) is getattr(cublaslt, name), name
    for name in ("cli", "GRIDS", "grid_shapes", "gather_shapes", "build_cases", "Runtime", "Cudart", "query_case",
                 "resolve_workspace", "mirrored_workspace_bytes", "parse_log_lines", "parse_matmul_line",
                 "parse_heuristic_line", "run_child", "child_main", "probe_torch_workspace", "Progress",
                 "_write_json_atomic", "_echo", "TOOL", "TOOL_VERSION"):
        assert hasattr(ch, name), name


def test_selftest_runs():
    from cpemu.recording.cublaslt_heuristic import cli

    res = CliRunner().invoke(cli, ["selftest"])
    assert res.exit_code == 0, res.output
    assert "FAIL" not in res.output and "ok   matmul log parser" in res.output


def test_torch_log_child_starts(tmp_path):
    """The child runs the tool's own ``_torch-child`` command and always leaves a result file."""
    from cpemu.recording import cublaslt_torchlog as tl

    c = cublaslt.Case(16, 16, 32, "e4m3", "e4m3", "bfloat16", False, False, "tensorwise")
    res, lines, pinfo = tl.run_child([c], str(tmp_path), "t", with_query=False, workspace_bytes=None, lib=None,
                                     handle="auto", log_level=5, log_mask=None, timeout=300)
    assert pinfo["cmd"][:3] == [sys.executable, str(ROOT / "cpemu/recording/cublaslt_heuristic.py"), "_torch-child"]
    assert pinfo["returncode"] == 0, pinfo
    assert json.loads((tmp_path / "t.job.json").read_text())["cases"] == [
        {"M": 16, "N": 16, "K": 32, "a_dtype": "e4m3", "b_dtype": "e4m3", "out_dtype": "bfloat16",
         "fast_accum": False, "bias": False, "scale_mode": "tensorwise"}]
    if res.get("errors"):  # no CUDA torch here: the child says so in its result
        assert res["errors"][0].startswith("ClickException: torch requested but unusable"), res
    else:
        assert res["torch"] == [{"i": 0, "ok": True}]
