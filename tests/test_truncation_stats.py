"""tools/truncation_stats.py: its per-product classification against a brute-force count."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from cpemu import reference as ref
from cpemu.cases import Case, operands
from cpemu.formats import FP8_FORMATS
from cpemu.instruction import ADA_SM89, HOPPER_SM90A

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("cpemu_tools_truncation_stats",
                                               os.path.join(HERE, "..", "tools", "truncation_stats.py"))
ts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ts)


def brute(a, bt, model):
    """Python integers, one product at a time: the step's term (P << S0) >> (e_max - E) against
    the exact P << S0 / 2**(e_max - E)."""
    fmt = FP8_FORMATS["e4m3"]
    sign, m, e, _, _ = fmt.tables()
    S0 = model.F - 2 * fmt.frac_bits
    M, K = a.shape
    N = bt.shape[0]
    counts = dict(zero=0, kept=0, lost_bits=0, to_zero=0, c_sets_emax=0, bound_decides=0, c_keeps_binade=0,
                  steady=0)
    steady = np.zeros((M, N), bool)
    c = np.zeros((M, N), np.float32)
    A, B = ref.decode(a, fmt), ref.decode(bt, fmt)
    for k in range(0, K, model.L):
        for i in range(M):
            for j in range(N):
                terms = [(int(m[a[i, q]]) * int(m[bt[j, q]]) << S0, int(e[a[i, q]]) + int(e[bt[j, q]]))
                         for q in range(k, min(k + model.L, K))]
                cv = float(c[i, j])
                ce = int(np.frexp(abs(cv))[1]) - 1 if cv != 0 else None
                pe = [E for P, E in terms if P]
                e_max = max(pe + ([ce] if ce is not None else []), default=0)  # (no nonzero term: unused)
                sets = ce is not None and ce >= max(pe, default=-10**6)
                counts["c_sets_emax"] += int(sets)
                ea = max((int(e[a[i, q]]) for q in range(k, min(k + model.L, K)) if m[a[i, q]]), default=None)
                eb = max((int(e[bt[j, q]]) for q in range(k, min(k + model.L, K)) if m[bt[j, q]]), default=None)
                counts["bound_decides"] += int(ce is not None and (ea is None or eb is None or ea + eb <= ce))
                steady[i, j] = sets
                for P, E in terms:
                    if P == 0:
                        counts["zero"] += 1
                        continue
                    d = e_max - E
                    kept = (P >> d) << d == P
                    counts["kept" if kept else "lost_bits"] += 1
                    counts["to_zero"] += int(P >> d == 0)
        ks = slice(k, min(k + model.L, K))
        c_new = ref.tfdpa(c, A.rows((slice(None), ks)), B.rows((slice(None), ks)), model)
        for i in range(M):
            for j in range(N):
                x, y = float(c[i, j]), float(c_new[i, j])
                keeps = x != 0 and y != 0 and (x > 0) == (y > 0) and np.frexp(x)[1] == np.frexp(y)[1]
                counts["c_keeps_binade"] += int(keeps)
                counts["steady"] += int(keeps and steady[i, j])
        c = c_new
    return counts


@pytest.mark.parametrize("model", [HOPPER_SM90A, ADA_SM89], ids=lambda m: m.name)
@pytest.mark.parametrize("data", ["gauss40", "spread", "sparse"])
def test_counts_match_brute_force(model, data):
    a, bt, *_ = operands(Case(3, 4, 160, data=data, seed=5))
    got = ts.chain_stats(a, bt, model)
    want = brute(a, bt, model)
    for key, v in want.items():
        assert got[key] == v, (key, got[key], v)
    assert got["products"] == 3 * 4 * 160 and got["steps"] == 3 * 4 * (160 // model.L)
    assert got["thread_tiles"] == 0  # 3 x 4 outputs hold no 8 x 4 tile


@pytest.mark.parametrize("model, data, K, seed", [(HOPPER_SM90A, "gauss40", 256, 3), (ADA_SM89, "spread", 512, 4)],
                         ids=["hopper-gauss40", "ada-spread"])
def test_tiles_against_brute_force(model, data, K, seed):
    """16 x 8 outputs: four 8 x 4 tiles per step; a tile is steady where all 32 outputs are."""
    a, bt, *_ = operands(Case(16, 8, K, data=data, seed=seed))
    got = ts.chain_stats(a, bt, model)
    fmt = FP8_FORMATS["e4m3"]
    A, B = ref.decode(a, fmt), ref.decode(bt, fmt)
    c = np.zeros((16, 8), np.float32)
    tiles = 0
    for k in range(0, K, model.L):
        ks = slice(k, k + model.L)
        c_new = ref.tfdpa(c, A.rows((slice(None), ks)), B.rows((slice(None), ks)), model)
        pe = (A.e_nz[:, None, ks].astype(int) + B.e_nz[None, :, ks])
        pe = np.where((A.m[:, None, ks] > 0) & (B.m[None, :, ks] > 0), pe, -10**6).max(-1)
        ok = np.zeros((16, 8), bool)
        for i in range(16):
            for j in range(8):
                x, y = float(c[i, j]), float(c_new[i, j])
                ok[i, j] = (x != 0 and y != 0 and (x > 0) == (y > 0) and np.frexp(x)[1] == np.frexp(y)[1]
                            and np.frexp(x)[1] - 1 >= pe[i, j])
        tiles += sum(ok[r:r + 8, q:q + 4].all() for r in (0, 8) for q in (0, 4))
        c = c_new
    assert got["thread_tiles"] == 4 * (K // model.L) and got["thread_tiles_steady"] == tiles
    assert (tiles > 0) == (data == "spread"), tiles  # ada-spread has steady tiles (62), hopper-gauss40 none


def test_cli_writes_json(tmp_path):
    out = tmp_path / "t.json"
    r = CliRunner().invoke(ts.main, ["--shape", "32x64", "--M", "2", "--N", "3", "--data", "gauss40",
                                     "--profile", "hopper-h200-torch", "--out", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    (res,) = d["results"]
    assert res["products"] == 2 * 3 * 64 and abs(sum(res["fractions"][k] for k in ("zero", "kept", "lost_bits")) - 1) < 1e-12
    r = CliRunner().invoke(ts.main, ["--shape", "bogus", "--out", str(out)])
    assert r.exit_code == 2 and "--shape" in r.output
