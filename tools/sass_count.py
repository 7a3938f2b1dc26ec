"""Count the SASS instructions of a kernel build, per loop and per opcode, without a GPU.

Compiles one module of ``cuda_src/`` with the pinned NVRTC (as tools/build_fatbin.py does, plus
``--define`` macros for measurement builds) for one architecture, disassembles the cubin with
``nvdisasm`` and reads its resource use with ``cuobjdump``, and writes, per kernel:

* ``instructions``: the static count and the count per opcode (the opcode without its modifiers);
* ``loops``: every backward branch's body (its label, the instructions from the label to the
  branch, their opcodes), innermost first: a loop's own count excludes the loops inside it;
* ``local_stores``, ``local_loads``: the static STL and LDL instructions (spills);
* ``registers``, ``stack``, ``shared_bytes``, ``local_bytes``: cuobjdump's resource usage.

    python tools/sass_count.py --module gemm_rzacc_pre --arch sm_90a --out counts.json
    python tools/sass_count.py --module gemm_rzacc_pre --define CPT_PROBE_SKIP=1 --out probe.json

``nvdisasm`` and ``cuobjdump`` come from the PyPI wheels ``nvidia-cuda-nvdisasm`` and
``nvidia-cuda-cuobjdump`` (or a CUDA toolkit): ``--nvdisasm`` / ``--cuobjdump`` or the PATH.
Static counts say what a loop issues per trip, not how often it runs: multiply by the trips.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_fatbin as bf  # noqa: E402

_MACRO = re.compile(r"[A-Z_][A-Z0-9_]*=[0-9A-Za-z_]+")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")
_RES = re.compile(r"Function (\w+):\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def parse_sass(text: str) -> dict:
    """nvdisasm's text -> {kernel: [(offset, label or None, opcode, operands)]}."""
    kernels, cur, pending = {}, None, None
    for line in text.splitlines():
        m = re.match(r"^\s*\.text\.(\w+):", line) or re.match(r"^(\w+):\s*$", line)
        if m and not line.lstrip().startswith(".L_"):
            cur = m.group(1)
            kernels.setdefault(cur, [])
            continue
        m = _LABEL.match(line)
        if m:
            pending = m.group(1)
            continue
        m = _INSN.search(line)
        if m and cur is not None:
            kernels[cur].append((int(m.group(1), 16), pending, m.group(3), m.group(5).strip()))
            pending = None
    return kernels


def loops(insns: list) -> list[dict]:
    """Backward branches: the body from the target label to the branch, innermost first."""
    at = {lab: i for i, (_, lab, _, _) in enumerate(insns) if lab}
    spans = []
    for i, (_, _, op, args) in enumerate(insns):
        if op in ("BRA", "JMP"):
            target = args.split()[-1].strip("`()") if args else ""
            target = re.sub(r"^.*?(\.L_x_\d+).*$", r"\1", target)
            j = at.get(target)
            if j is not None and j <= i:
                spans.append((j, i))
    spans.sort(key=lambda s: s[1] - s[0])
    out, taken = [], set()
    for j, i in spans:
        own = [k for k in range(j, i + 1) if k not in taken]
        taken.update(own)
        ops = Counter(insns[k][2] for k in own)
        out.append({"label": insns[j][1], "first": j, "last": i, "length": i - j + 1, "own": len(own),
                    "opcodes": dict(ops.most_common())})
    return out


def resource_usage(text: str) -> dict:
    out = {}
    for m in _RES.finditer(text):
        out[m.group(1)] = {"registers": int(m.group(2)), "stack": int(m.group(3)), "shared_bytes": int(m.group(4)),
                           "local_bytes": int(m.group(5))}
    return out


def _tool(name: str, given: str | None) -> str:
    path = given or shutil.which(name)
    if not path:
        raise click.ClickException(f"{name} not found: pass --{name} PATH or put it on the PATH "
                                   f"(PyPI: nvidia-cuda-{name})")
    return path


def count(module: str, defines: tuple, arch: str, nvdisasm: str, cuobjdump: str) -> dict:
    src_dir = ROOT / "cuda_src"
    cu = src_dir / f"{module}.cu"
    if not cu.is_file():
        raise click.BadParameter(f"{module!r}: no cuda_src/{module}.cu", param_hint="--module")
    srcs = bf.module_sources(src_dir, cu)
    head = "".join(f"#define {d.split('=')[0]} {d.split('=')[1]}\n" for d in defines).encode()
    headers = {k: v for k, v in srcs.items() if k != cu.name}
    cubin, _ = bf.Toolchain().compile(cu.name, head + srcs[cu.name], headers, arch)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{module}.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([nvdisasm, "-c", str(path)], check=True, capture_output=True, text=True).stdout
        res = subprocess.run([cuobjdump, "-res-usage", str(path)], check=True, capture_output=True, text=True).stdout
    usage = resource_usage(res)
    out = {}
    for name, insns in parse_sass(sass).items():
        if not insns:
            continue
        ops = Counter(op for _, _, op, _ in insns)
        spill_st = sum(1 for _, _, op, _ in insns if op == "STL")
        spill_ld = sum(1 for _, _, op, _ in insns if op == "LDL")
        out[name] = dict(usage.get(name, {}), instructions=len(insns), opcodes=dict(ops.most_common()),
                         local_stores=spill_st, local_loads=spill_ld, loops=loops(insns))
    return out


@click.command()
@click.option("--module", required=True, help="A module of cuda_src/ (its file name without .cu).")
@click.option("--define", "defines", multiple=True, help="NAME=VALUE, repeatable: a measurement build's macros.")
@click.option("--arch", default="sm_90a", show_default=True, type=click.Choice(bf.ARCHS))
@click.option("--kernel", default=None, help="Only this kernel (default: every kernel of the module).")
@click.option("--nvdisasm", default=None, help="nvdisasm to use (default: the PATH's).")
@click.option("--cuobjdump", default=None, help="cuobjdump to use (default: the PATH's).")
@click.option("--out", "out_path", default=None, help="Write the counts as JSON here (default: stdout).")
def main(module, defines, arch, kernel, nvdisasm, cuobjdump, out_path):
    bad = [d for d in defines if not _MACRO.fullmatch(d)]
    if bad:
        raise click.BadParameter(f"macros are NAME=VALUE (NAME in capitals), not {bad}", param_hint="--define")
    counts = count(module, tuple(defines), arch, _tool("nvdisasm", nvdisasm), _tool("cuobjdump", cuobjdump))
    if kernel is not None:
        if kernel not in counts:
            raise click.BadParameter(f"{kernel!r} is not a kernel of {module} ({', '.join(counts)})",
                                     param_hint="--kernel")
        counts = {kernel: counts[kernel]}
    doc = {"module": module, "defines": list(defines), "arch": arch, "kernels": counts,
           "tool": "tools/sass_count.py"}
    text = json.dumps(doc, indent=1)
    if out_path:
        Path(out_path).write_text(text + "\n")
    else:
        click.echo(text)
    for name, k in counts.items():
        click.echo(f"{name}: {k['instructions']} instructions, {k.get('registers', '?')} registers, "
                   f"{k['local_stores']} local stores; loops (own instructions): "
                   + ", ".join(str(lp["own"]) for lp in k["loops"][:8]), err=True)


if __name__ == "__main__":
    main()
