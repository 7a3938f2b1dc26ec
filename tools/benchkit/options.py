"""Argument parsing shared by the benchmark tools: shapes, M lists, data kinds, backends."""

from __future__ import annotations

import click

from benchkit import host_backend
from cpemu.backends import LADDER
from cpemu.cases import DATA_KINDS, EVO2_SHAPES

DATA_ALIASES = {"adversarial": "spread"}
#: The shapes a tool runs without --shape: the Evo 2 projections.
DEFAULT_SHAPES = ("evo2-1b", "evo2-7b", "evo2-40b")


def parse_shape(text: str) -> tuple[str, int, int]:
    """``evo2-1b`` / ``evo2-7b`` / ``evo2-40b`` or ``NxK`` -> (label, N, K)."""
    t = text.strip().lower()
    if t in EVO2_SHAPES:
        N, K = EVO2_SHAPES[t]
        return t, int(N), int(K)
    parts = t.split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise click.BadParameter(f"{text!r}: expected one of {sorted(EVO2_SHAPES)} or NxK (e.g. 5760x1920)",
                                 param_hint="--shape")
    N, K = int(parts[0]), int(parts[1])
    if N <= 0 or K <= 0 or N % 16 or K % 16:
        raise click.BadParameter(f"{text!r}: N and K must be positive multiples of 16 (torch._scaled_mm's rule)",
                                 param_hint="--shape")
    return f"{N}x{K}", N, K


def parse_int_list(text: str, hint: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a comma list of integers", param_hint=hint) from None
    if not vals or any(v <= 0 for v in vals):
        raise click.BadParameter(f"{text!r}: expected positive integers", param_hint=hint)
    return vals


def parse_data(text: str) -> list[tuple[str, str]]:
    """Comma list of data labels -> [(label, cpemu.cases data kind)]."""
    out = []
    for label in (x.strip() for x in text.split(",")):
        if not label:
            continue
        kind = DATA_ALIASES.get(label, label)
        if kind not in DATA_KINDS:
            raise click.BadParameter(f"{label!r}: expected gauss40, adversarial or a data kind of cpemu.cases "
                                     f"{DATA_KINDS}", param_hint="--data")
        out.append((label, kind))
    if not out:
        raise click.BadParameter("no data kind given", param_hint="--data")
    return out


def parse_kernels(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise click.BadParameter("no backend given", param_hint="--kernels")
    for n in names:
        if n not in LADDER:
            raise click.BadParameter(f"{n!r}: not a backend of cpemu.backends.LADDER {LADDER}",
                                     param_hint="--kernels")
    return list(dict.fromkeys(names))


def default_kernels() -> tuple[list[str], dict]:
    """What ``--kernels`` means when not given: every available CUDA backend of the ladder
    (not the host backends), and why each other one is not available."""
    from cpemu.backends import available

    kernel_list, why_not = [], {}
    for name in LADDER:
        if host_backend(name):
            continue
        ok, why = available(name)
        (kernel_list.append(name) if ok else why_not.__setitem__(name, why))
    return kernel_list, why_not


def grid_options(m_default: str):
    """The --shape, --M, --data and --profile options of the smaller benchmark tools
    (bench_dropin, bench_tiled_geometry), parsed by parse_shape / parse_int_list / parse_data."""
    opts = [click.option("--shape", "shapes", multiple=True, help="Repeatable: evo2-1b, evo2-7b, evo2-40b or NxK. "
                         "Default: the three Evo 2 shapes."),
            click.option("--M", "m_list", default=m_default, show_default=True, help="Comma list of M"),
            click.option("--data", default="gauss40", show_default=True,
                         help="Comma list: gauss40, adversarial, ..."),
            click.option("--profile", default="hopper-h200-torch", show_default=True)]

    def apply(f):
        for opt in reversed(opts):  # click lists the outermost option first
            f = opt(f)
        return f

    return apply


def parse_grid(shapes, m_text: str, data_text: str, window_s: float, windows: int):
    """The options of :func:`grid_options` (no --shape: :data:`DEFAULT_SHAPES`) and the window
    options of the smaller tools, checked: (shapes, M list, data kinds)."""
    shape_list = [parse_shape(s) for s in (shapes or DEFAULT_SHAPES)]
    ms = parse_int_list(m_text, "--M")
    data_list = parse_data(data_text)
    if windows < 1 or window_s <= 0:
        raise click.BadParameter("--windows >= 1 and --window-s > 0", param_hint="--windows")
    return shape_list, ms, data_list
