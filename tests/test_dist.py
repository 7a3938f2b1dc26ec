"""The release machinery of the CUDA kernels: reproducible fatbins, pinned manifest, verified loading.

* ``tools/build_fatbin.py --check`` passes on the committed tree (the toolchain is in the
  ``test`` extra) and fatbins are byte-identical when built in two different folders;
* the loader (``cpemu.cuda.loader``) refuses a fatbin with one flipped byte, a missing
  fatbin, and a manifest that differs from the pinned hash, before anything is loaded;
* ``tools/check_dist.py`` refuses a wheel or sdist with a tampered, missing or extra
  fatbin or a tampered manifest, and passes on a real build of this tree;
* the SASS compatibility rule of :func:`cpemu.cuda.loader.arch_compatible`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from cpemu.cuda import loader
from cpemu.cuda.loader import FatbinError, arch_compatible

ROOT = Path(__file__).resolve().parents[1]


def _tool(name):
    spec = importlib.util.spec_from_file_location(f"cpemu_tools_{name}", ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build_fatbin = _tool("build_fatbin")
check_dist = _tool("check_dist")


def _toolchain_reason():
    try:
        build_fatbin.Toolchain()
    except Exception as e:  # BuildError (not installed / wrong version) or a library that will not load
        return f"the pinned NVRTC/nvFatbin wheels are not usable here ({e}); pip install -e '.[test]'"
    return None


TOOLCHAIN_MISSING = _toolchain_reason()
needs_toolchain = pytest.mark.skipif(TOOLCHAIN_MISSING is not None, reason=TOOLCHAIN_MISSING or "")

# A small module in the style of cuda_src/: extern "C" kernels, no includes, a helper with
# internal linkage, a kernel hidden in a comment that must not be listed.
TOY = r"""
// extern "C" __global__ void commented_out(float* p) {}
static __device__ __forceinline__ float decode(unsigned char v) {
    int e = (v >> 3) & 15, m = v & 7;
    float r = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    return (v >> 7) ? -r : r;
}
extern "C" __global__ void toy_dot(const unsigned char* a, const unsigned char* b, float* c, int K) {
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc = __fmaf_rn(decode(a[k]), decode(b[k]), acc);
    c[threadIdx.x] = acc;
}
extern "C" __global__ void __launch_bounds__(128) toy_scale(float* c, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = c[i] * s;
}
"""


def _build(src: Path, out: Path, pinned: Path):
    manifest, fatbins, _ = build_fatbin.build(src, log=lambda s: None)
    build_fatbin.write_outputs(out, pinned, manifest, fatbins)
    return manifest


def _pin_of(path: Path) -> str:
    return check_dist.pinned_sha(path.read_bytes(), str(path))


def _flip(path: Path, offset: int | None = None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def bundle(tmp_path):
    """A copy of the committed bin/ (or, while cuda_src has no module yet, a toy build):
    (bin folder, pinned sha256, a module name)."""
    committed = json.loads((ROOT / "bin" / "manifest.json").read_text())
    if committed["modules"]:
        out = tmp_path / "bin"
        shutil.copytree(ROOT / "bin", out)
        return out, _pin_of(ROOT / "cpemu" / "cuda" / "_pinned.py"), sorted(committed["modules"])[0]
    if TOOLCHAIN_MISSING:
        pytest.skip(TOOLCHAIN_MISSING)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "toy.cu").write_text(TOY)
    _build(tmp_path / "src", tmp_path / "bin", tmp_path / "_pinned.py")
    return tmp_path / "bin", _pin_of(tmp_path / "_pinned.py"), "toy"


@pytest.fixture
def no_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # "import cupy" raises ImportError


# ---------------------------------------------------------------- the build


@needs_toolchain
def test_build_fatbin_check_passes_on_committed_tree():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "build_fatbin.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check OK" in r.stdout


def test_committed_manifest_is_pinned_and_fatbins_verify():
    manifest = loader.load_manifest()  # the package's own bin/, against the package's own pin
    for name in manifest["modules"]:
        assert loader.verify_fatbin(name, manifest=manifest).is_file()


@needs_toolchain
def test_build_is_reproducible_across_folders(tmp_path):
    a, b = tmp_path / "a" / "src", tmp_path / "elsewhere" / "deeper" / "cuda"
    for d in (a, b):
        d.mkdir(parents=True)
        (d / "toy.cu").write_text(TOY)
    ma = _build(a, tmp_path / "a" / "bin", tmp_path / "a" / "_pinned.py")
    _build(b, tmp_path / "b" / "bin", tmp_path / "b" / "_pinned.py")
    for rel in ("bin/toy.fatbin", "bin/manifest.json", "_pinned.py"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    entry = ma["modules"]["toy"]
    assert entry["kernels"] == ["toy_dot", "toy_scale"]
    assert entry["architectures"] == ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_120"]
    assert set(entry["sources"]) == {"toy.cu"}
    images = loader.fatbin_entries((tmp_path / "a" / "bin" / "toy.fatbin").read_bytes())
    assert [i["kind"] for i in images] == ["sass"] * 5  # no PTX
    assert sorted(i["sm"] for i in images) == [80, 86, 89, 90, 120]
    assert not {"-G", "-lineinfo"} & set(ma["flags"]["nvrtc"])


@needs_toolchain
def test_build_fatbin_check_refuses_a_changed_fatbin(tmp_path):
    from click.testing import CliRunner

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "toy.cu").write_text(TOY)
    args = ["--src", str(tmp_path / "src"), "--out", str(tmp_path / "bin"), "--pinned", str(tmp_path / "p.py")]
    assert CliRunner().invoke(build_fatbin.main, args).exit_code == 0
    assert CliRunner().invoke(build_fatbin.main, args + ["--check"]).exit_code == 0
    _flip(tmp_path / "bin" / "toy.fatbin")
    r = CliRunner().invoke(build_fatbin.main, args + ["--check"])
    assert r.exit_code != 0 and "not byte-identical" in r.output


def test_kernel_names_parser():
    src = 'extern "C" __global__ void a(int x) {}\n/* extern "C" __global__ void b( */\n' \
          'extern "C"\n__global__  void __launch_bounds__(256, 2) c (float*p) {}\n' \
          '// extern "C" __global__ void d(\n__global__ void not_extern_c() {}\n'
    assert build_fatbin.kernel_names(src) == ["a", "c"]
    # a measurement build's kernel, marked as not in the fatbin; a mark naming no kernel is an error
    assert build_fatbin.kernel_names(src + "// not shipped: c\n") == ["a"]
    with pytest.raises(build_fatbin.BuildError, match="'not shipped' names no kernel"):
        build_fatbin.kernel_names(src + "// not shipped: d\n")


# ---------------------------------------------------------------- the loader


def test_cuda_package_imports_without_cupy():
    code = ("import sys; sys.modules['cupy'] = None; import cpemu.cuda as c; "
            "ok, why = c.module_status('no_such_module'); assert not ok; print(why)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "no_such_module" in r.stdout


def test_loader_accepts_an_intact_bundle(bundle, no_cupy):
    out, pin, name = bundle
    manifest = loader.load_manifest(out, pin)
    assert loader.verify_fatbin(name, out, pin) == out / manifest["modules"][name]["fatbin"]
    ok, why = loader.module_status(name, directory=out, pinned=pin)
    assert not ok and "cupy" in why  # the files pass; only the missing GPU stack stops it


def test_loader_refuses_a_flipped_fatbin(bundle, no_cupy):
    out, pin, name = bundle
    _flip(out / f"{name}.fatbin")
    with pytest.raises(FatbinError, match="sha256") as e:
        loader.verify_fatbin(name, out, pin)
    assert f"{name}.fatbin" in str(e.value)
    ok, why = loader.module_status(name, directory=out, pinned=pin)
    assert not ok and "sha256" in why


def test_loader_refuses_a_missing_fatbin(bundle, no_cupy):
    out, pin, name = bundle
    (out / f"{name}.fatbin").unlink()
    with pytest.raises(FatbinError, match="missing file"):
        loader.verify_fatbin(name, out, pin)
    assert not loader.module_status(name, directory=out, pinned=pin)[0]


def test_loader_refuses_a_tampered_manifest(bundle):
    out, pin, name = bundle
    # Re-pinning the manifest to a flipped fatbin is exactly what the pinned hash stops.
    _flip(out / f"{name}.fatbin")
    m = json.loads((out / "manifest.json").read_text())
    m["modules"][name]["sha256"] = hashlib.sha256((out / f"{name}.fatbin").read_bytes()).hexdigest()
    (out / "manifest.json").write_bytes(build_fatbin.render_json(m))
    with pytest.raises(FatbinError, match="MANIFEST_SHA256"):
        loader.load_manifest(out, pin)
    with pytest.raises(FatbinError, match="MANIFEST_SHA256"):
        loader.verify_fatbin(name, out, pin)
    ok, why = loader.module_status(name, directory=out, pinned=pin)
    assert not ok and "MANIFEST_SHA256" in why


def test_loader_refuses_a_manifest_that_fails_the_schema(tmp_path):
    bad = b'{"schema_version": 1, "modules": {}}\n'
    (tmp_path / "manifest.json").write_bytes(bad)
    with pytest.raises(FatbinError, match="does not validate"):
        loader.load_manifest(tmp_path, hashlib.sha256(bad).hexdigest())
    with pytest.raises(FatbinError, match="missing file"):
        loader.load_manifest(tmp_path / "nowhere", "0" * 64)


@pytest.mark.parametrize("binary, device, ok", [
    ("sm_80", (8, 0), True), ("sm_80", (8, 6), True), ("sm_80", (8, 7), True), ("sm_80", (8, 9), True),
    ("sm_86", (8, 0), False), ("sm_86", (8, 9), True), ("sm_89", (8, 6), False),
    ("sm_80", (9, 0), False), ("sm_89", (9, 0), False), ("sm_80", (12, 0), False),
    ("sm_90a", (9, 0), True), ("sm_90a", (10, 0), False), ("sm_90a", (12, 0), False), ("sm_90", (9, 0), True),
    ("sm_120", (12, 0), True), ("sm_120", (12, 1), True), ("sm_120", (10, 0), False), ("sm_120", (9, 0), False),
    ("sm_120a", (12, 1), False), ("sm_100f", (10, 3), True), ("sm_100f", (12, 0), False),
    ("sm_90a", "sm_90", True), ("sm_86", "sm_120", False),
])
def test_arch_rule(binary, device, ok):
    assert arch_compatible(binary, device) is ok


def test_arch_rule_picks_the_newest_runnable_sass():
    archs = ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_120"]
    assert loader.compatible_archs(archs, (8, 6))[0] == "sm_86"
    assert loader.compatible_archs(archs, (8, 7)) == ["sm_86", "sm_80"]
    assert loader.compatible_archs(archs, (9, 0)) == ["sm_90a"]
    assert loader.compatible_archs(archs, (10, 0)) == []  # no sm_100 SASS shipped: refused, not guessed
    with pytest.raises(FatbinError, match="architecture"):
        arch_compatible("compute_90", (9, 0))


# ---------------------------------------------------------------- check_dist


def _dist_files(out: Path, kind: str) -> dict[str, bytes]:
    lay = check_dist.LAYOUTS[kind]
    files = {f"{lay['bin']}/{p.name}": p.read_bytes() for p in out.iterdir() if p.is_file()}
    files[lay["pinned"]] = (out.parent / "_pinned.py").read_bytes()
    files[lay["schema"]] = (ROOT / "schemas" / "manifest.schema.json").read_bytes()
    return files


@pytest.fixture
def dist_bundle(bundle):
    out, pin, name = bundle
    (out.parent / "_pinned.py").write_text(f'MANIFEST_SHA256 = "{pin}"\n')
    return out, name


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_check_dist_verification(dist_bundle, kind):
    out, name = dist_bundle
    lay = check_dist.LAYOUTS[kind]
    fat = f"{lay['bin']}/{name}.fatbin"
    good = _dist_files(out, kind)
    problems, report = check_dist.verify_files(kind, good, "x")
    assert problems == [] and "OK" in report[0]

    flipped = dict(good)
    flipped[fat] = bytes([good[fat][0] ^ 1]) + good[fat][1:]
    assert any("sha256" in p and "tampered" in p for p in check_dist.verify_files(kind, flipped, "x")[0])

    missing = {k: v for k, v in good.items() if k != fat}
    assert any("missing" in p for p in check_dist.verify_files(kind, missing, "x")[0])

    extra = dict(good, **{"cpemu/other/stray.fatbin": good[fat]})
    assert any("extra .fatbin" in p for p in check_dist.verify_files(kind, extra, "x")[0])

    mpath = f"{lay['bin']}/manifest.json"
    tampered = dict(good, **{mpath: good[mpath].replace(b'"kernels"', b'"kernels" ')})
    assert any("MANIFEST_SHA256" in p for p in check_dist.verify_files(kind, tampered, "x")[0])


def test_check_dist_reads_wheel_and_sdist_archives(dist_bundle, tmp_path):
    out, name = dist_bundle
    whl = tmp_path / "cpemu-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for rel, data in _dist_files(out, "wheel").items():
            z.writestr(rel, data)
        z.writestr("cpemu-0.1.0.dist-info/RECORD", "")
    assert check_dist.read_archive(whl)[0] == "wheel"
    assert check_dist.verify_archive(whl, tree=False)[0] == []

    sdist = tmp_path / "cpemu-0.1.0.tar.gz"
    files = dict(_dist_files(out, "sdist"), **{"PKG-INFO": b"Name: cpemu\n"})
    fat = files[f"bin/{name}.fatbin"]
    files[f"bin/{name}.fatbin"] = fat[:-1] + bytes([fat[-1] ^ 1])
    with tarfile.open(sdist, "w:gz") as t:
        for rel, data in files.items():
            info = tarfile.TarInfo(f"cpemu-0.1.0/{rel}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    kind, _ = check_dist.read_archive(sdist)
    assert kind == "sdist"
    problems = check_dist.verify_archive(sdist, tree=False)[0]
    assert any(f"bin/{name}.fatbin has sha256" in p for p in problems)

    from click.testing import CliRunner

    r = CliRunner().invoke(check_dist.main, ["--verify-manifest", "--no-tree", "--wheel", str(whl),
                                             "--sdist", str(sdist)])
    assert r.exit_code == 1 and "check_dist FAILED" in r.output and "tampered" in r.output


def _offline_build_reason():
    for mod in ("build", "wheel", "setuptools"):
        if importlib.util.find_spec(mod) is None:
            return f"python -m build --no-isolation needs {mod!r} (in the test extra)"
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 68:
        return f"setuptools {setuptools.__version__} < 68"
    return None


@pytest.mark.skipif(_offline_build_reason() is not None, reason=_offline_build_reason() or "")
def test_check_dist_on_a_real_build():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "check_dist.py"), "--verify-manifest",
                        "--no-isolation"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK (wheel)" in r.stdout and "OK (sdist)" in r.stdout


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_every_committed_kernel_loads_on_this_gpu():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except Exception as e:
        pytest.skip(f"CUDA not usable: {e}")
    manifest = loader.load_manifest()
    if not manifest["modules"]:
        pytest.skip("the manifest lists no module yet")
    for name, entry in manifest["modules"].items():
        ok, why = loader.module_status(name)
        major, minor, _ = loader.device_arch()
        if not loader.compatible_archs(entry["architectures"], (major, minor)):
            assert not ok and "none of the fatbin's architectures" in why
            continue
        assert ok, why
        for kernel in entry["kernels"]:
            assert loader.get_function(name, kernel).attributes["max_threads_per_block"] > 0
        assert loader.get_module(name) is loader.get_module(name)  # cached once per device
