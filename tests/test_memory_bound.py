"""Bounded memory: the reference works in blocks over K as well as over outputs, with the same bits.

Each output block reads its operands a K range at a time (cpemu.reference.Codes); a range is a
whole number of steps of the chain it belongs to. The bits are compared, as bit patterns, with
the unblocked path (whole operands decoded at once, the whole output one block) and with the H200
recordings at the finest blocking (one step per range). A large-K call runs under an address-space
limit that the whole-operand decode would exceed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import cpemu
from cpemu import reference as ref
from cpemu.cases import Case, operands
from cpemu.formats import FP8_FORMATS, encode_output
from cpemu.instruction import ADA_SM89, BLACKWELL_SM120, HOPPER_SM90A
from cpemu.schedule import Plan, slices_for
from cpemu.truth import check_case, load_manifest

TRUTH = os.path.join(os.path.dirname(__file__), "data", "h200")
EP = {"order": "acc*(sa*sb)"}


def _inputs(case: Case):
    a, bt, sa, sb, bias = operands(case)
    b32 = None if bias is None else bias.view(
        np.float16 if case.out_dtype == "float16" else ml_dtypes.bfloat16).astype(np.float32)
    return a, bt, sa.reshape(()) if sa.size == 1 else sa, sb.reshape(()) if sb.size == 1 else sb, b32


def _unblocked(case, plan, model, monkeypatch) -> bytes:
    """Whole operands decoded at once, the whole output one block, the whole K one range."""
    a, bt, sa, sb, b32 = _inputs(case)
    monkeypatch.setattr(ref, "K_CHUNK_BYTES", 1 << 62)
    acc = ref.accumulate(ref.decode(a, FP8_FORMATS[case.a_format]), ref.decode(bt, FP8_FORMATS[case.b_format]),
                         plan, model)
    return encode_output(ref.epilogue(acc, sa, sb, b32, EP), case.out_dtype).tobytes()


def _blocked(case, plan, model, chunk_bytes, monkeypatch, threads=2) -> bytes:
    a, bt, sa, sb, b32 = _inputs(case)
    monkeypatch.setattr(ref, "K_CHUNK_BYTES", chunk_bytes)
    return ref.gemm_codes(a, bt, FP8_FORMATS[case.a_format], FP8_FORMATS[case.b_format], plan, model, EP, sa, sb,
                          b32, case.out_dtype, threads=threads).tobytes()


# K ranges of one step, of three steps (no divisor of a 4- or 8-step promotion chain nor of the
# slices), and of about 1000 elements; for the blocks of these shapes (at most 16 + 256 rows).
def _chunks(model):
    return [1, ref.DECODED_BYTES * 272 * model.L * 3, ref.DECODED_BYTES * 40 * 1000]


PLANS = [
    ("one chain", lambda K: Plan(((0, K),), None)),
    ("promotion 4", lambda K: Plan(((0, K),), 4)),
    ("3 slices, fast", lambda K: Plan(slices_for(K, 3, 128), None)),
    ("5 slices, promotion 4", lambda K: Plan(slices_for(K, 5, 128), 4)),
    ("3 slices of 48, promotion 8", lambda K: Plan(slices_for(K, 3, 48), 8)),
]
CASES = [Case(20, 300, 1040, data="spread", seed=1, out_dtype="float32"),
         Case(7, 48, 1440, data="nan", seed=2, a_format="e5m2", out_dtype="bfloat16"),
         Case(33, 64, 1008, data="gauss40", seed=3, scale="rowwise", bias=True, out_dtype="float16"),
         Case(18, 272, 1296, data="cancel", seed=4, scale="tensor", out_dtype="float32")]


@pytest.mark.parametrize("model", [HOPPER_SM90A, ADA_SM89, BLACKWELL_SM120], ids=lambda m: m.name)
@pytest.mark.parametrize("plan_name, make_plan", PLANS, ids=[p[0] for p in PLANS])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_blocking_over_k_keeps_the_bits(case, plan_name, make_plan, model, monkeypatch):
    plan = make_plan(case.K)
    want = _unblocked(case, plan, model, monkeypatch)
    for chunk in _chunks(model):
        assert _blocked(case, plan, model, chunk, monkeypatch) == want, (plan_name, chunk)


def _small_recorded(per_group=6):
    """The smallest recorded calls of each schedule feature: split-K (fast and promoted), promotion,
    NaN data, rowwise scales with bias (the rest run in test_truth at the default blocking)."""
    man = load_manifest(TRUTH)
    ok = sorted((r for r in man["cases"] if "error" not in r), key=lambda r: r["M"] * r["N"] * r["K"])
    groups = [lambda r: r.get("splits", 1) > 1 and r["fast_accum"], lambda r: r.get("splits", 1) > 1 and
              not r["fast_accum"], lambda r: not r["fast_accum"] and r["K"] > 512, lambda r: r["data"] == "nan",
              lambda r: r["scale"] == "rowwise" and r["bias"]]
    picked = [r for g in groups for r in [r for r in ok if g(r)][:per_group]]
    return man, picked


@pytest.mark.parametrize("chunk", [1, ref.DECODED_BYTES * 272 * 32 * 3])
def test_recordings_at_the_finest_blocking(chunk, monkeypatch):
    man, recs = _small_recorded()
    assert sum(r.get("splits", 1) > 1 for r in recs) >= 12 and len(recs) == 30
    files = {}
    monkeypatch.setattr(ref, "K_CHUNK_BYTES", chunk)
    for rec in recs:
        if rec["file"] not in files:
            files[rec["file"]] = np.load(os.path.join(TRUTH, rec["file"]))
        r = check_case(rec, files[rec["file"]][rec["id"]], man["profile"])
        assert r.status == "match", (rec["id"], r.detail)


def test_k_range_is_whole_steps():
    for L in (16, 32):
        for rows in (2, 32, 272, 10 ** 6):
            span = ref.k_range(rows, L)
            assert span % L == 0 and span >= L
            assert span == L or ref.DECODED_BYTES * rows * span <= ref.K_CHUNK_BYTES


def test_working_set_is_bounded_for_any_shape():
    for M, N in ((1, 16), (16, 16), (131072, 131072), (1, 131072), (131072, 16)):
        for L in (16, 32):
            assert ref.working_set_bytes(M, N, L, threads=32) < 2 ** 30, (M, N, L)


def _peak_and_bound(monkeypatch, backend, a, b, profile, L):
    """One-thread call of ``backend``: (the heap peak, its working-set bound plus the output)."""
    from cpemu.backends import get

    monkeypatch.setenv("CPEMU_THREADS", "1")
    tracemalloc.start()
    y = cpemu.gemm(a, b, profile=profile, out_dtype="float32", backend=backend)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, ref.working_set_bytes(a.shape[0], b.shape[1], L, 1, get(backend).arith) + y.nbytes


@pytest.mark.parametrize("backend", ["reference", "cpu-fp32"])
def test_large_k_call_peak_heap(monkeypatch, backend):
    """M = N = 16, K = 65536 on the Ada profile, on each host backend: the heap peak stays within
    its working-set bound plus the output (the whole-operand decode alone needed 9 * 32 * K = 18 MiB)."""
    M, N, K = 16, 16, 65536
    rng = np.random.default_rng(0)
    a = rng.integers(0, 0x7E, (M, K), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    b = rng.integers(0, 0x7E, (N, K), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).T
    peak, bound = _peak_and_bound(monkeypatch, backend, a, b, "ada-rtx4060-torch", ADA_SM89.L)
    bound += 1 << 20
    assert peak <= bound, f"peak {peak / 2**20:.1f} MiB > {bound / 2**20:.1f} MiB"
    assert peak < ref.DECODED_BYTES * (M + N) * K


@pytest.mark.parametrize("backend", ["reference", "cpu-fp32"])
def test_full_block_peak_heap(monkeypatch, backend):
    """A GEMM of whole blocks with every code (NaN and Inf too) on Blackwell's model (cpu-fp32 sums in
    float64 there): the heap peak stays within the backend's working-set bound plus the output."""
    from cpemu.instruction import BLACKWELL_SM120

    M, N, K = 256, 512, 256
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (M, K), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    b = rng.integers(0, 256, (N, K), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).T
    peak, bound = _peak_and_bound(monkeypatch, backend, a, b, "blackwell-rtx5070ti-torch", BLACKWELL_SM120.L)
    assert peak <= bound, f"peak {peak / 2**20:.1f} MiB > {bound / 2**20:.1f} MiB"


_LIMITED = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from cpemu import reference as ref
    from cpemu.formats import E4M3
    from cpemu.instruction import HOPPER_SM90A
    from cpemu.schedule import Plan

    M = N = 16
    K = int(sys.argv[1])
    rng = np.random.default_rng(0)
    a = rng.integers(0, 0x7E, (M, K), dtype=np.uint8)
    bt = rng.integers(0, 0x7E, (N, K), dtype=np.uint8)
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = vm + int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    decoded = None
    try:
        decoded = np.empty(ref.DECODED_BYTES * (M + N) * K, np.uint8)  # what a whole-operand decode holds
        decoded[:] = 1
        fits_whole = True
    except MemoryError:
        fits_whole = False
    del decoded
    y = ref.gemm_codes(a, bt, E4M3, E4M3, Plan(((0, K),), None), HOPPER_SM90A, {"order": "acc*(sa*sb)"},
                       np.float32(1), np.float32(1), None, "float32", threads=1)
    print(json.dumps({"fits_whole": fits_whole, "shape": list(y.shape), "finite": bool(np.isfinite(y).all())}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and RLIMIT_AS")
def test_large_k_call_under_an_address_space_limit(tmp_path):
    """M = N = 16, K = 2**20 under an address-space limit of 128 MiB beyond the inputs: the
    whole-operand decode (288 MiB) cannot be allocated there, the blocked reference runs."""
    script = tmp_path / "limited.py"
    script.write_text(_LIMITED)
    env = dict(os.environ, CPEMU_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(script), str(1 << 20), str(128 << 20)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"fits_whole": False, "shape": [16, 16], "finite": True}


def test_inputs_drawn_in_row_blocks_are_the_recorded_ones(monkeypatch):
    """Large operands are drawn a row block at a time (cpemu.cases.GEN_CHUNK elements): the
    regenerated inputs still hash to what the H200 recording holds."""
    from cpemu import cases

    monkeypatch.setattr(cases, "GEN_CHUNK", 5000)
    man = load_manifest(TRUTH)
    recs = [r for r in man["cases"] if r["data"] in cases._ROWWISE_KINDS and 5000 < r["N"] * r["K"] <= 1 << 20]
    recs = [r for kind in cases._ROWWISE_KINDS for r in [r for r in recs if r["data"] == kind][:8]]
    kinds = {r["data"] for r in recs}
    assert {"uniform", "gauss40", "gauss1"} <= kinds and len(recs) >= 20
    for rec in recs:
        assert cases.sha256_arrays(*operands(Case.from_json(rec))) == rec["inputs_sha256"], rec["id"]


def test_bench_memory_tool(capsys):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools"))
    try:
        import bench_memory
    finally:
        sys.path.pop(0)
    rec = bench_memory.main(["--M", "2", "--N", "16", "--K", "4096", "--threads", "1"])
    assert json.loads(capsys.readouterr().out) == rec
    assert rec["inputs_bytes"] == 18 * 4096 and rec["output_bytes"] == 2 * 16 * 4 and rec["peak_rss_bytes"] > 0


def test_strided_operands_are_read_in_place():
    """cpemu.gemm passes operand views to the reference (no copy of either operand): any strides
    give the bits of the contiguous operands."""
    rng = np.random.default_rng(5)
    big_a = rng.integers(0, 0x7E, (24, 256), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    big_b = rng.integers(0, 0x7E, (128, 96), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    a, b = big_a[::2, ::2], np.asfortranarray(big_b[:, ::3])  # (12, 128) strided, (128, 32) column-major
    want = cpemu.gemm(np.ascontiguousarray(a), np.ascontiguousarray(b), out_dtype="float32")
    got = cpemu.gemm(a, b, out_dtype="float32")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    got_t = cpemu.gemm(a, np.ascontiguousarray(b), out_dtype="float32", fast_accum=False)
    want_t = cpemu.gemm(np.ascontiguousarray(a), np.ascontiguousarray(b), out_dtype="float32", fast_accum=False)
    assert np.array_equal(got_t.view(np.uint32), want_t.view(np.uint32))
