"""tools/device_attrs_shim.c and tools/as_h200.sh, against a stand-in CUDA driver (no GPU): the shim reports
the given attributes, memory and name to a caller that finds the driver's functions by dlsym or through
cuGetProcAddress (as the CUDA runtime inside cuBLASLt does), and leaves every other attribute alone."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(os.path.dirname(HERE), "tools")

FAKE_DRIVER = r"""
#include <stdio.h>
#include <string.h>
int cuDeviceGetAttribute(int *pi, int attrib, int dev) { *pi = 1000 + attrib; return 0; }
int cuDeviceTotalMem_v2(size_t *bytes, int dev) { *bytes = 12345; return 0; }
int cuDeviceGetName(char *name, int len, int dev) { snprintf(name, len, "Stand-in GPU"); return 0; }
int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, void *status) {
    if (!strcmp(sym, "cuDeviceGetAttribute")) *pfn = (void *)cuDeviceGetAttribute;
    else if (!strcmp(sym, "cuDeviceTotalMem")) *pfn = (void *)cuDeviceTotalMem_v2;
    else if (!strcmp(sym, "cuDeviceGetName")) *pfn = (void *)cuDeviceGetName;
    else return 500;
    return 0;
}
"""

#: what the caller prints: attributes 36, 37, 38 and 40 found by dlsym, then 36 through cuGetProcAddress_v2,
#: the memory through cuGetProcAddress_v2 and the name by dlsym
CALLER = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    v = ctypes.c_int()
    got = []
    for a in (36, 37, 38, 40):
        assert lib.cuDeviceGetAttribute(ctypes.byref(v), a, 0) == 0
        got.append(v.value)
    fn = ctypes.c_void_p()
    assert lib.cuGetProcAddress_v2(b"cuDeviceGetAttribute", ctypes.byref(fn), 13000, 0, None) == 0
    attr = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int)(fn.value)
    assert attr(ctypes.byref(v), 36, 0) == 0
    got.append(v.value)
    assert lib.cuGetProcAddress_v2(b"cuDeviceTotalMem", ctypes.byref(fn), 13000, 0, None) == 0
    mem = ctypes.c_size_t()
    ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.c_int)(fn.value)(ctypes.byref(mem), 0)
    name = ctypes.create_string_buffer(64)
    lib.cuDeviceGetName(name, 64, 0)
    print(*got, mem.value, name.value.decode())
""")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("gcc") is None or not sys.platform.startswith("linux"):
        pytest.skip("needs gcc on Linux (the shim is an LD_PRELOAD library)")
    d = tmp_path_factory.mktemp("shim")
    (d / "driver.c").write_text(FAKE_DRIVER)
    (d / "caller.py").write_text(CALLER)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "libfakecuda.so"), str(d / "driver.c")], check=True)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(d / "shim.so"),
                    os.path.join(TOOLS, "device_attrs_shim.c"), "-ldl"], check=True)
    return d


def _run(built, env, prefix=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOOF_") and k != "LD_PRELOAD"} | env
    r = subprocess.run([*prefix, sys.executable, str(built / "caller.py"), str(built / "libfakecuda.so")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split(maxsplit=6)


def test_without_the_shim_the_driver_answers(built):
    assert _run(built, {}) == ["1036", "1037", "1038", "1040", "1036", "12345", "Stand-in GPU\n"]


def test_the_shim_reports_the_given_values_and_leaves_the_rest(built, tmp_path):
    log = tmp_path / "slog"
    got = _run(built, {"LD_PRELOAD": str(built / "shim.so"), "SPOOF_ATTRS": "36=7,38=9", "SPOOF_TOTAL_MEM": "99",
                       "SPOOF_NAME": "Other GPU", "SPOOF_LOG": str(log)})
    assert got == ["7", "1037", "9", "1040", "7", "99", "Other GPU\n"]
    lines = "".join(p.read_text() for p in tmp_path.glob("slog.*")).splitlines()
    assert "attr 36 1036 -> 7" in lines and "attr 37 1037 -> 1037" in lines and "name Stand-in GPU -> Other GPU" in lines


def test_as_h200_reports_the_h200_s_attributes(built):
    got = _run(built, {"SHIM": str(built / "as_h200.so")}, prefix=[os.path.join(TOOLS, "as_h200.sh")])
    # memory clock 3,201,000 kHz, bus width 6,016 bits, L2 62,914,560 bytes (the H200's, read by Nsight Compute)
    assert got == ["3201000", "6016", "62914560", "1040", "3201000", "150109880320", "NVIDIA H200\n"]


def test_as_h200_values_are_the_h200_s_recorded_attributes():
    """as_h200.sh's values are those Nsight Compute read on the H200 host (the committed profile report)."""
    import re

    ncu = open(os.path.join(os.path.dirname(HERE), "benchmarks", "h200-rzacc-profile",
                            "ncu-rzacc-stalls-M2048.txt")).read()
    rec = {m[1]: int(m[2].replace(",", "")) for m in re.finditer(r"device__attribute_(\w+)\s+([\d,]+)\s*$", ncu, re.M)}
    assert re.search(r"device__attribute_display_name\s+NVIDIA H200\s*$", ncu, re.M)
    script = open(os.path.join(TOOLS, "as_h200.sh")).read()
    attrs = dict(kv.split("=") for kv in re.search(r'SPOOF_ATTRS="([^"]+)"', script)[1].split(","))
    # CUdevice_attribute numbers (cuda.h)
    names = {"13": "clock_rate", "16": "multiprocessor_count", "36": "memory_clock_rate",
             "37": "global_memory_bus_width", "38": "l2_cache_size", "108": "max_persisting_l2_cache_size"}
    assert {k: int(v) for k, v in attrs.items()} == {k: rec[n] for k, n in names.items()}
    assert int(re.search(r"SPOOF_TOTAL_MEM=(\d+)", script)[1]) == rec["total_memory"]


NEXT_CALLER = textwrap.dedent("""
    import ctypes, sys
    print(ctypes.CDLL(sys.argv[1]).ask())
""")


def test_rtld_next_lookups_search_after_their_caller(built, tmp_path):
    """dlsym(RTLD_NEXT, ...) through the shim finds the definition after the caller's library, as without
    the shim (an interposing library asking for the function it wraps gets the wrapped one, not itself)."""
    (tmp_path / "b.c").write_text("int who(void) { return 3; }\n")
    (tmp_path / "a.c").write_text("#define _GNU_SOURCE\n#include <dlfcn.h>\nint who(void) { return 2; }\n"
                                  "int ask(void) { int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, \"who\");"
                                  " return f ? f() : -1; }\n")
    (tmp_path / "caller.py").write_text(NEXT_CALLER)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libb.so"), str(tmp_path / "b.c")], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "liba.so"), str(tmp_path / "a.c"),
                    "-Wl,--no-as-needed", "-L" + str(tmp_path), "-lb", "-Wl,-rpath," + str(tmp_path), "-ldl"], check=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    cmd = [sys.executable, str(tmp_path / "caller.py"), str(tmp_path / "liba.so")]
    for extra in ({}, {"LD_PRELOAD": str(built / "shim.so")}):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env | extra, timeout=120)
        assert (r.returncode, r.stdout) == (0, "3\n"), (extra, r.stderr)
