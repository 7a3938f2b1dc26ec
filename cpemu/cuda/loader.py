"""Load cpemu's prebuilt CUDA kernels (``bin/<module>.fatbin``) safely.

The fatbins are built offline by ``tools/build_fatbin.py`` (SASS only, no PTX) and
shipped in the package as ``cpemu.bin``. Before a fatbin is handed to the CUDA driver:

1. the sha256 of ``manifest.json`` must equal ``MANIFEST_SHA256`` pinned in
   ``cpemu/cuda/_pinned.py`` (written by the same build), and the manifest must validate
   against ``schemas/manifest.schema.json``;
2. the sha256 (and size) of the fatbin must equal the manifest's entry for the module;
3. the GPU's architecture must be able to run one of the SASS architectures in the
   fatbin (:func:`arch_compatible`).

A module that fails any rule is refused with :class:`FatbinError`;
:func:`module_status` says why without raising. cupy is imported only when a module is
actually checked against a GPU or loaded, so this file imports without cupy.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
from importlib import resources
from pathlib import Path

import jsonschema

__all__ = ["FatbinError", "arch_compatible", "compatible_archs", "parse_arch", "device_arch", "bin_dir", "load_manifest",
           "verify_manifest_bytes", "verify_fatbin", "verify_fatbin_bytes", "fatbin_entries", "modules",
           "module_status", "get_module", "get_function", "clear_cache"]

MANIFEST_NAME = "manifest.json"
_ARCH_RE = re.compile(r"^sm_(\d+)(\d)([af]?)$")
_FATBIN_MAGIC = 0xBA55ED50
_CUPY_HINT = "pip install 'cpemu[cuda12]' or 'cpemu[cuda13]'"


class FatbinError(ValueError):
    """A fatbin or its manifest cannot be used: missing, tampered, or not for this GPU."""


# ---------------------------------------------------------------- architectures


def parse_arch(arch: str) -> tuple[int, int, str]:
    """``"sm_90a"`` -> ``(9, 0, "a")``; ``"sm_120"`` -> ``(12, 0, "")``."""
    m = _ARCH_RE.match(arch)
    if not m:
        raise FatbinError(f"architecture {arch!r}: expected sm_<major><minor> with an optional 'a' or 'f' suffix")
    return int(m.group(1)), int(m.group(2)), m.group(3)


def arch_compatible(binary_arch: str, device: str | tuple[int, int]) -> bool:
    """Whether SASS built for ``binary_arch`` runs on a device of compute capability ``device``.

    The cubin compatibility rule of the CUDA programming guide: SASS for ``sm_XY`` runs on
    devices of the same major version X with minor version >= Y (sm_80 SASS runs on sm_80,
    sm_86, sm_87 and sm_89, never on sm_90 or sm_120); family-specific ``sm_XYf`` follows
    the same rule; architecture-specific ``sm_XYa`` (sm_90a: wgmma, setmaxnreg) runs on
    exactly X.Y and nothing else. ``device`` is ``(major, minor)`` or ``"sm_XY"``.
    """
    bmaj, bmin, suffix = parse_arch(binary_arch)
    if isinstance(device, str):
        dmaj, dmin, dsuffix = parse_arch(device)
        if dsuffix:
            raise FatbinError(f"device architecture {device!r}: a device is a plain sm_XY")
    else:
        dmaj, dmin = (int(x) for x in device)
    if suffix == "a":
        return (bmaj, bmin) == (dmaj, dmin)
    return bmaj == dmaj and dmin >= bmin


def compatible_archs(archs, device) -> list[str]:
    """The architectures of ``archs`` that run on ``device``, best (newest) first."""
    ok = [a for a in archs if arch_compatible(a, device)]
    return sorted(ok, key=lambda a: (parse_arch(a)[:2], parse_arch(a)[2] == "a"), reverse=True)


# ---------------------------------------------------------------- files and hashes


def bin_dir() -> Path:
    """The folder of the packaged fatbins (``cpemu/bin`` when installed; ``bin/`` in a checkout)."""
    try:
        return Path(str(resources.files("cpemu.bin")))
    except ModuleNotFoundError:
        # A source checkout whose installed metadata predates the cpemu.bin package.
        return Path(__file__).resolve().parents[2] / "bin"


def _pinned_default() -> str:
    from ._pinned import MANIFEST_SHA256

    return MANIFEST_SHA256


def _schema() -> dict:
    try:
        from ..profile import load_schema

        return load_schema("manifest")
    except ModuleNotFoundError:  # a source checkout that is not installed: no cpemu.schemas package
        return json.loads((Path(__file__).resolve().parents[2] / "schemas" / "manifest.schema.json").read_text())


def verify_manifest_bytes(data: bytes, pinned: str, where: str = MANIFEST_NAME, schema: dict | None = None) -> dict:
    """Check a manifest's bytes against the pinned sha256 and the schema; return it parsed."""
    got = hashlib.sha256(data).hexdigest()
    if got != pinned:
        raise FatbinError(
            f"{where}: sha256 {got} differs from MANIFEST_SHA256 {pinned} pinned in cpemu/cuda/_pinned.py "
            f"(rule: the manifest must be exactly the one built with this package by tools/build_fatbin.py; "
            f"refusing every fatbin it lists)")
    try:
        manifest = json.loads(data)
    except ValueError as e:
        raise FatbinError(f"{where}: not valid JSON ({e})") from None
    try:
        jsonschema.validate(manifest, schema if schema is not None else _schema())
    except jsonschema.ValidationError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "(top)"
        raise FatbinError(f"{where}: does not validate against manifest.schema.json at {path}: {e.message}") from None
    return manifest


def load_manifest(directory: str | Path | None = None, pinned: str | None = None) -> dict:
    """Read, pin-check and validate ``manifest.json`` of ``directory`` (default: the package's)."""
    directory = Path(directory) if directory is not None else bin_dir()
    path = directory / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FatbinError(f"{path}: missing file (rule: the package ships bin/manifest.json; "
                          f"build it with tools/build_fatbin.py)") from None
    return verify_manifest_bytes(data, pinned if pinned is not None else _pinned_default(), str(path))


def modules(directory: str | Path | None = None, pinned: str | None = None) -> list[str]:
    """Names of the modules the (verified) manifest lists."""
    return sorted(load_manifest(directory, pinned)["modules"])


def _entry(manifest: dict, module: str, where: str) -> dict:
    entry = manifest["modules"].get(module)
    if entry is None:
        raise FatbinError(f"{where}: module {module!r} is not in the manifest "
                          f"(modules: {sorted(manifest['modules'])})")
    return entry


def verify_fatbin_bytes(module: str, entry: dict, data: bytes, where: str) -> None:
    """Check one fatbin's bytes against its manifest entry (sha256, size, SASS only)."""
    got = hashlib.sha256(data).hexdigest()
    if got != entry["sha256"]:
        raise FatbinError(f"{where}: sha256 {got} differs from the manifest's {entry['sha256']} for module "
                          f"{module!r} (rule: a fatbin is used only if its sha256 matches the pinned manifest)")
    if len(data) != entry["size"]:  # cannot happen with a matching sha256; kept as a plain check
        raise FatbinError(f"{where}: {len(data)} bytes, manifest says {entry['size']}")


def verify_fatbin(module: str, directory: str | Path | None = None, pinned: str | None = None,
                  manifest: dict | None = None) -> Path:
    """Verify the manifest (unless given, already verified) and the module's fatbin; return its path."""
    directory = Path(directory) if directory is not None else bin_dir()
    if manifest is None:
        manifest = load_manifest(directory, pinned)
    entry = _entry(manifest, module, str(directory / MANIFEST_NAME))
    path = directory / entry["fatbin"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FatbinError(f"{path}: missing file (rule: every module of the manifest ships its fatbin)") from None
    verify_fatbin_bytes(module, entry, data, str(path))
    return path


def fatbin_entries(data: bytes) -> list[dict]:
    """The images in a fatbin: ``[{"kind": "sass"|"ptx"|..., "sm": 90}, ...]``.

    Reads the fatbin container header (magic 0xBA55ED50, 16 bytes) and each image header
    (kind at offset 0, header size at 4, padded payload size at 8, SM version at 28).
    """
    if len(data) < 16:
        raise FatbinError("fatbin: shorter than its 16-byte header")
    magic, _version, hsize, fsize = struct.unpack_from("<IHHQ", data, 0)
    if magic != _FATBIN_MAGIC:
        raise FatbinError(f"fatbin: bad magic {magic:#x} (expected {_FATBIN_MAGIC:#x})")
    if hsize + fsize > len(data):
        raise FatbinError("fatbin: truncated")
    out, off, end = [], hsize, hsize + fsize
    while off < end:
        if off + 32 > end:
            raise FatbinError("fatbin: truncated image header")
        kind, _v, ehs, padded = struct.unpack_from("<HHII", data, off)
        sm = struct.unpack_from("<I", data, off + 28)[0]
        out.append({"kind": {1: "ptx", 2: "sass"}.get(kind, f"kind{kind}"), "sm": sm})
        if ehs == 0:
            raise FatbinError("fatbin: image header of size 0")
        off += ehs + padded
    return out


# ---------------------------------------------------------------- the GPU side


def _cupy():
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install
        raise FatbinError(f"cupy is not available ({type(e).__name__}: {e}); {_CUPY_HINT}") from None
    return cupy


def device_arch(device: int | None = None) -> tuple[int, int, str]:
    """``(major, minor, name)`` of a CUDA device (the current one by default), through cupy."""
    cupy = _cupy()
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise FatbinError(f"no usable CUDA device: {type(e).__name__}: {e}") from None
    if n == 0:
        raise FatbinError("no CUDA device: cupy sees 0 devices")
    dev = cupy.cuda.Device(device) if device is not None else cupy.cuda.Device()
    if dev.id >= n:
        raise FatbinError(f"CUDA device {dev.id} does not exist ({n} device(s))")
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return int(props["major"]), int(props["minor"]), name


def _check(module: str, device: int | None, directory, pinned) -> tuple[Path, dict, list[str], int]:
    """All rules for one module on one device; returns (path, entry, runnable archs, device id)."""
    directory = Path(directory) if directory is not None else bin_dir()
    manifest = load_manifest(directory, pinned)
    path = verify_fatbin(module, directory, manifest=manifest)
    entry = manifest["modules"][module]
    major, minor, name = device_arch(device)
    ok = compatible_archs(entry["architectures"], (major, minor))
    if not ok:
        raise FatbinError(
            f"{path}: this GPU ({name}) is sm_{major}{minor}, and none of the fatbin's architectures "
            f"{entry['architectures']} runs on it (rule: SASS for sm_XY runs on sm_XZ with Z >= Y of the same "
            f"major; sm_XYa only on sm_XY)")
    cupy = _cupy()
    dev_id = cupy.cuda.Device(device).id if device is not None else cupy.cuda.Device().id
    return path, entry, ok, dev_id


def module_status(name: str, device: int | None = None, directory: str | Path | None = None,
                  pinned: str | None = None) -> tuple[bool, str]:
    """``(True, detail)`` if module ``name`` can be loaded on ``device``, else ``(False, reason)``.

    Never raises: the reason names the rule that fails (missing file, sha256 mismatch with
    the manifest or the pinned manifest hash, no cupy, no GPU, architecture not in the
    fatbin).
    """
    try:
        path, _entry_, ok, dev_id = _check(name, device, directory, pinned)
    except FatbinError as e:
        return False, str(e)
    except Exception as e:  # anything unexpected is still a reason, never a crash
        return False, f"{type(e).__name__}: {e}"
    return True, f"{path.name}: SASS for {ok[0]} runs on device {dev_id}"


_cache: dict[tuple[int, str, str], object] = {}
_lock = threading.Lock()


def get_module(name: str, device: int | None = None, directory: str | Path | None = None,
               pinned: str | None = None):
    """The ``cupy.RawModule`` of module ``name`` on ``device``, verified and loaded once per device."""
    directory = Path(directory) if directory is not None else bin_dir()
    cupy = _cupy()
    dev_id = cupy.cuda.Device(device).id if device is not None else cupy.cuda.Device().id
    key = (dev_id, str(directory.resolve()), name)
    mod = _cache.get(key)
    if mod is not None:
        return mod
    with _lock:
        mod = _cache.get(key)
        if mod is None:
            path, _entry_, _ok, _ = _check(name, dev_id, directory, pinned)
            try:
                with cupy.cuda.Device(dev_id):
                    mod = cupy.RawModule(path=str(path))
            except Exception as e:
                raise FatbinError(f"{path}: the CUDA driver refused it on device {dev_id}: "
                                  f"{type(e).__name__}: {e}") from None
            _cache[key] = mod
    return mod


def get_function(module: str, kernel: str, device: int | None = None, directory: str | Path | None = None,
                 pinned: str | None = None):
    """The ``cupy.RawKernel`` ``kernel`` of ``module`` (see :func:`get_module`)."""
    directory = Path(directory) if directory is not None else bin_dir()
    manifest = load_manifest(directory, pinned)
    entry = _entry(manifest, module, str(directory / MANIFEST_NAME))
    if kernel not in entry["kernels"]:
        raise FatbinError(f"{directory / entry['fatbin']}: module {module!r} has no kernel {kernel!r} "
                          f"(kernels: {entry['kernels']})")
    mod = get_module(module, device, directory, pinned)
    cupy = _cupy()
    dev_id = cupy.cuda.Device(device).id if device is not None else cupy.cuda.Device().id
    with cupy.cuda.Device(dev_id):
        return mod.get_function(kernel)


def clear_cache() -> None:
    """Forget the loaded modules (tests)."""
    with _lock:
        _cache.clear()
