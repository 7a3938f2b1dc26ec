"""Build cpemu's CUDA kernels offline into SASS-only fatbins, byte-reproducibly.

    python tools/build_fatbin.py            # cuda_src/*.cu -> bin/<module>.fatbin, bin/manifest.json,
                                            # cpemu/cuda/_pinned.py
    python tools/build_fatbin.py --check    # rebuild into a temporary folder; fail unless the
                                            # committed files are byte-identical

Each ``cuda_src/<module>.cu`` is compiled by NVRTC to a cubin (SASS) for every architecture
of ``ARCHS`` and the cubins are packed by nvFatbin into ``bin/<module>.fatbin``. No PTX is
shipped: PTX made by a toolkit newer than the user's driver fails to load, while a cubin made
by CUDA 12.x loads on any 12.x or 13.x driver.

The toolchain is pinned and comes from PyPI (``pip install -e '.[test]'`` installs it):
NVRTC from ``nvidia-cuda-nvrtc-cu12`` and nvFatbin from ``nvidia-nvfatbin-cu12``, both
12.9, called through ctypes; no system CUDA toolkit is used. Sources are compiled from
memory under a fixed program name (the file's name, never its path), with a fixed flag
list, so the output depends only on the sources, the flags and the toolchain.

Kernels are ``extern "C" __global__ void NAME(...)`` functions; a module includes no
system header. A module may ``#include "x.cuh"`` a header of the source folder: headers
are handed to NVRTC from memory and their sha256 is recorded with the module's sources.

``bin/manifest.json`` records, per module, the fatbin's and sources' sha256, the
architectures and the sha256 of each cubin, the kernel names, the toolchain with its
versions and the flags; ``schemas/manifest.schema.json`` validates it. The sha256 of the
manifest is pinned in ``cpemu/cuda/_pinned.py``; ``cpemu.cuda.loader`` refuses anything
that does not match. Every file is written atomically (temporary file + os.replace).
"""

from __future__ import annotations

import ctypes
import difflib
import hashlib
import importlib.metadata
import json
import os
import re
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import jsonschema

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cpemu.cuda.loader import MANIFEST_NAME, fatbin_entries, parse_arch  # noqa: E402

#: SASS targets, in build order. sm_90a: Hopper's architecture-specific instructions (wgmma).
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_120")

#: NVRTC flags, the same for every module; --gpu-architecture=<arch> is appended per target.
#: --fmad=false: no silent a*b+c -> fma contraction, so every float operation rounds as
#: written (a kernel asks for a fused multiply-add explicitly with __fmaf_rn); the IEEE
#: defaults (no flush to zero, correctly rounded division and square root) are spelt out so
#: that a change of NVRTC's defaults cannot change the bits. No -G, no -lineinfo.
NVRTC_FLAGS = ("-std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")
NVRTC_ARCH_FLAG = "--gpu-architecture={arch}"

#: nvFatbin options: 64-bit, Linux host, and no compression (images stay plain ELF, which
#: every 12.x/13.x driver reads).
NVFATBIN_OPTIONS = ("-64", "-host=linux", "-compress=false")

#: The pinned toolchain: (PyPI distribution, required major.minor, library inside the wheel).
TOOLCHAIN = {
    "nvrtc": ("nvidia-cuda-nvrtc-cu12", (12, 9), "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"),
    "nvfatbin": ("nvidia-nvfatbin-cu12", (12, 9), "nvidia/nvfatbin/lib/libnvfatbin.so.12"),
}

KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?'
                       r'([A-Za-z_]\w*)\s*\(')
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HEADER_SUFFIXES = (".cuh", ".h", ".hpp")

PINNED_TEMPLATE = '''"""sha256 of bin/manifest.json (packaged as cpemu/bin/manifest.json).

Written by tools/build_fatbin.py together with the manifest; do not edit by hand.
cpemu.cuda.loader refuses a manifest whose sha256 differs, and the manifest pins the
sha256 of every fatbin.
"""

MANIFEST_SHA256 = "{sha}"
'''


class BuildError(click.ClickException):
    """A clear, non-zero failure of the build or of --check."""


# ---------------------------------------------------------------- the toolchain


def _locate(dist: str, relpath: str) -> tuple[Path, str]:
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"the pinned toolchain is not installed: {dist} is missing "
                         f"(pip install -e '.[test]' installs {TOOLCHAIN_PINS})") from None
    for f in d.files or ():
        if str(f).replace("\\", "/") == relpath:
            return Path(str(d.locate_file(f))), d.version
    raise BuildError(f"{dist} {d.version} has no {relpath}")


TOOLCHAIN_PINS = " and ".join(f"{d} {v[0]}.{v[1]}" for d, v, _ in TOOLCHAIN.values())


class Toolchain:
    """NVRTC and nvFatbin from their PyPI wheels, through ctypes."""

    def __init__(self):
        nvrtc_path, nvrtc_wheel = _locate(TOOLCHAIN["nvrtc"][0], TOOLCHAIN["nvrtc"][2])
        fatbin_path, fatbin_wheel = _locate(TOOLCHAIN["nvfatbin"][0], TOOLCHAIN["nvfatbin"][2])
        try:
            self.nvrtc = ctypes.CDLL(str(nvrtc_path))
            self.fb = ctypes.CDLL(str(fatbin_path))
        except OSError as e:
            raise BuildError(f"cannot load the toolchain's libraries: {e}") from None
        self._declare()
        maj, mi = ctypes.c_int(), ctypes.c_int()
        self._rc(self.nvrtc.nvrtcVersion(ctypes.byref(maj), ctypes.byref(mi)), "nvrtcVersion")
        fmaj, fmi = ctypes.c_uint(), ctypes.c_uint()
        self._fb(self.fb.nvFatbinVersion(ctypes.byref(fmaj), ctypes.byref(fmi)), "nvFatbinVersion")
        self.versions = {"nvrtc": (maj.value, mi.value), "nvfatbin": (fmaj.value, fmi.value)}
        self.wheels = {"nvrtc": nvrtc_wheel, "nvfatbin": fatbin_wheel}
        for key, (dist, want, _) in TOOLCHAIN.items():
            if self.versions[key] != want:
                raise BuildError(f"{dist} reports {key} version {self.versions[key][0]}.{self.versions[key][1]}, "
                                 f"the build is pinned to {want[0]}.{want[1]}")
            if not self.wheels[key].startswith(f"{want[0]}.{want[1]}."):
                raise BuildError(f"{dist} {self.wheels[key]} installed, the build is pinned to "
                                 f"{want[0]}.{want[1]}.*")

    def _declare(self):
        c = ctypes
        n, f = self.nvrtc, self.fb
        n.nvrtcGetErrorString.restype = c.c_char_p
        n.nvrtcCreateProgram.argtypes = [c.POINTER(c.c_void_p), c.c_char_p, c.c_char_p, c.c_int,
                                         c.POINTER(c.c_char_p), c.POINTER(c.c_char_p)]
        n.nvrtcCompileProgram.argtypes = [c.c_void_p, c.c_int, c.POINTER(c.c_char_p)]
        n.nvrtcGetProgramLogSize.argtypes = [c.c_void_p, c.POINTER(c.c_size_t)]
        n.nvrtcGetProgramLog.argtypes = [c.c_void_p, c.c_char_p]
        n.nvrtcGetCUBINSize.argtypes = [c.c_void_p, c.POINTER(c.c_size_t)]
        n.nvrtcGetCUBIN.argtypes = [c.c_void_p, c.c_char_p]
        n.nvrtcDestroyProgram.argtypes = [c.POINTER(c.c_void_p)]
        f.nvFatbinGetErrorString.restype = c.c_char_p
        f.nvFatbinCreate.argtypes = [c.POINTER(c.c_void_p), c.POINTER(c.c_char_p), c.c_size_t]
        f.nvFatbinAddCubin.argtypes = [c.c_void_p, c.c_void_p, c.c_size_t, c.c_char_p, c.c_char_p]
        f.nvFatbinSize.argtypes = [c.c_void_p, c.POINTER(c.c_size_t)]
        f.nvFatbinGet.argtypes = [c.c_void_p, c.c_void_p]
        f.nvFatbinDestroy.argtypes = [c.POINTER(c.c_void_p)]

    def _rc(self, rc, what, log=""):
        if rc != 0:
            msg = self.nvrtc.nvrtcGetErrorString(rc).decode()
            raise BuildError(f"{what} failed: {msg}" + (f"\n{log}" if log else ""))

    def _fb(self, rc, what):
        if rc != 0:
            raise BuildError(f"{what} failed: {self.fb.nvFatbinGetErrorString(rc).decode()}")

    def manifest_entry(self) -> dict:
        return {key: {"package": dist, "package_version": self.wheels[key],
                      "version": f"{self.versions[key][0]}.{self.versions[key][1]}"}
                for key, (dist, _, _) in TOOLCHAIN.items()}

    def compile(self, name: str, source: bytes, headers: dict[str, bytes], arch: str) -> tuple[bytes, str]:
        """NVRTC: one source (program name ``name``) to a cubin for ``arch``; returns (cubin, log)."""
        c = ctypes
        prog = c.c_void_p()
        hnames = sorted(headers)
        hsrc = (c.c_char_p * max(1, len(hnames)))(*[headers[h] for h in hnames])
        hinc = (c.c_char_p * max(1, len(hnames)))(*[h.encode() for h in hnames])
        self._rc(self.nvrtc.nvrtcCreateProgram(c.byref(prog), source, name.encode(), len(hnames), hsrc, hinc),
                 f"nvrtcCreateProgram({name})")
        try:
            opts = [o.encode() for o in NVRTC_FLAGS + (NVRTC_ARCH_FLAG.format(arch=arch),)]
            rc = self.nvrtc.nvrtcCompileProgram(prog, len(opts), (c.c_char_p * len(opts))(*opts))
            size = c.c_size_t()
            self.nvrtc.nvrtcGetProgramLogSize(prog, c.byref(size))
            buf = c.create_string_buffer(size.value)
            self.nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace").strip()
            self._rc(rc, f"NVRTC compiling {name} for {arch}", log)
            self._rc(self.nvrtc.nvrtcGetCUBINSize(prog, c.byref(size)), f"nvrtcGetCUBINSize({name}, {arch})")
            cubin = c.create_string_buffer(size.value)
            self._rc(self.nvrtc.nvrtcGetCUBIN(prog, cubin), f"nvrtcGetCUBIN({name}, {arch})")
            return cubin.raw, log
        finally:
            self.nvrtc.nvrtcDestroyProgram(c.byref(prog))

    def fatbin(self, identifier: str, cubins: list[tuple[str, bytes]]) -> bytes:
        """nvFatbin: the cubins (in the given order) into one fatbin."""
        c = ctypes
        handle = c.c_void_p()
        opts = [o.encode() for o in NVFATBIN_OPTIONS]
        self._fb(self.fb.nvFatbinCreate(c.byref(handle), (c.c_char_p * len(opts))(*opts), len(opts)),
                 "nvFatbinCreate")
        try:
            for arch, cubin in cubins:
                num = arch[len("sm_"):]  # nvFatbin takes the XX of sm_XX ("90a" for sm_90a)
                self._fb(self.fb.nvFatbinAddCubin(handle, cubin, len(cubin), num.encode(), identifier.encode()),
                         f"nvFatbinAddCubin({identifier}, {arch})")
            size = c.c_size_t()
            self._fb(self.fb.nvFatbinSize(handle, c.byref(size)), "nvFatbinSize")
            out = c.create_string_buffer(size.value)
            self._fb(self.fb.nvFatbinGet(handle, out), "nvFatbinGet")
            return out.raw
        finally:
            self.fb.nvFatbinDestroy(c.byref(handle))


# ---------------------------------------------------------------- sources


def strip_comments(text: str) -> str:
    """C/C++ source without comments (string literals kept), for the kernel and include scans."""
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            out.append(" ")
            i = n if j < 0 else j + 2
        elif ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


#: a line ``// not shipped: NAME`` marks the kernel NAME as one of a measurement build only (its
#: definition is inside ``#if`` of a macro the shipped build leaves 0): it is not in the fatbin
NOT_SHIPPED_RE = re.compile(r"^\s*//\s*not shipped:\s*([A-Za-z_][A-Za-z0-9_]*)\s*$", re.M)


def kernel_names(text: str) -> list[str]:
    """The ``extern "C" __global__ void NAME(`` kernels of a source, in source order (without those
    marked ``// not shipped: NAME``)."""
    names = KERNEL_RE.findall(strip_comments(text))
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BuildError(f"kernel(s) declared more than once: {dup}")
    skip = set(NOT_SHIPPED_RE.findall(text))
    if skip - set(names):
        raise BuildError(f"'not shipped' names no kernel of the source: {sorted(skip - set(names))}")
    return [n for n in names if n not in skip]


def module_sources(src_dir: Path, cu: Path) -> dict[str, bytes]:
    """The module's source and the local headers it includes (transitively), name -> bytes."""
    found, todo = {}, [cu.name]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = src_dir / name
        if not path.is_file():
            raise BuildError(f"{cu.name}: includes \"{name}\", which is not a file of the source folder")
        data = path.read_bytes()
        found[name] = data
        for kind, inc in INCLUDE_RE.findall(strip_comments(data.decode("utf-8"))):
            if kind == "<":
                continue  # NVRTC's built-in headers only; a system header fails in NVRTC itself
            if "/" in inc or "\\" in inc or not inc.endswith(HEADER_SUFFIXES):
                raise BuildError(f"{name}: #include \"{inc}\": only headers ({', '.join(HEADER_SUFFIXES)}) "
                                 f"of the source folder itself are allowed")
            todo.append(inc)
    return dict(sorted(found.items()))


def _elf_sections(cubin: bytes) -> set[str]:
    """Section names of a 64-bit little-endian ELF (a cubin)."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    strtab_off = struct.unpack_from("<Q", cubin, shoff + shstrndx * shentsize + 0x18)[0]
    names = set()
    for i in range(shnum):
        name_off = struct.unpack_from("<I", cubin, shoff + i * shentsize)[0]
        end = cubin.index(b"\0", strtab_off + name_off)
        names.add(cubin[strtab_off + name_off:end].decode())
    return names


# ---------------------------------------------------------------- the build


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def render_json(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def build(src_dir: Path, jobs: int = 0, log=print) -> tuple[dict, dict[str, bytes], dict]:
    """Compile every ``src_dir/*.cu``; returns (manifest, {fatbin name: bytes}, stats)."""
    if not src_dir.is_dir():
        raise BuildError(f"source folder {src_dir} does not exist")
    for a in ARCHS:
        parse_arch(a)
    tc = Toolchain()
    units = sorted(src_dir.glob("*.cu"))
    modules, tasks = {}, []
    for cu in units:
        name = cu.stem
        if not MODULE_RE.match(name):
            raise BuildError(f"{cu.name}: a module's name must be a C identifier ([A-Za-z_][A-Za-z0-9_]*)")
        sources = module_sources(src_dir, cu)
        kernels = kernel_names("\n".join(v.decode("utf-8") for v in sources.values()))
        if not kernels:
            raise BuildError(f"{cu.name}: no extern \"C\" __global__ void NAME( kernel found")
        headers = {k: v for k, v in sources.items() if k != cu.name}
        modules[name] = {"cu": cu.name, "sources": sources, "headers": headers, "kernels": kernels}
        tasks += [(name, arch) for arch in ARCHS]

    def one(task):
        name, arch = task
        m = modules[name]
        t0 = time.perf_counter()
        cubin, clog = tc.compile(m["cu"], m["sources"][m["cu"]], m["headers"], arch)
        return task, cubin, clog, time.perf_counter() - t0

    t0 = time.perf_counter()
    workers = jobs or min(len(tasks), os.cpu_count() or 1) or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = {task: (cubin, clog, dt) for task, cubin, clog, dt in pool.map(one, tasks)}
    compile_s = time.perf_counter() - t0

    toolchain = tc.manifest_entry()
    flags = {"nvrtc": list(NVRTC_FLAGS), "nvrtc_arch": NVRTC_ARCH_FLAG, "nvfatbin": list(NVFATBIN_OPTIONS)}
    out_modules, fatbins, stats = {}, {}, {"compile_s": compile_s, "modules": {}}
    for name, m in modules.items():
        cubins = []
        for arch in ARCHS:
            cubin, clog, dt = results[(name, arch)]
            if clog:
                log(f"{m['cu']} [{arch}] NVRTC log:\n{clog}")
            sections = _elf_sections(cubin)
            missing = [k for k in m["kernels"] if f".text.{k}" not in sections]
            if missing:
                raise BuildError(f"{m['cu']}: kernel(s) {missing} parsed from the source are not in the {arch} "
                                 f"cubin (inside #if 0, or not extern \"C\"?)")
            cubins.append((arch, cubin))
        fat = tc.fatbin(name, cubins)
        images = fatbin_entries(fat)
        want = sorted(parse_arch(a)[0] * 10 + parse_arch(a)[1] for a in ARCHS)
        if any(i["kind"] != "sass" for i in images) or sorted(i["sm"] for i in images) != want:
            raise BuildError(f"{name}.fatbin: images {images} are not SASS for exactly {list(ARCHS)}")
        fname = f"{name}.fatbin"
        fatbins[fname] = fat
        out_modules[name] = {
            "fatbin": fname,
            "sha256": sha256(fat),
            "size": len(fat),
            "sources": {k: sha256(v) for k, v in m["sources"].items()},
            "architectures": list(ARCHS),
            "cubins": {arch: {"sha256": sha256(cb), "size": len(cb)} for arch, cb in cubins},
            "kernels": m["kernels"],
            "toolchain": toolchain,
            "flags": flags,
        }
        stats["modules"][name] = {"fatbin_bytes": len(fat), "cubin_bytes": {a: len(cb) for a, cb in cubins},
                                  "compile_s": {a: results[(name, a)][2] for a in ARCHS}}
    manifest = {
        "schema_version": 1,
        "generator": "tools/build_fatbin.py",
        "architectures": list(ARCHS),
        "toolchain": toolchain,
        "flags": flags,
        "modules": out_modules,
    }
    jsonschema.validate(manifest, json.loads((ROOT / "schemas" / "manifest.schema.json").read_text()))
    return manifest, fatbins, stats


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_outputs(out_dir: Path, pinned: Path, manifest: dict, fatbins: dict[str, bytes]) -> str:
    """Write the fatbins, then the manifest, then the pinned hash; remove stale fatbins."""
    for fname, data in fatbins.items():
        write_atomic(out_dir / fname, data)
    mbytes = render_json(manifest)
    write_atomic(out_dir / MANIFEST_NAME, mbytes)
    msha = sha256(mbytes)
    write_atomic(pinned, PINNED_TEMPLATE.format(sha=msha).encode())
    for stale in sorted(out_dir.glob("*.fatbin")):
        if stale.name not in fatbins:
            stale.unlink()
    return msha


def _json_diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            p = f"{path}.{k}" if path else k
            if k not in a:
                out.append(f"{p}: only in the rebuilt manifest")
            elif k not in b:
                out.append(f"{p}: only in the committed manifest")
            else:
                out += _json_diff(a[k], b[k], p)
        return out
    return [] if a == b else [f"{path}: committed {json.dumps(a)[:120]}, rebuilt {json.dumps(b)[:120]}"]


def check(out_dir: Path, pinned: Path, built_dir: Path, built_pinned: Path, manifest: dict) -> list[str]:
    """Differences between the committed files and a fresh build (empty list: all identical)."""
    problems = []
    for fname in sorted(manifest_files(manifest)):
        new = (built_dir / fname).read_bytes()
        old_path = out_dir / fname
        if not old_path.is_file():
            problems.append(f"{old_path}: missing (the rebuilt fatbin has sha256 {sha256(new)})")
        elif old_path.read_bytes() != new:
            problems.append(f"{old_path}: sha256 {sha256(old_path.read_bytes())} is not the rebuilt "
                            f"{sha256(new)} (the fatbin is not byte-identical to a fresh build)")
    for extra in sorted(out_dir.glob("*.fatbin")):
        if extra.name not in manifest_files(manifest):
            problems.append(f"{extra}: not produced by the build (no cuda_src module); remove it")
    old_m, new_m = out_dir / MANIFEST_NAME, (built_dir / MANIFEST_NAME).read_bytes()
    if not old_m.is_file():
        problems.append(f"{old_m}: missing")
    elif old_m.read_bytes() != new_m:
        detail = []
        try:
            detail = _json_diff(json.loads(old_m.read_bytes()), json.loads(new_m))
        except ValueError:
            detail = ["the committed manifest is not valid JSON"]
        if not detail:
            detail = ["same content, different formatting"]
        problems.append(f"{old_m}: not current:\n    " + "\n    ".join(detail[:20]))
    new_p = built_pinned.read_bytes()
    if not pinned.is_file():
        problems.append(f"{pinned}: missing")
    elif pinned.read_bytes() != new_p:
        diff = "".join(difflib.unified_diff(pinned.read_text().splitlines(True), new_p.decode().splitlines(True),
                                            "committed", "rebuilt", n=0))
        problems.append(f"{pinned}: not current (MANIFEST_SHA256 must be the rebuilt manifest's sha256):\n{diff}")
    return problems


def manifest_files(manifest: dict) -> set[str]:
    return {m["fatbin"] for m in manifest["modules"].values()}


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


@click.command()
@click.option("--src", "src_dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / "cuda_src",
              show_default=True, help="folder of the <module>.cu sources")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / "bin",
              show_default=True, help="folder of the fatbins and manifest.json")
@click.option("--pinned", type=click.Path(dir_okay=False, path_type=Path),
              default=ROOT / "cpemu" / "cuda" / "_pinned.py", show_default=True,
              help="Python file that pins the manifest's sha256")
@click.option("--check", "check_only", is_flag=True,
              help="rebuild into a temporary folder and fail unless the files in --out and --pinned are "
                   "byte-identical to it")
@click.option("--jobs", "-j", type=int, default=0, help="parallel NVRTC compilations (default: CPU count)")
def main(src_dir: Path, out_dir: Path, pinned: Path, check_only: bool, jobs: int):
    """Compile cuda_src/*.cu to SASS-only fatbins (sm_80, sm_86, sm_89, sm_90a, sm_120) reproducibly."""
    t0 = time.perf_counter()
    manifest, fatbins, stats = build(src_dir, jobs, log=lambda s: click.echo(s, err=True))
    tc = manifest["toolchain"]
    click.echo(f"toolchain: NVRTC {tc['nvrtc']['version']} ({tc['nvrtc']['package']} "
               f"{tc['nvrtc']['package_version']}), nvFatbin {tc['nvfatbin']['version']} "
               f"({tc['nvfatbin']['package']} {tc['nvfatbin']['package_version']})")
    if not manifest["modules"]:
        click.echo(f"warning: no *.cu module in {_rel(src_dir)}; the manifest lists no module", err=True)
    for name, st in stats["modules"].items():
        click.echo(f"  {name}.fatbin  {st['fatbin_bytes']} bytes  sha256 {manifest['modules'][name]['sha256']}  "
                   f"kernels {manifest['modules'][name]['kernels']}")
    if check_only:
        with tempfile.TemporaryDirectory(prefix="cpemu-fatbin-check-") as tmp:
            tmp = Path(tmp)
            write_outputs(tmp / "bin", tmp / "_pinned.py", manifest, fatbins)
            problems = check(out_dir, pinned, tmp / "bin", tmp / "_pinned.py", manifest)
        if problems:
            raise BuildError("build_fatbin --check FAILED: the committed fatbins/manifest are not what the "
                             "sources and the pinned toolchain build:\n  - " + "\n  - ".join(problems) +
                             "\nRebuild with: python tools/build_fatbin.py (then commit bin/ and "
                             "cpemu/cuda/_pinned.py)")
        click.echo(f"check OK: {len(fatbins)} fatbin(s), {_rel(out_dir / MANIFEST_NAME)} and {_rel(pinned)} are "
                   f"byte-identical to a fresh build ({time.perf_counter() - t0:.1f} s)")
        return
    msha = write_outputs(out_dir, pinned, manifest, fatbins)
    click.echo(f"wrote {len(fatbins)} fatbin(s) and {_rel(out_dir / MANIFEST_NAME)} (sha256 {msha}), pinned in "
               f"{_rel(pinned)}; {time.perf_counter() - t0:.1f} s (NVRTC {stats['compile_s']:.1f} s)")


if __name__ == "__main__":
    main()
