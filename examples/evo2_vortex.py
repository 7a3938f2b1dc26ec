"""A tiny random-weight Evo 2 (vortex StripedHyena 2) with FP8 projections, on the CPU, with H200 bits.

The script goes through the steps of docs/evo2.md on a model small enough for a laptop:

1. builds a 4-block random-weight model with ``cpemu.evo2.tiny_model()`` (``build_model`` of a
   small config);
2. writes a checkpoint as Transformer Engine does: the bf16 weights plus, for every
   projection, a TE ``_extra_state`` with delayed-scaling scales (``--format te1`` or ``te2``);
3. loads it with ``cpemu.evo2.load_checkpoint``, prints the dry run, swaps the projections;
4. runs a forward pass and prints how many logits the FP8 projections changed.

Run: ``python examples/evo2_vortex.py [--format te2] [--tokens 40]``
(needs torch and vortex: ``pip install -e ".[evo2]"``; a second or two).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

import cpemu.evo2 as ce
from cpemu.torch import delayed_scaling_scale
from cpemu.torch.te_state import write_extra_state


def te_checkpoint(model, fmt: str, seed: int = 0) -> dict:
    """The model's state dict with a TE-format extra state per projection: the weight's scale
    from its amax, the input's from an amax history of 16 steps (as delayed scaling keeps it)."""
    g = torch.Generator().manual_seed(seed)
    sd = dict(model.state_dict())
    for name, _ in ce.fp8_projections(model):
        hist = torch.rand(16, 3, generator=g) * 4 + 0.5
        hist[:, 1] = sd[f"{name}.weight"].abs().max().float()
        scale = torch.stack([delayed_scaling_scale(a) for a in hist.max(dim=0).values])
        sd[f"{name}._extra_state"] = write_extra_state(scale, hist, fmt=fmt)
    return sd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", choices=("te1", "te2"), default="te2", help="TE 1.x or >= 2.0 extra states")
    ap.add_argument("--tokens", type=int, default=40)
    args = ap.parse_args()
    model = ce.tiny_model()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tiny-evo2.pt")
        torch.save(te_checkpoint(model, args.format), path)
        ckpt = ce.load_checkpoint(path)
    tokens = torch.randint(0, 512, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        bf16_logits, _ = model(tokens)
    print("dry run:")
    for entry in ce.swap_fp8_projections(model, ckpt, dry_run=True):
        print("  ", entry)
    ce.swap_fp8_projections(model, ckpt, profile="hopper-h200-torch")
    with torch.no_grad():
        fp8_logits, _ = model(tokens)
    changed = (fp8_logits.view(torch.int16) != bf16_logits.view(torch.int16)).float().mean().item()
    print(f"logits {tuple(fp8_logits.shape)}: {100 * changed:.1f} % differ from the bf16 model's "
          f"(FP8 projections with the H200's bits)")


if __name__ == "__main__":
    main()
