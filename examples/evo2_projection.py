"""Evo 2 1B's FP8 input projection, computed on the CPU with the numerics of an H200.

Evo 2 runs its projections through Transformer Engine in FP8 (E4M3, delayed scaling,
fast accumulation, bf16 output). This script

1. builds a small random layer of the 1B model's projection shape (out 5760, in 1920)
   as ``cpemu.torch.FP8Linear`` and runs a few tokens through it;
2. prints the plain bf16 matmul, the exact product of the same FP8 operands, and the
   emulated H200 output side by side, and how far they differ;
3. recomputes the Evo 2 1B cases recorded on an H200 (``tests/data/h200``) from their
   seeds and compares the output's sha256 with the recorded one (``MATCH``).

Run: ``python examples/evo2_projection.py [--tokens 5] [--truth tests/data/h200]``
(a few seconds on one CPU core; needs torch, a CPU build is enough).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

from cpemu.cases import Case, operands, sha256_arrays
from cpemu.torch import FP8Linear, scaled_mm

N_OUT, K_IN = 5760, 1920  # Evo 2 1B: hidden 1920 -> 3 x 1920
DEFAULT_TRUTH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "h200")


def bits(y: torch.Tensor) -> np.ndarray:
    """The output's bit patterns (uint16 for bf16/fp16, uint32 for fp32)."""
    if y.dtype == torch.float32:
        return y.contiguous().view(torch.int32).cpu().numpy().view(np.uint32)
    return y.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def to_bf16_exact(x: torch.Tensor) -> torch.Tensor:
    """float64 -> bf16 with one rounding (to nearest even): round to odd into float32 first."""
    d = x.numpy()
    f = d.astype(np.float32)
    f = np.where(np.abs(f.astype(np.float64)) > np.abs(d), np.nextafter(f, np.float32(0)), f)  # truncate
    b = f.view(np.uint32) | (f.astype(np.float64) != d).astype(np.uint32)  # sticky bit: round to odd
    return torch.from_numpy(b.view(np.float32)).to(torch.bfloat16)


def random_layer_demo(tokens: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(N_OUT, K_IN, generator=g) * 0.02).to(torch.bfloat16)  # a bf16 weight
    x = (torch.randn(tokens, K_IN, generator=g) * 3.0).to(torch.bfloat16)  # a few tokens of activations
    # Delayed scaling: the scales come from amaxes (here the current ones, as after calibration).
    layer = FP8Linear.from_weight(w, input_amax=x.abs().max().float())
    print(f"layer: {layer}")
    print(f"  weight scale_inv {layer.weight_scale_inv.item():.6g}, input scale {layer.input_scale.item():.6g} "
          f"(E4M3, fast accumulation, bf16 output, {tokens} tokens padded to {tokens + (-tokens % 16)} rows)")

    t0 = time.time()
    y_h200 = layer(x)  # emulated H200 bits
    t_emu = time.time() - t0
    y_bf16 = x @ w.t()  # the plain bf16 matmul (no FP8)
    xq = layer.quantize_input(x)  # the FP8 operands the GPU multiplies ...
    exact = (xq.double() @ layer.weight.double().t()) * (layer.input_scale_inv.double() * layer.weight_scale_inv.double())
    y_exact = to_bf16_exact(exact)  # ... and their exact product, rounded once to bf16

    print(f"\noutputs of token 0 (first 6 of {N_OUT}); emulation took {t_emu:.2f} s")
    print(f"  {'bf16 matmul':>14} {'exact FP8':>14} {'H200 (cpemu)':>14}")
    for j in range(6):
        print(f"  {y_bf16[0, j].item():14.6g} {y_exact[0, j].item():14.6g} {y_h200[0, j].item():14.6g}")

    def compare(name, ref):
        d = y_h200.double() - ref.double()
        rel = d.norm() / ref.double().norm()
        ndiff = int((bits(y_h200) != bits(ref)).sum())
        print(f"  H200 vs {name:<12} max |diff| {d.abs().max().item():.4g}, relative difference "
              f"|diff|/|ref| {rel.item():.3g}, {ndiff} of {y_h200.numel()} bf16 values differ")

    print("\nhow far the emulated H200 output is from")
    compare("bf16 matmul", y_bf16)  # FP8 quantisation + tensor-core arithmetic
    compare("exact FP8", y_exact)  # the tensor core's truncation alone


def recorded_cases(truth: str) -> bool:
    with open(os.path.join(truth, "manifest.json")) as f:
        man = json.load(f)
    recs = [r for r in man["cases"] if "evo2-1b" in r.get("tags", ()) and "error" not in r]
    if not recs:
        print(f"no Evo 2 1B case in {truth}")
        return False
    print(f"\nrecorded on {man['provenance']['gpu']} (torch {man['provenance']['torch']}, "
          f"driver {man['provenance']['driver']}):")
    ok = True
    for rec in recs:
        case = Case.from_json(rec)
        a, bt, sa, sb, bias = operands(case)  # regenerated from the recorded seed
        if sha256_arrays(a, bt, sa, sb, bias) != rec["inputs_sha256"]:
            print(f"  {case.id}: regenerated inputs differ from the recorded ones")
            ok = False
            continue
        x_fp8 = torch.from_numpy(a).view(torch.float8_e4m3fn)
        w_fp8 = torch.from_numpy(bt).view(torch.float8_e4m3fn)  # (N, K), as a TE weight
        t0 = time.time()
        if case.M % 16 == 0 and case.scale == "tensor":
            # The TE-style layer: scale_a = input scale_inv, scale_b = weight scale_inv.
            layer = FP8Linear.from_fp8(w_fp8, torch.from_numpy(sb), input_scale=1.0 / torch.from_numpy(sa),
                                       input_scale_inv=torch.from_numpy(sa))
            y, how = layer.forward_fp8(x_fp8), "FP8Linear"
        else:  # M not padded (the recording used M as is): torch._scaled_mm's drop-in
            y = scaled_mm(x_fp8, w_fp8.t(), torch.from_numpy(sa), torch.from_numpy(sb), out_dtype=torch.bfloat16,
                          use_fast_accum=case.fast_accum)
            how = "scaled_mm"
        got = sha256_arrays(bits(y))
        match = got == rec["output_sha256"]
        ok &= match
        print(f"  {case.id} via {how} ({time.time() - t0:.2f} s): sha256 {got[:16]}... "
              f"{'MATCH' if match else 'MISMATCH (recorded ' + rec['output_sha256'][:16] + '...)'}")
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=5, help="tokens of the random layer demo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--truth", default=DEFAULT_TRUTH, help="truth folder with manifest.json")
    args = p.parse_args(argv)
    random_layer_demo(args.tokens, args.seed)
    return 0 if recorded_cases(args.truth) else 1


if __name__ == "__main__":
    sys.exit(main())
