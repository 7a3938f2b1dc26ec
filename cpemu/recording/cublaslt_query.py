"""Asking cuBLASLt's heuristic as torch asks it: library, device, handle, pointers, workspace.

:class:`Runtime` loads the library (torch's own when torch is present), opens a handle and
makes device pointers; :func:`mirrored_workspace_bytes` recomputes torch's workspace size;
:func:`query_case` asks the heuristic for one case and returns a JSON row.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from dataclasses import asdict

import click

from cpemu.cuda.cublaslt import (ALGO_FIELD_NAMES, CUBLAS_STATUS_NAMES, Case, CublasLt, HeuristicResult, LtError,
                                 build_descs, candidate_paths, describe_algo, destroy_descs, find_cublaslt,
                                 loaded_libs)
from cpemu.recording.cli_output import echo

CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")

EMPTY_ALGO = {name: None for name in ALGO_FIELD_NAMES}


def query_case(lt: CublasLt, handle: ctypes.c_void_p, c: Case, ptrs: dict,
               workspace_bytes: int, top: int = 1, build=build_descs) -> dict:
    """One heuristic query; returns a JSON row (status recorded, never raises).

    ``build(lt, c, ptrs, workspace_bytes)`` makes the descriptors (default: torch's)."""
    row = asdict(c)
    row.update({"status": None, "status_code": None, "returned_count": None, **EMPTY_ALGO,
                "workspace_size": None, "waves_count": None, "result_state": None})
    reject = c.torch_rejects()
    if reject:
        row["torch_rejects"] = reject
    made = None
    try:
        made = build(lt, c, ptrs, workspace_bytes)
        n = max(1, int(top))
        results = (HeuristicResult * n)()
        count = ctypes.c_int(0)
        st = lt.get_heuristic(handle, made["desc"], made["A"], made["B"], made["C"], made["D"],
                              made["pref"], n, results, ctypes.byref(count))
        row["status_code"], row["returned_count"] = int(st), int(count.value)
        if st != 0:
            row["status"] = f"HEURISTIC_{CUBLAS_STATUS_NAMES.get(st, st)}"
            return row
        if count.value <= 0:
            row["status"] = "NO_ALGO"  # torch raises CUBLAS_STATUS_NOT_SUPPORTED here
            return row
        ranked = []
        for i in range(min(count.value, n)):
            r = results[i]
            item = lt.read_algo(r.algo)
            item.update(workspace_size=int(r.workspaceSize), waves_count=float(r.wavesCount),
                        result_state=int(r.state), names=describe_algo(item))
            ranked.append(item)
        row.update(ranked[0])
        row["status"] = "OK" if ranked[0]["result_state"] == 0 else \
            f"STATE_{CUBLAS_STATUS_NAMES.get(ranked[0]['result_state'], ranked[0]['result_state'])}"
        if n > 1:
            row["alternatives"] = ranked[1:]
    except LtError as e:
        row["status"], row["status_code"], row["error"] = "DESC_ERROR", e.code, str(e)
    except Exception as e:  # noqa: BLE001
        row["status"], row["error"] = "EXCEPTION", f"{type(e).__name__}: {e}"
    finally:
        if made is not None:
            destroy_descs(lt, made)
    return row


def _force_torch_cublaslt(torch) -> str | None:
    """Make torch load its cuBLAS/cuBLASLt (tiny FP8 GEMM); returns an error text or None."""
    err = None
    try:
        dev = torch.device("cuda")
        a = torch.zeros(16, 32, device=dev).to(torch.float8_e4m3fn)
        b = torch.zeros(16, 32, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev, dtype=torch.float32)
        torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"
        try:
            x = torch.ones(16, 16, device="cuda", dtype=torch.bfloat16)
            torch.matmul(x, x)
        except Exception as e2:  # noqa: BLE001
            err += f"; bf16 matmul: {e2}"
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass
    return err


class Cudart:
    """Minimal libcudart binding (cudaMalloc/cudaFree/attributes) for the no-torch path."""

    def __init__(self):
        cands = candidate_paths(CUDART_NAMES, ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib",
                                                "torch/lib"))
        cands += [n for n in [ctypes.util.find_library("cudart")] if n] + list(CUDART_NAMES)
        self.lib, self.path = None, None
        for p in cands:
            try:
                self.lib, self.path = ctypes.CDLL(p), p
                break
            except OSError:
                continue
        if self.lib is None:
            raise OSError("libcudart not found")
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                                    ctypes.c_int]

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        st = self.lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes))
        if st != 0:
            raise OSError(f"cudaMalloc({nbytes}) -> {st}")
        return int(p.value)

    def attr(self, attr: int) -> int | None:
        v = ctypes.c_int(0)
        return v.value if self.lib.cudaDeviceGetAttribute(ctypes.byref(v), attr, 0) == 0 else None

    def device_name(self) -> str | None:
        buf = ctypes.create_string_buffer(16384)  # far larger than any cudaDeviceProp
        for fn in ("cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"):
            f = getattr(self.lib, fn, None)
            if f is not None and f(buf, 0) == 0:
                return buf.value.decode(errors="replace")  # name[256] is the first member
        return None


class Runtime:
    """Library, device info, handle and small device buffers for queries."""

    def __init__(self, use_torch: str = "auto", lib: str | None = None, handle: str = "auto",
                 pointers: str = "auto"):
        self.torch = None
        self.info: dict = {"torch_version": None, "torch_force_load_error": None}
        if use_torch in ("auto", "yes"):
            try:
                import torch  # noqa: PLC0415 - optional, GPU machine only
                if not torch.cuda.is_available():
                    raise RuntimeError("torch.cuda.is_available() is False")
                self.torch = torch
                self.info["torch_version"] = torch.__version__
                self.info["torch_cuda_version"] = torch.version.cuda
                self.info["torch_force_load_error"] = _force_torch_cublaslt(torch)
            except Exception as e:  # noqa: BLE001
                if use_torch == "yes":
                    raise click.ClickException(f"torch requested but unusable: {e}")
                self.info["torch_unusable"] = f"{type(e).__name__}: {e}"
                self.torch = None
        path, how, tried = find_cublaslt(lib)
        self.lt = CublasLt(path)
        self.info.update(library_path=os.path.realpath(path) if os.path.exists(path) else path,
                         library_found_by=how, cublaslt_version=self.lt.version(),
                         cublaslt_cudart_version=self.lt.cudart_version(),
                         loaded_cublaslt_in_process=loaded_libs("libcublasLt.so"))
        if tried:
            self.info["library_search_tried"] = tried
        distinct = {os.path.realpath(p) for p in self.info["loaded_cublaslt_in_process"]}
        if len(distinct) > 1:
            echo(f"WARNING: several libcublasLt are mapped in this process: {sorted(distinct)}")
        self.cudart = None
        if self.torch is not None:
            props = self.torch.cuda.get_device_properties(self.torch.cuda.current_device())
            self.info.update(device_name=props.name, sm_count=props.multi_processor_count,
                             compute_capability=f"{props.major}.{props.minor}")
        else:
            try:
                self.cudart = Cudart()
                self.info.update(cudart_path=self.cudart.path, device_name=self.cudart.device_name(),
                                 sm_count=self.cudart.attr(16),  # cudaDevAttrMultiProcessorCount
                                 compute_capability=f"{self.cudart.attr(75)}.{self.cudart.attr(76)}")
            except OSError as e:
                self.info.update(device_name=None, sm_count=None, cudart_error=str(e))
        self._handle_mode, self._pointer_mode = handle, pointers
        self.handle, self._own_handle = None, False
        self._keep: list = []
        self._ptrs: dict | None = None

    def open_handle(self) -> None:
        """torch's own cuBLAS handle (valid as a cublasLtHandle_t) or a fresh cublasLtCreate one."""
        # Only safe when our libcublasLt is the instance torch itself loaded.
        torch_lib = self.info["library_found_by"].startswith("/proc")
        want_torch = self._handle_mode == "torch" or (
            self._handle_mode == "auto" and self.torch is not None and torch_lib)
        if want_torch:
            if self.torch is None or not torch_lib:
                raise click.ClickException("--handle torch needs torch and torch's own libcublasLt")
            try:
                self.handle = ctypes.c_void_p(int(self.torch.cuda.current_blas_handle()))
                self.info["handle"] = "torch.cuda.current_blas_handle() (getCurrentCUDABlasLtHandle on CUDA)"
                return
            except Exception as e:  # noqa: BLE001
                if self._handle_mode == "torch":
                    raise click.ClickException(f"torch.cuda.current_blas_handle() failed: {e}")
                self.info["torch_handle_error"] = f"{type(e).__name__}: {e}"
        h = ctypes.c_void_p()
        st = self.lt.create(ctypes.byref(h))
        if st != 0:
            raise click.ClickException(f"cublasLtCreate failed: {st} ({CUBLAS_STATUS_NAMES.get(st, '?')}); "
                                       "is a GPU visible?")
        self.handle, self._own_handle = h, True
        self.info["handle"] = "cublasLtCreate"

    def pointers(self, max_m: int, max_n: int) -> dict:
        """Device pointers for the A/B scales and the bias (>=256-byte aligned)."""
        if self._ptrs is not None:
            return self._ptrs
        sizes = {"scale_a": 4 * max(1, max_n), "scale_b": 4 * max(1, max_m), "bias": 4 * max(1, max_n)}
        sizes = {k: (v + 511) // 512 * 512 for k, v in sizes.items()}
        mode = self._pointer_mode
        ptrs = {}
        if mode in ("auto", "torch") and self.torch is not None:
            for k, nbytes in sizes.items():
                t = self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")
                self._keep.append(t)
                ptrs[k] = int(t.data_ptr())
            self.info["pointers"] = "torch caching allocator"
        elif mode in ("auto", "cudart"):
            try:
                cr = self.cudart or Cudart()
                for k, nbytes in sizes.items():
                    ptrs[k] = cr.malloc(nbytes)
                self.info["pointers"] = "cudaMalloc"
            except OSError as e:
                if mode == "cudart":
                    raise click.ClickException(str(e))
                ptrs = {}
        if not ptrs:
            # The heuristic never dereferences these; it only reads their alignment
            # (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER note).
            base = 0x7F0000000000
            ptrs = {k: base + i * 0x1000000 for i, k in enumerate(sizes)}
            self.info["pointers"] = "synthetic 256-byte-aligned addresses (no allocator available)"
        self.info["pointer_alignment"] = {k: _alignment(v) for k, v in ptrs.items()}
        self._ptrs = ptrs
        return ptrs

    def close(self) -> None:
        if self._own_handle and self.handle is not None:
            self.lt.destroy(self.handle)
        self.handle = None


def _alignment(addr: int) -> int:
    """Largest power of two <= 256 dividing addr (CUDABlas.cpp _getAlignment)."""
    a = 256
    while a > 1 and addr % a:
        a //= 2
    return a


# ---------------------------------------------------------------------------
# Workspace size
# ---------------------------------------------------------------------------
def _check_env_true(name: str) -> bool | None:
    """c10::utils::check_env: None if unset, True/False for 1/0-like values."""
    v = os.environ.get(name)
    if v is None:
        return None
    return v.strip().lower() in ("1", "true", "yes", "on", "y")


def mirrored_workspace_bytes(policy: str, cc_major: int | None) -> int:
    """getCUDABlasLtWorkspaceSize (CublasHandlePool.cpp), two revisions.

    'legacy': parseCUDABlasLtWorkspaceSize default 1024 KiB (CUBLASLT_WORKSPACE_SIZE in
    KiB), clamped to the cuBLAS workspace when unified (default on outside FBCODE).
    'unified': later revision where the unified default is the cuBLAS workspace
    (parseChosenWorkspaceSize: CUBLAS_WORKSPACE_CONFIG, else 32 MiB on sm_90).
    """
    sm90 = cc_major == 9
    cublas = 4096 * 8 * 1024 if sm90 else 4096 * 1024 * 2 + 16 * 1024 * 8
    cfg = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if cfg:
        pairs = re.findall(r":([0-9]+):([0-9]+)", cfg)
        if pairs:
            cublas = sum(int(s) * 1024 * int(c) for s, c in pairs)
    unified_env = _check_env_true("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
    unified = unified_env is None or unified_env is True
    lt_kib = (cublas // 1024) if (policy == "unified" and unified) else 1024
    if os.environ.get("CUBLASLT_WORKSPACE_SIZE"):
        try:
            lt_kib = int(os.environ["CUBLASLT_WORKSPACE_SIZE"])
        except ValueError:
            pass
    size = lt_kib * 1024
    if unified and cublas < size:
        size = cublas
    return size
