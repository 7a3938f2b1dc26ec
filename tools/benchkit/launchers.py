"""The direct call of cpemu's CUDA kernels, in one place.

Every benchmark that times a CUDA backend without ``cpemu.gemm``'s per-call Python gets its
launcher from :func:`direct_launcher`; a change of the kernels' call interface changes this
module only."""

from __future__ import annotations

from benchkit import FMT

#: How a record names the direct call (``call``) and spells it with its arguments.
DIRECT_CALL = "direct: cpemu.cuda.kernels.gemm_cuda"
DIRECT_CALL_SPELLED = ("cpemu.cuda.kernels.gemm_cuda(name, a_dev, bt_dev, 'e4m3', 'e4m3', plan, model, mode, "
                       "scale_a_dev, scale_b_dev, None, out_dtype)")


def has_direct(name: str) -> bool:
    """Whether backend ``name`` has a direct launcher."""
    from cpemu.cuda import kernels

    return name in kernels.DIRECT


def direct_launcher(name: str, prof, M: int, N: int, K: int, fast_accum: bool, out_dtype: str, operands, *,
                    defines=(), tiled_module=None):
    """A function ``launch()`` that runs backend ``name`` once and returns its device output.

    The call: e4m3 x e4m3, (M, N, K), tensorwise scales, no bias, the profile's instruction
    model, tensorwise mode and plan (``prof.plan(M, N, K, fast_accum, "tensorwise", "e4m3",
    "e4m3", out_dtype)``, as cpemu.gemm computes it). ``operands``: (a (M, K), bt (N, K)) codes
    on the device and the scales (scale_a, scale_b). ``defines`` (macros to compile the kernel
    from source with) and ``tiled_module`` (cuda-tiled's geometry) are for tuning tools only.
    The kernel runs on cupy's current stream; the call does not synchronize."""
    from cpemu.cuda import kernels

    plan = prof.plan(M, N, K, fast_accum, "tensorwise", FMT, FMT, out_dtype)
    model, mode = prof.instruction, prof.mode("tensorwise")
    a, bt, sa, sb = operands
    extra = {}
    if defines:
        extra["defines"] = tuple(defines)
    if tiled_module is not None:
        extra["tiled_module"] = tiled_module

    def launch():
        return kernels.gemm_cuda(name, a, bt, FMT, FMT, plan, model, mode, sa, sb, None, out_dtype, **extra)

    return launch


def direct_details(name: str, prof, plan, M: int, N: int, K: int, out_dtype: str, fast_accum: bool,
                   sm_count) -> dict:
    """What the direct call picks for this shape on this GPU, for the record: cuda-tiled's
    geometry (``tiled_module``), cublaslt-tc's algorithm (``algorithm``, or the error of its lookup)."""
    from cpemu.cuda import kernels

    out = {}
    if name == "cuda-tiled" and sm_count:
        out["tiled_module"] = kernels.tiled_module_for(M, N, sm_count)
    if name == kernels.TENSOR_CORE:
        from cpemu.cuda import tensorcore

        try:
            out["algorithm"] = tensorcore.describe(M, N, K, FMT, FMT, out_dtype, fast_accum, False, "tensorwise",
                                                   plan.splits, ada=prof.instruction.name == tensorcore.ADA_MODEL)
        except Exception as e:  # noqa: BLE001 - a record, never a failure
            out["algorithm"] = {"error": f"{type(e).__name__}: {e}"}
    return out
