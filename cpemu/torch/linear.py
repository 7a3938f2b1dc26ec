"""The forward FP8 GEMM of a Transformer Engine linear layer under delayed scaling: ``FP8Linear``,
with TE's scale (:func:`delayed_scaling_scale`) and cast (:func:`quantize_e4m3`)."""

from __future__ import annotations

import numbers

import torch

from .. import backends
from ..profile import DEFAULT_PROFILE, get_profile
from .api import scaled_mm
from .chunking import row_chunks
from .dtypes import _FP8

#: Largest finite float8_e4m3fn value (Transformer Engine's ``fp8_max`` for E4M3).
E4M3_MAX = 448.0


def delayed_scaling_scale(amax, margin: int = 0, fp8_max: float = E4M3_MAX) -> torch.Tensor:
    """Transformer Engine's delayed-scaling scale from an amax: ``(fp8_max / amax) / 2**margin``
    in float32; 1 when amax is 0 or not finite, the largest float32 when the quotient overflows.
    Returns a 0-d float32 tensor."""
    try:
        amax = torch.as_tensor(amax, dtype=torch.float32).detach()
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"amax: must be one number (got {type(amax).__name__}: {e})") from None
    if amax.numel() != 1:
        raise ValueError(f"amax: must be one number (got shape {tuple(amax.shape)})")
    amax = amax.reshape(())
    if isinstance(margin, bool) or not isinstance(margin, numbers.Integral) or not -126 <= margin <= 126:
        raise ValueError(f"margin: must be an integer from -126 to 126 (got {margin!r})")
    if isinstance(fp8_max, bool) or not isinstance(fp8_max, numbers.Real) or not 0 < fp8_max < float("inf"):
        raise ValueError(f"fp8_max: must be a positive finite number (got {fp8_max!r})")
    one = torch.ones((), dtype=torch.float32, device=amax.device)
    sf = (torch.tensor(fp8_max, dtype=torch.float32, device=amax.device) / amax) / (2.0 ** margin)
    sf = torch.where(amax > 0.0, sf, one)
    sf = torch.where(torch.isfinite(amax), sf, one)
    return torch.where(torch.isinf(sf), torch.full_like(sf, torch.finfo(torch.float32).max), sf)


def quantize_e4m3(x: torch.Tensor, scale) -> torch.Tensor:
    """``x * scale`` in float32, saturated to +-448 and rounded to nearest even float8_e4m3fn,
    as Transformer Engine's cast kernel does (``__nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..)``);
    NaN stays NaN."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: must be a torch tensor (got {type(x).__name__})")
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if scale.numel() != 1:
        raise ValueError(f"scale: must be one number, a per-tensor scale (got shape {tuple(scale.shape)})")
    y = x.to(torch.float32) * scale
    return torch.clamp(y, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


class FP8Linear(torch.nn.Module):
    """The forward GEMM of a Transformer Engine FP8 linear layer (delayed scaling), emulated.

    This is what ``te.Linear`` (no bias) computes under ``fp8_autocast`` with delayed
    scaling, as in Evo 2's FP8 projections, with the bits of ``profile``'s GPU:

    1. the input is quantised to E4M3 with the given ``input_scale``:
       ``q = e4m3(clamp(x * input_scale, -448, 448))`` (round to nearest even);
    2. rows are padded with zeros to a multiple of 16 tokens (cuBLASLt FP8 needs it);
    3. ``y = scaled_mm(q, weight.t(), input_scale_inv, weight_scale_inv,
       out_dtype=torch.bfloat16, use_fast_accum=True)`` (TE's forward GEMM does not use
       the split accumulator), no bias;
    4. the padding rows are removed; leading dimensions of ``x`` are kept.

    Where the padded token count passes the profile's domain of M (long contexts), or
    ``max_rows`` caps it, the rows run in chunks, only where that keeps the bits
    (:func:`cpemu.torch.chunking.row_chunks`: the schedule is unsplit for every chunk and
    for the whole call); elsewhere :class:`cpemu.UnsupportedShape` is raised.

    Buffers: ``weight`` (out_features, in_features) float8_e4m3fn, ``weight_scale_inv``,
    ``input_scale``, ``input_scale_inv`` (0-d float32). ``.to(device)`` moves them; the
    scales are "given values" (TE's amax history is not updated here).

    Build it from a high-precision weight with :meth:`from_weight` (scales derived from
    amaxes as TE's delayed scaling does), or from an already quantised weight with
    :meth:`from_fp8` (e.g. an FP8 checkpoint: weight bytes plus ``scale_inv``).

    Caveat: the numerics are those of ``torch._scaled_mm`` on the profile's GPU (the
    instruction, its accumulation and torch's cuBLASLt configuration). TE calls
    cuBLASLt itself, with its own workspace, so for shapes where cuBLASLt's heuristic
    would split K the two may differ (not recorded). With tokens padded to 16 rows,
    the H200 profile splits none of Evo 2's projection shapes (1B, 7B, 40B): each
    output is one fast-accumulation chain over K.
    """

    def __init__(self, weight_fp8, weight_scale_inv, input_scale, *, input_scale_inv=None,
                 profile=DEFAULT_PROFILE, backend="auto", max_rows: int | None = None):
        super().__init__()
        if not isinstance(weight_fp8, torch.Tensor) or weight_fp8.dtype != torch.float8_e4m3fn \
                or weight_fp8.dim() != 2:
            raise ValueError("weight_fp8: must be a 2-D (out_features, in_features) torch.float8_e4m3fn tensor")
        if weight_fp8.shape[1] % 16 or weight_fp8.shape[0] % 16 or not weight_fp8.shape[1] or not weight_fp8.shape[0]:
            raise ValueError(f"weight_fp8: in_features and out_features must be positive multiples of 16, as "
                             f"torch._scaled_mm requires (got shape {tuple(weight_fp8.shape)})")
        dev = weight_fp8.device
        wsi = _scalar_scale(weight_scale_inv, "weight_scale_inv", dev)
        isc = _scalar_scale(input_scale, "input_scale", dev)
        isi = torch.reciprocal(isc) if input_scale_inv is None else _scalar_scale(input_scale_inv, "input_scale_inv",
                                                                                   dev)
        backends.check(backend, get_profile(profile))  # a bad backend fails here, not at the first GEMM
        if max_rows is not None and (not isinstance(max_rows, int) or max_rows < 16 or max_rows % 16):
            raise ValueError(f"max_rows: must be None or a positive multiple of 16 (got {max_rows!r})")
        self.profile = profile
        self.backend = backend
        self.max_rows = max_rows
        self.register_buffer("weight", weight_fp8.detach().contiguous())
        self.register_buffer("weight_scale_inv", wsi.clone())
        self.register_buffer("input_scale", isc.clone())
        self.register_buffer("input_scale_inv", isi.clone())

    @classmethod
    def from_weight(cls, weight, *, input_amax=None, input_scale=None, weight_amax=None, margin: int = 0,
                    profile=DEFAULT_PROFILE, backend="auto", max_rows: int | None = None):
        """From a bf16/fp32 (out_features, in_features) weight, with TE delayed-scaling scales.

        ``weight_amax`` (default: the weight's own max |w|) and ``input_amax`` (the amax
        history's value for the input; or pass ``input_scale`` directly) give
        ``scale = (448 / amax) / 2**margin``; ``scale_inv = 1 / scale`` in float32.
        """
        if (input_amax is None) == (input_scale is None):
            raise ValueError("from_weight: pass exactly one of input_amax and input_scale")
        if (not isinstance(weight, torch.Tensor) or not weight.dtype.is_floating_point or weight.dtype in _FP8
                or weight.dim() != 2 or weight.numel() == 0):
            raise ValueError(f"weight: must be a non-empty 2-D bf16/fp16/fp32 tensor (out_features, in_features) "
                             f"(got {getattr(weight, 'dtype', type(weight).__name__)} of shape "
                             f"{tuple(getattr(weight, 'shape', ()))})")
        weight = weight.detach()
        w_amax = weight.abs().max().float() if weight_amax is None else weight_amax
        w_scale = delayed_scaling_scale(w_amax, margin).to(weight.device)
        if input_scale is None:
            input_scale = delayed_scaling_scale(input_amax, margin)
        return cls(quantize_e4m3(weight, w_scale), torch.reciprocal(w_scale), input_scale,
                   profile=profile, backend=backend, max_rows=max_rows)

    @classmethod
    def from_fp8(cls, weight_fp8, weight_scale_inv, *, input_scale, input_scale_inv=None,
                 profile=DEFAULT_PROFILE, backend="auto", max_rows: int | None = None):
        """From a quantised E4M3 weight and its ``scale_inv`` (an FP8 checkpoint)."""
        return cls(weight_fp8, weight_scale_inv, input_scale, input_scale_inv=input_scale_inv,
                   profile=profile, backend=backend, max_rows=max_rows)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def extra_repr(self) -> str:
        name = getattr(self.profile, "name", self.profile)
        return f"in_features={self.in_features}, out_features={self.out_features}, profile={name!r}"

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """The E4M3 codes TE feeds the GEMM for ``x`` (same shape)."""
        return quantize_e4m3(x, self.input_scale)

    def forward_fp8(self, x_fp8: torch.Tensor) -> torch.Tensor:
        """The GEMM on an already quantised (tokens, in_features) E4M3 input; bf16 (tokens, out_features)."""
        if not isinstance(x_fp8, torch.Tensor) or x_fp8.dtype != torch.float8_e4m3fn or x_fp8.dim() != 2:
            raise ValueError(f"input: forward_fp8 takes a 2-D float8_e4m3fn tensor of (tokens, in_features) codes "
                             f"(got {getattr(x_fp8, 'dtype', type(x_fp8).__name__)} of shape "
                             f"{tuple(getattr(x_fp8, 'shape', ()))})")
        M, K = x_fp8.shape
        if K != self.in_features:
            raise ValueError(f"input: last dimension must be in_features = {self.in_features} (got {K})")
        pad = -M % 16
        if pad:
            buf = torch.zeros((M + pad, K), dtype=torch.uint8, device=x_fp8.device)
            buf[:M] = x_fp8.view(torch.uint8)
            x_fp8 = buf.view(torch.float8_e4m3fn)
        else:
            x_fp8 = x_fp8.contiguous()
        chunks = row_chunks(self.profile, M + pad, self.out_features, K, max_rows=self.max_rows) if M else [(0, 0)]
        parts = [scaled_mm(x_fp8[i:j], self.weight.t(), self.input_scale_inv, self.weight_scale_inv,
                           out_dtype=torch.bfloat16, use_fast_accum=True, profile=self.profile, backend=self.backend)
                 for i, j in chunks]
        y = parts[0] if len(parts) == 1 else torch.cat(parts)
        return y[:M] if pad else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dtype in _FP8:
            raise ValueError(f"input: must be a floating-point tensor (bf16, fp16 or fp32), quantised here with "
                             f"input_scale; pass E4M3 codes to forward_fp8 (got "
                             f"{getattr(x, 'dtype', type(x).__name__)})")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"input: last dimension must be in_features = {self.in_features} "
                             f"(got shape {tuple(x.shape)})")
        lead = x.shape[:-1]
        q = self.quantize_input(x.reshape(-1, self.in_features))
        y = self.forward_fp8(q)
        return y.reshape(*lead, self.out_features)



def _scalar_scale(value, name: str, device) -> torch.Tensor:
    """A per-tensor scale as a float32 0-d tensor on ``device``: one positive finite value."""
    try:
        t = torch.as_tensor(value, dtype=torch.float32, device=device).detach()
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{name}: must be one positive finite number (got {type(value).__name__}: {e})") from None
    if t.numel() != 1:
        raise ValueError(f"{name}: must be one number (a per-tensor scale), got shape {tuple(t.shape)}")
    v = float(t.reshape(()).cpu())
    if not (v > 0 and v != float("inf")):
        raise ValueError(f"{name}: must be positive and finite (got {v})")
    return t.reshape(())
