"""A process's own memory limits count as much as the machine's: an address-space limit (``ulimit -v``)
or a memory control group smaller than the machine's free memory must refuse a call before it allocates,
with OutputTooLarge naming the output, never numpy's bare MemoryError (or the kernel's OOM killer)."""

import subprocess
import sys
import textwrap

import pytest

from cpemu import memory as mem


def test_address_space_limit_refuses_before_allocating():
    # 16 GiB of float32 output under a limit 2 GiB above what the process already maps: the machine may have
    # the memory, the process may not take it (numpy raised a bare MemoryError here before the limit counted)
    code = textwrap.dedent("""
        import resource, ml_dtypes, numpy as np, cpemu
        size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + (2 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))
        a = np.zeros((65536, 16), np.uint8).view(ml_dtypes.float8_e4m3fn)
        b = np.zeros((16, 65536), np.uint8).view(ml_dtypes.float8_e4m3fn)
        try:
            cpemu.gemm(a, b, out_dtype="float32")
        except cpemu.OutputTooLarge as e:
            print("REFUSED", e)
        except MemoryError as e:
            print("MEMORYERROR", e)
        else:
            print("ANSWERED")
    """)
    if not __import__("os").path.exists("/proc/self/status"):
        pytest.skip("no /proc/self/status on this system: the address-space room is unknown")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("REFUSED out: the (65536, 65536) float32 output needs 16.00 GiB"), line
    assert "cpemu refuses before allocating it" in line, line


def _cgroup(tmp_path, monkeypatch, version, limit, usage, cache):
    files = {1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
             2: ("memory.max", "memory.current", "inactive_file")}[version]
    (tmp_path / files[0]).write_text(f"{limit}\n")
    (tmp_path / files[1]).write_text(f"{usage}\n")
    (tmp_path / "memory.stat").write_text(f"anon 5\n{files[2]} {cache}\nactive_file 7\n")
    monkeypatch.setattr(mem, "CGROUP_FILES", ((str(tmp_path), files[0], files[1], "memory.stat", files[2]),))


@pytest.mark.parametrize("version", [1, 2])
def test_cgroup_room_is_limit_less_use_less_reclaimable_cache(tmp_path, monkeypatch, version):
    _cgroup(tmp_path, monkeypatch, version, limit=8 << 30, usage=3 << 30, cache=1 << 30)
    assert mem.cgroup_bytes() == 6 << 30
    monkeypatch.setattr(mem, "machine_bytes", lambda: 20 << 30)
    monkeypatch.setattr(mem, "address_space_bytes", lambda: None)
    assert mem.available_bytes() == 6 << 30  # the least of what is known
    with pytest.raises(mem.OutputTooLarge, match=r"^out: the \(65536, 32768\) float32 output needs 8.00 GiB .* "
                                                 r"this process has 6.00 GiB available"):
        mem.check_output(65536, 32768, "float32")
    mem.check_output(32768, 32768, "float32")  # 4 GiB fit in 80 % of 6 GiB


@pytest.mark.parametrize("text", ["max", "9223372036854771712", "not a number"])
def test_cgroup_without_a_limit_leaves_the_machine_s_figure(tmp_path, monkeypatch, text):
    _cgroup(tmp_path, monkeypatch, 2, limit=text, usage=1 << 30, cache=0)
    assert mem.cgroup_bytes() is None
    monkeypatch.setattr(mem, "machine_bytes", lambda: 20 << 30)
    monkeypatch.setattr(mem, "address_space_bytes", lambda: None)
    assert mem.available_bytes() == 20 << 30


def test_cgroup_use_above_the_limit_leaves_nothing(tmp_path, monkeypatch):
    _cgroup(tmp_path, monkeypatch, 2, limit=1 << 30, usage=2 << 30, cache=0)
    assert mem.cgroup_bytes() == 0


def test_nothing_known_refuses_nothing(monkeypatch):
    for f in ("machine_bytes", "cgroup_bytes", "address_space_bytes"):
        monkeypatch.setattr(mem, f, lambda: None)
    assert mem.available_bytes() is None
    mem.check_output(1 << 20, 1 << 20, "float32")
