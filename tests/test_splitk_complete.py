"""The split-K laws on the dense H200 samples, the complete record and its table, the domain, and
the enumerator's resume and merge logic.

tests/data/h200-splitk/measured/*.npz are cuBLASLt's answers on the H200
(cpemu.recording.splitk_measure; see the README there); tests/data/h200-splitk/complete/rec.txz
is the start of the complete record (cpemu.recording.splitk_enum part files), the source of the
shipped complete table.
"""

import json
import os
import re
import tarfile

import click
import numpy as np
import pytest

import cpemu
from cpemu.recording import splitk_enum as se
from splitk_fixtures import bound_u as _u  # noqa: E402
from splitk_fixtures import checked_split as _checked  # noqa: E402
from splitk_fixtures import UNRECORDED, partial_profile, fake_answer as _fake, small_plan as _small_plan, tail_cut  # noqa: E402
from cpemu.recording.splitk_rule import law_counts, rows_of
from cpemu.schedule import UnsupportedShape
from cpemu.splitk import SplitKRule, combo_key, no_algorithm, split_bound
from cpemu.splitk_complete import NONE, load_complete

DATA = os.path.join(os.path.dirname(__file__), "data", "h200-splitk")
MEASURED = [os.path.join(DATA, "measured", f"{n}.npz") for n in ("deepk", "gran", "large")]
PROFILE = cpemu.get_profile("hopper-h200-torch")
PARAMS = PROFILE.data["modes"]["tensorwise"]["split_k"]["params"]
BOUND = PARAMS["bound"]


def _slices(K, s):
    """How many slices a split count gives: ceil(tiles / ceil(tiles / s)) tiles of 128 (empty ones
    dropped); s where the profile's tail rule cuts K (17 or more slices, K - 16 a multiple of 128 s
    and of 32), since K - 16 then splits into s whole slices."""
    if tail_cut(K, s):
        return s
    tiles = -(-K // 128)
    return -(-tiles // -(-tiles // s))


def _load(path):
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        return (z["shapes"].astype(np.int64), z["ids"], z["configs"].astype(np.int64), json.loads(str(z["combos"])),
                meta)


@pytest.mark.parametrize("path", MEASURED, ids=os.path.basename)
def test_laws_on_dense_samples(path):
    shapes, ids, configs, combos, meta = _load(path)
    col = meta["fields"].index("splitk_num")
    s = np.where(ids >= 0, configs[np.maximum(ids, 0), col], -1)
    M, N, K = shapes.T
    u = _u(BOUND, M, N, K)[:, None]
    ok = ids >= 0
    assert ok.sum() > 30000
    assert not ((s > np.maximum(u, 1)) & ok).any()  # the bound
    assert not ((u <= 1) & ok & (s != 1)).any()  # no split where u <= 1
    rowwise = np.array([c["scale_mode"] == "rowwise" for c in combos])
    assert not (ok & rowwise[None, :] & (s != 1)).any()
    # cpemu's bound is the same function
    rng = np.random.default_rng(0)
    for i in rng.integers(0, len(shapes), 300):
        assert split_bound(BOUND, *map(int, shapes[i])) == int(u[i, 0])


def test_law_counts_on_dense_samples():
    """The law checker counts what the profile's source states; bias differs once, above K = 65536."""
    sup, viol = law_counts(rows_of(MEASURED[2]), BOUND)
    assert not viol
    assert sup["bias-differs-above"] == 1 and sup["bias"] == 183407 and sup["rowwise"] == 322225


@pytest.mark.parametrize("path", MEASURED, ids=os.path.basename)
def test_profile_on_dense_samples(path):
    """A sample of each file through Profile.plan: the recorded count, or a refusal where u >= 2."""
    shapes, ids, configs, combos, meta = _load(path)
    col = meta["fields"].index("splitk_num")
    rng = np.random.default_rng(1)
    answered = 0
    for _ in range(6000):
        i, j = int(rng.integers(len(shapes))), int(rng.integers(len(combos)))
        if ids[i, j] < 0:
            continue
        M, N, K = map(int, shapes[i])
        c = combos[j]
        try:
            got = PROFILE.plan(M, N, K, c["fast_accum"], c["scale_mode"], c["a_dtype"], c["b_dtype"],
                               c["out_dtype"]).splits
        except UnsupportedShape as e:
            assert c["scale_mode"] == "tensorwise" and split_bound(BOUND, M, N, K) >= 2, e
            continue
        want = int(configs[ids[i, j], col])
        assert got == _slices(K, want), (c, M, N, K, want, got)
        answered += 1
    assert answered > 400


def _archive(tmp_path_factory, name):
    d = tmp_path_factory.mktemp(name)
    with tarfile.open(os.path.join(DATA, "complete", f"{name}.txz")) as t:
        t.extractall(d, filter="data")
    return str(d / name)


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    return _archive(tmp_path_factory, "rec")


@pytest.fixture(scope="module")
def repeat(tmp_path_factory):
    return _archive(tmp_path_factory, "repeat")


#: the pairs of the shipped complete table (tests/data/h200-splitk/complete/README.md)
RECORD_PAIRS = 65320
#: the pairs of the part files in rec.txz (the runs since the table was last cut from its record)
ARCHIVE_PAIRS = 149
#: the pairs of repeat.txz: pairs of record runs 37 and 38 (whose part files were not kept) asked
#: again by a later run, in other processes after a fresh start of the machine
REPEAT_PAIRS = 134


def _asked_in_full(table, law):
    """The pair indices of the table whose answers were all asked under ``law`` ("fast", "k"):
    the law was off or the pair was a checked one."""
    from cpemu.splitk_complete import MARK_DERIVED

    return set(np.nonzero(table.marks[law] != MARK_DERIVED)[0].tolist())


def _pairs_decode_to_the_record(record):
    """How many pairs of the part files in ``record``; each of their (M, N, K, combination) decodes
    from the shipped table to the recorded configuration."""
    plan = json.load(open(os.path.join(record, "plan.json")))
    assert plan == se.default_plan()
    table = load_complete(PARAMS["complete_file"])
    keys = [combo_key(c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"]) for c in plan["combos"]]
    nk = len(se.k_grid(plan))
    pairs = 0
    for path in sorted(os.listdir(record)):
        if not path.startswith("part-"):
            continue
        local, done = se.read_part(os.path.join(record, path))
        local = np.array([local[i] for i in range(len(local))])
        for (M, N), runs in done.items():
            p = int(np.searchsorted(table.pairs, (M << 20) | N))
            assert table.pairs[p] == (M << 20) | N
            for key, r in zip(keys, runs):
                want = np.repeat(r[1::2], np.diff([0] + r[0::2]))
                want = local[want] if (want >= 0).all() else None
                got = table.configs[table.column(p, table.combo[key])]
                assert want is not None and got.shape == (nk, len(table.meta["fields"]))
                assert (got == want).all(), (M, N, key)
            pairs += 1
    return pairs, table


def test_complete_table_is_the_record(record):
    """Every (M, N, K, combination) of the last runs' part files decodes from the shipped table to the
    recorded configuration; the record holds RECORD_PAIRS pairs of 67,968 answers."""
    pairs, table = _pairs_decode_to_the_record(record)
    assert pairs == ARCHIVE_PAIRS and len(table.pairs) == RECORD_PAIRS


def test_complete_table_holds_every_pair_of_its_plan():
    """The record is finished: the shipped table holds exactly the open pairs of the default plan
    (every (M, N) with N <= 65536 whose workspace bound lets K split), each at every K of the grid."""
    table = load_complete(PARAMS["complete_file"])
    want = np.array(sorted((M << 20) | N for M, N in se.open_pairs(se.default_plan())), np.int64)
    assert len(want) == RECORD_PAIRS
    assert (np.sort(table.pairs.astype(np.int64)) == want).all()
    assert table.meta["nk"] == len(se.k_grid(se.default_plan())) == 3776


def test_holds_is_a_recorded_pair_at_a_point_of_the_grid():
    """_Table.holds: a pair of the table, at the first and last K of the grid and between; not at a K off the
    grid's step or outside it, nor for a pair the table does not hold (N not a multiple of 16)."""
    table = load_complete(PARAMS["complete_file"])
    k0, step, nk = table.meta["k0"], table.meta["k_step"], table.meta["nk"]
    M, N = divmod(int(table.pairs[len(table.pairs) // 2]), 1 << 20)
    assert all(table.holds(M, N, K) for K in (k0, k0 + step, k0 + step * (nk - 1)))
    assert not any(table.holds(M, N, K) for K in (k0 + step // 2, k0 - step, k0 + step * nk))
    assert not table.holds(M, N + 8, k0) and table.holds(M, N, k0) == (table.pair_index(M, N) is not None)


def test_repeated_pairs_give_the_table_answers(record, repeat):
    """Pairs the table holds from runs whose part files were not kept, asked again on the H200 (from the
    table of 50,402 pairs, so the same pairs in the same order): every answer is the table's."""
    pairs, _ = _pairs_decode_to_the_record(repeat)
    again = se.done_pairs(repeat)
    assert pairs == len(again) == REPEAT_PAIRS and not again & se.done_pairs(record)


def test_profile_answers_from_the_complete_table(record):
    """Profile.plan reads recorded pairs from the complete table (pairs of the first part file, at
    random K of the grid)."""
    first = sorted(p for p in os.listdir(record) if p.startswith("part-"))[0]
    local, done = se.read_part(os.path.join(record, first))
    plan = json.load(open(os.path.join(record, "plan.json")))
    ks = se.k_grid(plan)
    rng = np.random.default_rng(2)
    verified = PARAMS["verified_splits"]
    answered = refused = 0
    for (M, N), runs in sorted(done.items())[3:6]:
        for j in rng.integers(0, len(plan["combos"]), 6):
            c, r = plan["combos"][j], runs[j]
            col = np.repeat(r[1::2], np.diff([0] + r[0::2]))
            for i in rng.integers(0, len(ks), 40):
                cfg = local[int(col[i])]
                want, tile = cfg[4], cfg[1]
                args = (M, N, ks[i], c["fast_accum"], "tensorwise", c["a_dtype"], c["b_dtype"], c["out_dtype"])
                if not _checked(verified, tile, want):
                    with pytest.raises(UnsupportedShape, match=f"into {want} slices.*tile id {tile}"):
                        PROFILE.plan(*args)
                    refused += 1
                    continue
                assert PROFILE.plan(*args).splits == _slices(ks[i], want), args
                answered += 1
    assert answered > 200  # refusals are rare now (0.02 % of the table); test_refusals_name_their_reason has one


def test_gpu_output_check_of_large_splits():
    """tools/splitk_output_check.py on the H200: the profile answers every call with the recorded
    split count; the four whose bytes did not match then (17 slices at K = 45712) are the ones the
    tail rule cuts (tests/test_splitk_tiles.py reproduces their bytes)."""
    doc = json.load(open(os.path.join(DATA, "measured", "large_split_outputs.json")))
    assert doc["calls"] == 96 and doc["matched"] == 92
    for r in doc["rows"]:
        args = (r["M"], r["N"], r["K"], r["fast_accum"], "tensorwise", "e4m3", "e4m3", r["out_dtype"])
        plan = PROFILE.plan(*args)
        assert plan.splits == r["splits"], r
        assert (plan.slices[-1][1] == r["K"] - 16) == (not r["match"]), r


def test_domain_edges():
    p = PROFILE
    assert p.plan(131072, 131072, 131072, True).splits == 1  # the bound decides (u <= 1)
    assert p.plan(4096, 16, 65536, True).splits == 1  # 4 * 4096 * 32 * 2 > 2^20 - 16
    assert p.plan(1, 106496, 53248, False, "rowwise").splits == 1
    assert p.plan(32768, 24576, 8192, True).splits == 1  # Evo 2 40B at M = 32768
    for bad, ax in (((131073, 16, 16), "M"), ((1, 131088, 16), "N"), ((1, 16, 131088), "K")):
        for scaling in ("tensorwise", "rowwise"):
            with pytest.raises(UnsupportedShape, match=f"{ax}={bad['MNK'.index(ax)]} is outside the range"):
                p.plan(*bad, True, scaling)
    assert p.plan(4000, 16, 65536, True).splits == 2  # open (u = 2), among the last pairs recorded
    with pytest.raises(UnsupportedShape, match=r"up to 25 slices fit the K and workspace bounds.*not in the "
                                               r"profile's recorded tables"):
        partial_profile().plan(2, 1536, 65536, True)  # open, in the plan, not in that table
    with pytest.raises(UnsupportedShape, match=r"not in the profile's recorded tables \(the complete table's plan "
                                               r"holds N <= 65536 and K <= 65536 only\)") as e:
        p.plan(1, 16, 65552, True)  # K beyond the complete record's grid
    assert e.value.reason == "outside-domain"  # the split region's recorded domain ends with the plans
    with pytest.raises(UnsupportedShape, match=r"plan holds N <= 65536 and K <= 65536 only"):
        p.plan(1, 65552, 6144, True)  # N beyond it
    with pytest.raises(UnsupportedShape) as e:
        partial_profile().plan(2, 1536, 65536, True)
    assert "plan holds" not in str(e.value) and e.value.reason == "unrecorded"  # inside the plan: only not recorded




def _assert_table_answers(tmp_path, name, plan, ask, pairs, ks, combos):
    """The merged table ``name`` (in tmp_path) gives, through SplitKRule, the split count ``ask``
    answered at every (M, N) of ``pairs``, K of ``ks`` and combination of ``combos`` it answered."""
    rule = SplitKRule("rule", domain={"M": [1, 4096], "N": [16, 64], "K": [16, 8192]},
                      params={"bound": plan["bound"], "complete_file": name}, base_dir=str(tmp_path))
    for M, N in pairs:
        for K in ks:
            for c in combos:
                want = ask(M, N, K, c)
                if want is not None:
                    assert rule.splits(M, N, K, c["fast_accum"], (c["a_dtype"], c["b_dtype"], c["out_dtype"])) == want[4]


def _assert_fake_answer(rule, M, N, K, c):
    """``rule`` gives _fake's split count for the call, or refuses it as having no algorithm where _fake has none."""
    combo = (c["a_dtype"], c["b_dtype"], c["out_dtype"])
    want = _fake(M, N, K, c)
    if want is None:
        with pytest.raises(UnsupportedShape, match="no algorithm"):
            rule.splits(M, N, K, c["fast_accum"], combo)
    else:
        assert rule.splits(M, N, K, c["fast_accum"], combo) == want[4], (M, N, K, c)


def test_enumerator_resumes_and_merges(tmp_path):
    """Workers stopped part-way (and one cut inside a line) continue where they stopped, here with
    another number of workers; the merged table answers every open shape as the heuristic did."""
    rec = str(tmp_path / "rec")
    plan = _small_plan()
    se._start(rec, plan)
    pairs = se.open_pairs(plan)
    assert len(pairs) > 100 and all(split_bound(plan["bound"], M, N, plan["k_max"]) >= 2 for M, N in pairs)
    asked = []

    def ask(M, N, K, c):
        asked.append((M, N))
        return _fake(M, N, K, c)

    assert [se.run_worker(rec, w, 3, ask, max_pairs=2) for w in range(3)] == [2, 2, 2]
    part = os.path.join(rec, "part-001-of-003.jsonl")
    with open(part, "a") as f:
        f.write('{"M": 99, "N": 16, "runs": [[3')  # interrupted mid-line
    assert se.status(rec)["pairs_done"] == 6
    first = len(asked)
    assert se.run_worker(rec, 1, 3, ask, max_pairs=1) == 1  # the cut line is dropped, its worker goes on
    done = 1 + sum(se.run_worker(rec, w, 2, ask) for w in range(2))
    assert done == len(pairs) - 6
    assert len(asked) - first == done * len(se.k_grid(plan)) * len(plan["combos"])  # nothing asked twice
    assert sum(se.run_worker(rec, w, W, ask) for W in (2, 3) for w in range(W)) == 0
    st = se.status(rec)
    assert st["pairs_done"] == st["pairs_total"] == len(pairs)
    out = str(tmp_path / "t.npz")
    sizes = se.merge(rec, out)
    assert sizes["pairs"] == len(pairs)
    assert load_complete("t.npz", str(tmp_path)).meta["store"] == "grid"  # _fake breaks the K law at K = 256 j
    rule = SplitKRule("rule", domain={"M": [1, 4096], "N": [16, 64], "K": [16, 8192]},
                      params={"bound": plan["bound"], "complete_file": "t.npz"}, base_dir=str(tmp_path))
    checked = 0
    for M, N in pairs[::7]:
        for K in se.k_grid(plan)[::5]:
            for c in plan["combos"][::3]:
                _assert_fake_answer(rule, M, N, K, c)
                checked += 1
    assert checked > 1000
    with pytest.raises(UnsupportedShape, match="not in the profile's recorded tables"):
        rule.splits(1, 16, 6416, True)  # past the grid


def test_enumerator_takes_the_first_widths_first_and_mixes_orders(tmp_path):
    """Pairs of the listed N are asked first; a run in another order (same number of workers)
    skips what the first run finished and asks nothing twice."""
    rec = str(tmp_path / "rec")
    plan = _small_plan()
    se._start(rec, plan)
    asked = []

    def ask(M, N, K, c):
        asked.append((M, N))
        return _fake(M, N, K, c)

    assert sum(se.run_worker(rec, w, 2, ask, max_pairs=3, first_n=(48,)) for w in range(2)) == 6
    assert {n for _, n in dict.fromkeys(asked)} == {48}
    n48 = sum(1 for p in se.open_pairs(plan) if p[1] == 48)
    rest = sum(se.run_worker(rec, w, 2, ask) for w in range(2))
    assert rest == len(se.open_pairs(plan)) - 6 and n48 > 6
    per_pair = len(se.k_grid(plan)) * len(plan["combos"])
    assert len(asked) == len(se.open_pairs(plan)) * per_pair  # nothing asked twice
    assert se.status(rec)["pairs_done"] == len(se.open_pairs(plan))


def test_enumerator_refuses_another_plan(tmp_path):
    rec = str(tmp_path / "rec")
    se._start(rec, _small_plan())
    se._start(rec, _small_plan())  # the same plan continues
    with pytest.raises(Exception, match="holds another plan"):
        se._start(rec, se.default_plan(n_max=64, k_max=6416))


def test_splitk_imports_no_schedule():
    """The rule lives in cpemu.splitk; cpemu.schedule re-exports it (one direction only)."""
    import cpemu.splitk
    import cpemu.splitk_complete

    for mod in (cpemu.splitk, cpemu.splitk_complete):
        src = open(mod.__file__).read()
        assert "schedule" not in "".join(line for line in src.splitlines() if "import" in line)
    from cpemu import schedule

    assert schedule.UnsupportedShape is cpemu.UnsupportedShape is cpemu.splitk.UnsupportedShape


def _record_folders(tmp_path):
    """cpemu record's raw and profile folders, raw holding recorded heuristic answers as its split-K step reads
    them (grid, held-out, truth shapes)."""
    import gzip
    import shutil

    raw, prof = tmp_path / "raw", tmp_path / "profile"
    raw.mkdir()
    prof.mkdir()
    for src, dst in (("heur_truth", "splitk_grid"), ("heur_splitk2", "splitk_heldout"), ("splitk_evo2", "splitk_truth")):
        with gzip.open(os.path.join(DATA, f"{src}.json.gz")) as f, open(raw / f"{dst}.json", "wb") as g:
            shutil.copyfileobj(f, g)
    return raw, prof


def test_record_writes_the_laws_into_a_profile(tmp_path):
    """cpemu record's split-K step (no GPU needed past the recorded answers): the laws checked, the
    point table written, and the profile it builds answers as the recorded heuristic did."""
    from cpemu.profile import Profile
    from cpemu.recording.record import _set_split_k, _split_k_tables

    raw, prof = _record_folders(tmp_path)
    name = "hopper-test-torch"
    rule, params = _split_k_tables(str(raw), str(prof), name, None, 1, {}, lambda *_: None)
    assert params["bound"] == BOUND and sum(c["queries"] for c in rule["checks"].values()) == 68892
    data = json.loads(json.dumps(PROFILE.data))
    data["name"] = name
    _set_split_k(data, params, ("splitk2",))
    with open(prof / f"{name}.json", "w") as f:
        json.dump(data, f)
    p = Profile.from_file(str(prof / f"{name}.json"))
    n = 0
    for c, M, N, K, ch in rows_of(os.path.join(DATA, "heur_splitk2.json.gz")):
        assert p.plan(M, N, K, c["fast_accum"], c["scale_mode"], c["a_dtype"], c["b_dtype"],
                      c["out_dtype"]).splits == _slices(K, int(ch, 36))
        n += 1
    assert n == 56
    with pytest.raises(UnsupportedShape, match="not in the profile's recorded tables"):
        p.plan(3, 48, 9008, True)
    # rowwise never splits, but with bias and fast accumulation where K could split the heuristic may
    # have no algorithm (torch raises): the recorded profile refuses there, and answers elsewhere
    with pytest.raises(UnsupportedShape, match="may have no algorithm") as e:
        p.call(2, 14336, 8192, "e4m3", "e4m3", "bfloat16", "rowwise", True, "bfloat16")
    assert e.value.reason == "maybe-no-algorithm"
    assert p.call(2, 14336, 8192, "e4m3", "e4m3", "bfloat16", "rowwise", False, "bfloat16").plan.splits
    assert p.call(2, 14336, 8192, "e4m3", "e4m3", "bfloat16", "rowwise", True, None).plan.splits
    assert p.call(2, 14336, 4096, "e4m3", "e4m3", "bfloat16", "rowwise", True, "bfloat16").plan.splits


def test_record_with_a_rowwise_bias_record_names_its_table(tmp_path, monkeypatch):
    """cpemu record --complete-rowbias: the rowwise-bias record (here asked of a made-up heuristic on a small
    plan, in place of the GPU) becomes a table of its own, which the new profile's no_algorithm section names
    (not the tensorwise params); the profile then answers a recorded shape where that heuristic has an
    algorithm, refuses it as no-algorithm where it has none, and refuses the region's other shapes as
    maybe-no-algorithm."""
    from cpemu.profile import Profile
    from cpemu.recording import record as rc

    plan = se.default_plan(n_max=64, k_max=6400, k_step=16, bound=_small_plan()["bound"], options="rowwise-bias")
    asked = []

    def fake_complete(raw, prof_dir, name, bound, seconds, jobs, prov, echo, options="tensorwise"):
        asked.append((options, seconds))
        rec = os.path.join(raw, "rowbias_complete")
        se._start(rec, plan)
        se.run_worker(rec, 0, 1, _fake)
        se.merge(rec, os.path.join(prof_dir, f"{name}.rowbias-complete.npz"))
        return f"{name}.rowbias-complete.npz"

    monkeypatch.setattr(rc, "_complete_table", fake_complete)
    raw, prof = _record_folders(tmp_path)
    name = "hopper-test-torch"
    _, params = rc._split_k_tables(str(raw), str(prof), name, None, 1, {}, lambda *_: None, rowbias_seconds=5)
    assert asked == [("rowwise-bias", 5)] and params["rowbias_file"] == f"{name}.rowbias-complete.npz"
    data = json.loads(json.dumps(PROFILE.data))
    data["name"] = name
    rc._set_split_k(data, params, ("splitk2",))
    assert "rowbias_file" not in data["modes"]["tensorwise"]["split_k"]["params"]
    assert data["modes"]["rowwise"]["split_k"]["no_algorithm"]["complete_file"] == f"{name}.rowbias-complete.npz"
    with open(prof / f"{name}.json", "w") as f:
        json.dump(data, f)
    p = Profile.from_file(str(prof / f"{name}.json"))
    seen = {"answered": 0, "no-algorithm": 0}
    for M, N in se.open_pairs(plan)[::3]:
        for K in se.k_grid(plan)[::7]:
            for c in plan["combos"]:
                a, b, out = c["a_dtype"], c["b_dtype"], c["out_dtype"]
                if _fake(M, N, K, c) is None:
                    with pytest.raises(UnsupportedShape, match="no algorithm") as e:
                        p.call(M, N, K, a, b, out, "rowwise", True, out)
                    assert e.value.reason == "no-algorithm", (M, N, K, c)
                    seen["no-algorithm"] += 1
                else:
                    assert p.call(M, N, K, a, b, out, "rowwise", True, out).plan.splits, (M, N, K, c)
                    seen["answered"] += 1
    assert seen["answered"] > 100 and seen["no-algorithm"] > 0, seen
    with pytest.raises(UnsupportedShape) as e:  # in the region, beyond the record's plan
        p.call(2, 14336, 8192, "e4m3", "e4m3", "bfloat16", "rowwise", True, "bfloat16")
    assert e.value.reason == "maybe-no-algorithm"


def _fake_fast_same(M, N, K, c):
    """_fake, with fast accumulation changing nothing."""
    return _fake(M, N, K, dict(c, fast_accum=True))


def test_enumerator_fast_law(tmp_path):
    """With the fast-accumulation law, pairs with M <= 32 ask only the fast-accumulation
    combinations (every 8th pair in full, compared), copy them to the others, and the merged table
    answers as the heuristic did; a difference at a checked pair is written as a violation, its
    asked answers stand, and the law is not used again on that record."""
    plan = _small_plan()
    per_col = len(se.k_grid(plan))
    n_fast = sum(c["fast_accum"] for c in plan["combos"])
    partner = se.fast_partners(plan["combos"])
    assert n_fast * 2 == len(plan["combos"]) and all(plan["combos"][partner[j]]["fast_accum"] for j in range(18))
    rec = str(tmp_path / "rec")
    se._start(rec, plan)
    asked = []

    def ask(M, N, K, c):
        asked.append((M, N, c["fast_accum"]))
        return _fake_fast_same(M, N, K, c)

    pairs = se.open_pairs(plan)
    assert sum(se.run_worker(rec, w, 2, ask, fast_law=True) for w in range(2)) == len(pairs)
    want = 0
    for M, N in pairs:
        full = M > se.FAST_LAW_M_MAX or se._law_check_pair(M, N)
        want += per_col * (len(plan["combos"]) if full else n_fast)
    assert len(asked) == want < len(pairs) * per_col * len(plan["combos"])
    st = se.status(rec)
    assert st["fast_law"]["derived"] > 0 and st["fast_law"]["checked"] > 0 and not st["fast_law"]["violated"]
    out = str(tmp_path / "t.npz")
    se.merge(rec, out)
    _assert_table_answers(tmp_path, "t.npz", plan, _fake_fast_same, pairs[::5], se.k_grid(plan)[::7], plan["combos"])

    # the law broken at the first checked pair: recorded as a violation, the law dropped after it
    rec2 = str(tmp_path / "rec2")
    se._start(rec2, plan)
    first_check = next(p for p in pairs if p[0] <= se.FAST_LAW_M_MAX and se._law_check_pair(*p))
    asked.clear()
    assert se.run_worker(rec2, 0, 1, ask=lambda M, N, K, c: _fake(M, N, K, c), fast_law=True) == len(pairs)
    assert se.law_violated(rec2) and se.status(rec2)["fast_law"]["violated"]
    _, done = se.read_part(os.path.join(rec2, "part-000-of-001.jsonl"))
    keys = list(done)
    after = keys[keys.index(first_check) + 1:]
    lines = [json.loads(x) for x in open(os.path.join(rec2, "part-000-of-001.jsonl")) if '"M"' in x and '"runs"' in x]
    assert not any(x.get("law") == "derived" for x in lines if (x["M"], x["N"]) in set(after))
    se.merge(rec2, str(tmp_path / "t2.npz"))
    _assert_table_answers(tmp_path, "t2.npz", plan, _fake, [first_check], se.k_grid(plan), plan["combos"])
    # the pairs derived before the violation are not trusted: left out of the table, asked again in full
    before = {(x["M"], x["N"]) for x in lines if x.get("law") == "derived"}
    assert before and se.untrusted(rec2) == before
    t2 = load_complete("t2.npz", str(tmp_path))
    assert len(t2.pairs) == len(pairs) - len(before) and not t2.marks["fast"].tolist().count(1)
    # asked again by two workers, into other part files than the derived answers
    assert sum(se.run_worker(rec2, w, 2, ask=lambda M, N, K, c: _fake(M, N, K, c)) for w in range(2)) == len(before)
    assert se.untrusted(rec2) == set()
    se.merge(rec2, str(tmp_path / "t3.npz"))
    assert len(load_complete("t3.npz", str(tmp_path)).pairs) == len(pairs)
    _assert_table_answers(tmp_path, "t3.npz", plan, _fake, sorted(before)[::3], se.k_grid(plan)[::9], plan["combos"])


#: pairs with M <= 32 of the complete record asked with and without fast accumulation
FAST_LAW_EVIDENCE_PAIRS = 4161


def test_fast_law_holds_on_the_recorded_answers():
    """The fast-accumulation law's evidence (splitk_enum.FAST_LAW_M_MAX): in the split region with
    M <= 32, fast accumulation changes no recorded tensorwise answer (dense samples, with and without
    bias, and the pairs of the complete record it did not decide),
    and at M = 44 it does, so the law is not stretched."""
    from cpemu.recording.splitk_rule import BOUND

    shapes_checked, first_diff_m = 0, []
    for name in ("gran", "large"):
        z = np.load(os.path.join(DATA, "measured", f"{name}.npz"))
        shapes, ids, combos = z["shapes"], z["ids"], json.loads(str(z["combos"]))
        key = [(c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"], c.get("bias"), c.get("scale_mode"))
               for c in combos]
        region = np.array([split_bound(BOUND, int(M), int(N), int(K)) >= 2 for M, N, K in shapes])
        diff = np.zeros(len(shapes), bool)
        for j, k in enumerate(key):
            other = k[:3] + (False,) + k[4:]
            if k[3] and k[5] == "tensorwise" and other in key:  # rowwise never splits
                diff |= ids[:, j] != ids[:, key.index(other)]
        small = region & (shapes[:, 0] <= se.FAST_LAW_M_MAX)
        assert not (diff & small).any(), name
        shapes_checked += int(small.sum())
        first_diff_m.append(int(shapes[diff & region, 0].min()))
    assert shapes_checked == 48684 and min(first_diff_m) == 44
    table = load_complete(PARAMS["complete_file"])
    keys = list(table.combo)
    full = _asked_in_full(table, "fast")
    pairs = 0
    for p, key in enumerate(table.pairs):
        if int(key) >> 20 > se.FAST_LAW_M_MAX or p not in full:
            continue
        for k in keys:
            if k.endswith(",promo"):
                fast = table.configs[table.column(p, table.combo[k.replace(",promo", ",fast")])]
                assert (table.configs[table.column(p, table.combo[k])] == fast).all(), (int(key) >> 20, k)
        pairs += 1
    assert pairs == FAST_LAW_EVIDENCE_PAIRS


def _fake_k_law(M, N, K, c):
    """_fake, depending on K only through the K law's block and alignment class."""
    return _fake(M, N, 256 * (-(-K // 128)) + min(K & -K, 64), c)


def test_k_law_rep():
    """The representative shares the 128-wide block and the alignment class, and is the smallest such K."""
    for K in range(16, 4096 + 1, 16):
        r = se.k_law_rep(K)
        assert -(-r // 128) == -(-K // 128) and min(r & -r, 64) == min(K & -K, 64) and r <= K
        assert all(-(-k // 128) != -(-K // 128) or min(k & -k, 64) != min(K & -K, 64) for k in range(16, r, 16))
    assert [se.k_law_rep(K) for K in range(5136, 5264 + 1, 16)] == [5136, 5152, 5136, 5184, 5136, 5152, 5136, 5184, 5264]


def test_enumerator_k_law(tmp_path):
    """With the K law, a pair asks 3 of every 8 K per combination (every 16th pair all of them,
    compared) and the merged table answers as the heuristic did; an answer that breaks the law at a
    checked pair is written as a violation (law "k"), its full columns stand, and the law is not
    used again on that record, while the fast-accumulation law is unaffected."""
    plan = _small_plan()
    ks = se.k_grid(plan)
    reps = len(set(se.k_law_rep(K) for K in ks))
    assert reps * 8 == len(ks) * 3
    rec = str(tmp_path / "rec")
    se._start(rec, plan)
    asked = []

    def ask(M, N, K, c):
        asked.append((M, N))
        return _fake_k_law(M, N, K, c)

    pairs = se.open_pairs(plan)
    assert sum(se.run_worker(rec, w, 2, ask, k_law=True) for w in range(2)) == len(pairs)
    n_check = sum(se._k_law_check_pair(*p) for p in pairs)
    assert 0 < n_check < len(pairs)
    assert len(asked) == (n_check * len(ks) + (len(pairs) - n_check) * reps) * len(plan["combos"])
    st = se.status(rec)
    assert st["k_law"] == {"derived": len(pairs) - n_check, "checked": n_check, "violated": False}
    assert st["fast_law"] == {"derived": 0, "checked": 0, "violated": False}
    se.merge(rec, str(tmp_path / "t.npz"))
    assert load_complete("t.npz", str(tmp_path)).meta["store"] == "k-law"
    _assert_table_answers(tmp_path, "t.npz", plan, _fake_k_law, pairs[::5], ks, plan["combos"][::4])

    rec2 = str(tmp_path / "rec2")
    se._start(rec2, plan)
    first_check = next(p for p in pairs if se._k_law_check_pair(*p))
    assert se.run_worker(rec2, 0, 1, ask=_fake_fast_same, k_law=True, fast_law=True) == len(pairs)
    assert se.law_violated(rec2, "k") and not se.law_violated(rec2, "fast")
    lines = [json.loads(x) for x in open(os.path.join(rec2, "part-000-of-001.jsonl"))]
    viol = [x["violation"] for x in lines if "violation" in x]
    assert len(viol) == 1 and (viol[0]["M"], viol[0]["N"]) == first_check and viol[0]["law"] == "k"
    done = [x for x in lines if "runs" in x]
    i = [(x["M"], x["N"]) for x in done].index(first_check)
    assert all("k_law" not in x for x in done[i + 1:]) and any(x.get("law") == "derived" for x in done[i + 1:])
    se.merge(rec2, str(tmp_path / "t2.npz"))
    _assert_table_answers(tmp_path, "t2.npz", plan, _fake_fast_same, [first_check], ks, plan["combos"])


#: pairs of the complete record asked at every K (before the K law, and its checked pairs)
K_LAW_EVIDENCE_PAIRS = 4626


def test_k_law_holds_on_the_recorded_answers():
    """The K law's evidence (splitk_enum.K_LAW_BLOCK): every group of measured shapes with the same
    M, N, 128-wide K block and alignment class has one answer per combination (dense samples, every
    combination, and the complete record); a 256-wide block or alignment classes up to 32 break it."""
    def groups(shapes, block, cap):
        g = {}
        for i, (M, N, K) in enumerate(shapes.tolist()):
            g.setdefault((M, N, -(-K // block), min(K & -K, cap)), []).append(i)
        return [v for v in g.values() if len(v) > 1]

    z = np.load(os.path.join(DATA, "measured", "gran.npz"))
    shapes, ids = z["shapes"], z["ids"]
    law = groups(shapes, se.K_LAW_BLOCK, se.K_LAW_ALIGN_CAP)
    assert len(law) == 37584 and sum(map(len, law)) == len(shapes) == 100224
    assert all((ids[v] == ids[v[0]]).all() for v in law)
    for block, cap in ((256, 64), (128, 32)):
        assert sum((ids[v] != ids[v[0]]).any() for v in groups(shapes, block, cap)) > 100
    table = load_complete(PARAMS["complete_file"])
    ks = table.meta["k0"] + table.meta["k_step"] * np.arange(table.meta["nk"])
    rep = np.searchsorted(ks, [se.k_law_rep(int(K)) for K in ks])
    assert (ks[rep] == [se.k_law_rep(int(K)) for K in ks]).all() and len(set(rep.tolist())) == 1416
    full = _asked_in_full(table, "k")
    cols = 0
    for p, key in enumerate(table.pairs):
        if p not in full:
            continue
        for j in table.combo.values():
            col = table.column(p, j)
            assert (col == col[rep]).all(), (int(key) >> 20, int(key) & 0xFFFFF, j)
            cols += 1
    assert cols == K_LAW_EVIDENCE_PAIRS * 18


def test_bound_holds_on_every_answer_of_the_complete_table():
    """The split bound u on every answer the shipped complete table holds: every recorded pair, every
    combination, every K of the grid (65,320 x 18 x 3,776 answers): none splits into more than u.

    Read from the stored runs: a stored slot is one alignment class of one 128-wide K block, and the
    K bound is the same for every K of a block (2560 is 20 blocks), so a run's smallest bound is the
    one of its first block, or of the grid's first block where the run crosses into the next class.
    A run stored as SAME is its base combination's answer at the same K, checked with the base."""
    table = load_complete(PARAMS["complete_file"])
    m = table.meta
    assert m["store"] == "k-law" and BOUND["k_per_split"] % 128 == 0 and BOUND["n_align"] == 32
    b0, nk = (m["k0"] - 1) // 128, m["nk"]
    nb = (m["k0"] + m["k_step"] * (nk - 1) - 1) // 128 - b0 + 1
    slots = 3 * nb
    assert len(np.unique(table.index)) == slots and table.index.max() == slots - 1  # every K of the grid has a slot
    keys = table.pairs.astype(np.int64)
    M, N = keys >> 20, keys & 0xFFFFF
    room = (BOUND["workspace_bytes"] - BOUND["workspace_reserve"]) // (BOUND["bytes_per_partial"] * M * (-(-N // 32) * 32))
    splits = table.configs[:, table.split_col].astype(np.int64)
    from cpemu.splitk_complete import SAME
    answers = over = 0
    for j in table.combo.values():
        off, end, cfg = (x.astype(np.int64) for x in table.runs[j])
        pair = np.repeat(np.arange(len(keys)), np.diff(off))
        start = np.concatenate(([0], end[:-1]))
        start[off[:-1][np.diff(off) > 0]] = 0  # each pair's runs start at slot 0
        assert (end[off[1:] - 1] == slots).all() and (start < end).all()  # the runs cover every slot once
        answers += int((end - start).sum()) * nk // slots
        block = np.where(start // nb == (end - 1) // nb, start % nb, 0) + b0
        u = np.maximum(np.minimum(-(-(128 * (block + 1)) // BOUND["k_per_split"]) - 1, room[pair]), 1)
        stored = (cfg != SAME) & (cfg != NONE)
        over += int((splits[np.where(stored, cfg, 0)] > u)[stored].sum())
    assert over == 0
    assert answers == RECORD_PAIRS * 18 * nk == 4439669760


def test_k_law_storage_order():
    """The shipped table is stored in K-law order: each slot holds the K of one 128-wide block and
    one alignment class, every slot is used, and the stored column expands to the grid."""
    from cpemu.splitk_complete import stored_index

    table = load_complete(PARAMS["complete_file"])
    assert table.meta["store"] == "k-law"
    m = table.meta
    ks = m["k0"] + m["k_step"] * np.arange(m["nk"])
    idx = stored_index(m)
    assert sorted(set(idx.tolist())) == list(range(1416))
    slot = {}
    for K, i in zip(ks.tolist(), idx.tolist()):
        slot.setdefault(i, set()).add((-(-K // 128), min(K & -K, 64)))
    assert all(len(v) == 1 for v in slot.values())
    assert stored_index(dict(m, store="grid")) is None


def test_enumerator_continues_a_table(tmp_path):
    """A record continued from an earlier merged table (``run --table``, ``merge --table``) asks
    none of its pairs again, and merges to the table one record of every pair gives, laws' marks included."""
    from cpemu.splitk_complete import MARK_ASKED, MARK_CHECKED, MARK_DERIVED, NONE

    plan = _small_plan()
    pairs = se.open_pairs(plan)
    one, first, second = (str(tmp_path / d) for d in ("one", "first", "second"))
    for rec in (one, first, second):
        se._start(rec, plan)
    ask = lambda M, N, K, c: _fake_k_law(M, N, K, dict(c, fast_accum=True))  # noqa: E731
    assert sum(se.run_worker(one, w, 2, ask, fast_law=True, k_law=True) for w in range(2)) == len(pairs)
    se.merge(one, str(tmp_path / "one.npz"))
    assert sum(se.run_worker(first, w, 2, ask, max_pairs=20, fast_law=True, k_law=True) for w in range(2)) == 40
    se.merge(first, str(tmp_path / "first.npz"))
    t1 = load_complete("first.npz", str(tmp_path))
    skip = frozenset((k >> 20, k & 0xFFFFF) for k in t1.pairs.tolist())
    asked = []

    def ask2(M, N, K, c):
        asked.append((M, N))
        return ask(M, N, K, c)

    assert sum(se.run_worker(second, w, 3, ask2, fast_law=True, k_law=True, skip=skip) for w in range(3)) == len(pairs) - 40
    assert not set(asked) & skip
    se.merge(second, str(tmp_path / "both.npz"), base=str(tmp_path / "first.npz"))
    a, b = load_complete("one.npz", str(tmp_path)), load_complete("both.npz", str(tmp_path))
    assert (a.pairs == b.pairs).all() and a.meta["store"] == b.meta["store"] == "k-law"
    for law in ("fast", "k"):
        assert (a.marks[law] == b.marks[law]).all()
        assert a.meta[f"{law}_law"] == b.meta[f"{law}_law"]
    assert set(a.marks["k"].tolist()) == {MARK_DERIVED, MARK_CHECKED}  # the K law on every pair
    assert MARK_DERIVED in a.marks["fast"] and (MARK_ASKED in a.marks["fast"]) == any(M > 32 for M, _ in pairs)
    for p in range(len(a.pairs)):
        for j in range(len(a.meta["combos"])):
            ca, cb = a.column(p, j), b.column(p, j)
            some = ca != NONE
            assert (some == (cb != NONE)).all() and (a.configs[ca[some]] == b.configs[cb[some]]).all()
    with pytest.raises(Exception, match="in .*first.npz and in the part files"):
        se.merge(first, str(tmp_path / "twice.npz"), base=str(tmp_path / "first.npz"))
    other = str(tmp_path / "other")
    se._start(other, se.default_plan(n_max=64, k_max=6528, k_step=16, bound=plan["bound"]))
    with pytest.raises(Exception, match="is a table of another plan"):
        se.merge(other, str(tmp_path / "x.npz"), base=str(tmp_path / "first.npz"))


def test_refusals_name_their_reason():
    """Each refusal of the split-K rule carries the rule that made it (UnsupportedShape.reason)."""
    def why(*args, profile=PROFILE, **kw):
        with pytest.raises(UnsupportedShape) as e:
            profile.call(*args, **kw)
        return e.value.reason

    assert why(*UNRECORDED, profile=partial_profile()) == "unrecorded"
    assert why(200000, 16, 16) == "outside-domain"
    assert why(10, 656, 7856, scaling="rowwise", fast_accum=True, bias_dtype="bfloat16") == "no-algorithm"  # N < 8192
    assert why(10, 8192, 7856, scaling="rowwise", fast_accum=True, bias_dtype="bfloat16") == "maybe-no-algorithm"
    # every split count of the shipped tables is verified now: a profile that has checked fewer
    # counts, and has seen no tail cut, refuses the answers above its counts for that reason
    import copy

    from cpemu.profile import Profile

    data = copy.deepcopy(PROFILE.data)
    sk = data["modes"]["tensorwise"]["split_k"]
    sk["params"]["verified_splits"] = {"10": 6, "47": 6, "448": 2}
    sk["tail"]["verified"] = {}
    fewer = Profile("fewer-checked", data)
    table = load_complete(PARAMS["complete_file"])
    f = table.meta["fields"]
    ks = table.meta["k0"] + table.meta["k_step"] * np.arange(table.meta["nk"])
    over = np.array([not _checked(sk["params"]["verified_splits"], t, s)  # configurations above their tile's
                     for t, s in table.configs[:, [f.index("tile_id"), f.index("splitk_num")]].tolist()])
    over_ids = np.nonzero(over)[0]  # verified count
    unverified = {}
    for j, combo in enumerate(table.meta["combos"]):  # per combination, the first such recorded answer
        for p in range(len(table.pairs)):
            hit = np.isin(table.column(p, j), over_ids)
            if hit.any():
                unverified[combo] = (int(table.pairs[p]), int(ks[np.argmax(hit)]))
                break
    assert len(unverified) == 18, "no unverified split in the table"
    for combo, (key, K) in unverified.items():
        a, b, out, acc = combo.split(",")
        args = (key >> 20, key & 0xFFFFF, K, a, b, out)
        with pytest.raises(UnsupportedShape) as e:
            fewer.call(*args, fast_accum=acc == "fast")
        assert e.value.reason == "unverified-split"
        assert PROFILE.call(*args, fast_accum=acc == "fast").plan.splits > 2
    with pytest.raises(UnsupportedShape, match="last 16 elements of such a K out") as e:
        fewer.call(1, 16, 43536)  # tile 10 at 17 slices, where the tail rule cuts K: not seen by this profile
    assert e.value.reason == "unverified-split"
    assert PROFILE.call(1, 16, 43536).plan.splits == 17
    with pytest.raises(ValueError, match="reason must be one of"):
        UnsupportedShape("x", "because")


def test_table_bytes_do_not_depend_on_the_order_of_configurations(tmp_path):
    """write_table lists the configurations in sorted order: the same answers, with the
    configurations met in another order (another order of merges), give the same bytes."""
    from cpemu.splitk_complete import NONE, write_table

    plan = _small_plan()
    nk = len(se.k_grid(plan))
    keys = [combo_key(c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"]) for c in plan["combos"]]
    configs = [(66, 10, 36, 3, 2, 2, 0, 1, 0), (66, 47, 36, 4, 3, 2, 0, 0, 0), (66, 10, 36, 3, 1, 0, 0, 1, 0)]
    runs = {(1, 16): [nk // 3, 0, nk, 1], (2, 32): [nk // 2, 2, nk - 5, NONE, nk, 0]}
    order = [2, 0, 1]  # configurations[order[i]] becomes id i
    back = {old: new for new, old in enumerate(order)}
    renumber = lambda r: [back[v] if i % 2 and v != NONE else v for i, v in enumerate(r)]
    sizes = []
    for name, cfgs, rr in (("a.npz", configs, runs),
                           ("b.npz", [configs[i] for i in order], {mn: renumber(r) for mn, r in runs.items()})):
        meta = {"k0": plan["k0"], "k_step": plan["k_step"], "nk": nk, "combos": keys, "store": "grid",
                "fields": list(se.CONFIG_FIELDS), "bound": plan["bound"], "n_max": plan["n_max"]}
        sizes.append(write_table(str(tmp_path / name), meta, {mn: {k: r for k in keys} for mn, r in rr.items()},
                                 cfgs))
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    assert load_complete("a.npz", str(tmp_path)).configs.tolist() == sorted(map(list, configs))


def test_workers_spread_over_the_visible_gpus(monkeypatch):
    """On a host of several GPUs worker w takes GPU w % n (its CUDA_VISIBLE_DEVICES), in the order
    CUDA_VISIBLE_DEVICES lists them; on one GPU, or none, the workers keep the default device."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5,7")
    gpus = se.visible_gpus()
    assert gpus == ["3", "5", "7"]
    assert [se.worker_gpu(w, gpus) for w in range(7)] == ["3", "5", "7", "3", "5", "7", "3"]
    assert se.worker_gpu(4, ["0"]) is None and se.worker_gpu(0, []) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert se.visible_gpus() == []


def _record_table(tmp_path, name, plan, ask=_fake):
    """A record of ``plan`` asked of ``ask`` by one worker, merged into ``tmp_path/name``."""
    rec = str(tmp_path / f"rec-{name}")
    se._start(rec, plan)
    se.run_worker(rec, 0, 1, ask)
    assert se.status(rec)["pairs_done"] == len(se.open_pairs(plan)) > 0
    se.merge(rec, str(tmp_path / name))
    return rec


def test_ranges_beside_the_default_plan_are_tables_of_their_own(tmp_path):
    """K above the default plan's (``--k-min``) and N above it (``--n-min``) are recorded as plans of
    their own, merged into tables of their own; a profile listing the tables in ``complete_file``
    answers from each in its range, and names every range where a shape lies in none."""
    base = _small_plan()
    high_k = se.default_plan(n_max=64, k_max=7680, k_step=16, bound=base["bound"], k_min=6416)
    high_n = se.default_plan(n_max=128, k_max=6400, k_step=16, bound=base["bound"], n_min=80)
    assert high_k["k0"] == 6416 and "n_min" not in high_k and high_n["n_min"] == 80 and "n_min" not in base
    assert se.open_pairs(high_k) == se.open_pairs(base)
    assert {N for _, N in se.open_pairs(high_n)} == set(range(80, 129, 16))
    for name, plan in (("a.npz", base), ("b.npz", high_k), ("c.npz", high_n)):
        rec = _record_table(tmp_path, name, plan)
    meta = load_complete("c.npz", str(tmp_path)).meta
    assert meta["n_min"] == 80 and meta["n_max"] == 128
    # a record of one range does not merge into the table of another
    with pytest.raises(click.ClickException, match="is a table of another plan"):
        se.merge(rec, str(tmp_path / "x.npz"), base=str(tmp_path / "a.npz"))
    rule = SplitKRule("rule", domain={"M": [1, 4096], "N": [16, 128], "K": [16, 7680]},
                      params={"bound": base["bound"], "complete_file": ["a.npz", "b.npz", "c.npz"]},
                      base_dir=str(tmp_path))
    checked = 0
    for plan in (base, high_k, high_n):
        for M, N in se.open_pairs(plan)[::5]:
            for K in se.k_grid(plan)[::7]:
                c = plan["combos"][(M + K // 16) % len(plan["combos"])]
                _assert_fake_answer(rule, M, N, K, c)
                checked += 1
    assert checked > 300
    with pytest.raises(UnsupportedShape, match=r"the complete tables' plans hold N 16\.\.64 with K 5136\.\.6400; "
                                               r"N 16\.\.64 with K 6416\.\.7680; N 80\.\.128 with K 5136\.\.6400 only"):
        rule.splits(1, 96, 7040, True)  # N of the third range, K of the second: in no table
    one = SplitKRule("rule", domain=rule.domain, params={"bound": base["bound"], "complete_file": "a.npz"},
                     base_dir=str(tmp_path))
    with pytest.raises(UnsupportedShape, match=r"the complete table's plan holds N <= 64 and K <= 6400 only"):
        one.splits(1, 16, 7040, True)


def test_a_rowwise_bias_plan_records_whether_an_algorithm_exists_in_a_table_of_its_own(tmp_path):
    """``run --options rowwise-bias``: the rowwise combinations with bias and fast accumulation (the
    ones where the heuristic may have none), each pair at every K; merged into a table that says so
    and that a tensorwise record does not merge into."""
    base = _small_plan()
    plan = se.default_plan(n_max=64, k_max=6400, k_step=16, bound=base["bound"], options="rowwise-bias")
    assert plan["options"] == "rowwise-bias" and "options" not in base
    assert [(c["a_dtype"], c["b_dtype"], c["out_dtype"]) for c in plan["combos"]] == [
        (a, b, o) for a, b in (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")) for o in ("bfloat16", "float16")]
    assert all(c["scale_mode"] == "rowwise" and c["bias"] and c["fast_accum"] for c in plan["combos"])
    asked = []

    def ask(M, N, K, c):
        asked.append(c)
        return _fake(M, N, K, c)

    rec = _record_table(tmp_path, "rb.npz", plan, ask)
    assert {json.dumps(c, sort_keys=True) for c in asked} == {json.dumps(c, sort_keys=True) for c in plan["combos"]}
    t = load_complete("rb.npz", str(tmp_path))
    assert t.meta["options"] == "rowwise-bias" and len(t.meta["combos"]) == 6
    none = 0
    for M, N in se.open_pairs(plan)[::3]:
        for K in se.k_grid(plan)[::11]:
            for c in plan["combos"]:
                key = combo_key(c["a_dtype"], c["b_dtype"], c["out_dtype"], True)
                got, want = t.config(M, N, K, key), _fake(M, N, K, c)
                if want is None:
                    assert isinstance(got, str) and got == "x", (M, N, K, c, got)  # no algorithm
                    none += 1
                else:
                    assert list(got) == list(want[:len(got)]), (M, N, K, c, got)
    assert none > 0
    # the profile's no_algorithm section reads the table: decided where recorded, refused where not
    spec = {"bound": plan["bound"], "bound_at_least": 2, "complete_file": "rb.npz"}
    decided = 0
    for M, N in se.open_pairs(plan)[::4]:
        for K in se.k_grid(plan)[::13]:
            if _u(plan["bound"], M, N, K) < 2:
                continue
            for c in plan["combos"]:
                combo = (c["a_dtype"], c["b_dtype"], c["out_dtype"])
                got = no_algorithm(spec, M, N, K, True, True, combo, str(tmp_path))
                if _fake(M, N, K, c) is None:
                    assert got is not None and got[1] == "no-algorithm" and "torch raises" in got[0], (M, N, K, c)
                else:
                    assert got is None, (M, N, K, c, got)
                assert no_algorithm(spec, M, N, K, False, True, combo, str(tmp_path)) is None  # promoted: one
                assert no_algorithm(spec, M, N, K, True, False, combo, str(tmp_path)) is None  # no bias: one
                decided += 1
    assert decided > 100
    why, reason = no_algorithm(spec, 1, 80, 6400, True, True, ("e4m3", "e4m3", "bfloat16"), str(tmp_path))
    assert reason == "maybe-no-algorithm" and "the complete table's plan holds N <= 64" in why
    _record_table(tmp_path, "tw.npz", base)
    with pytest.raises(click.ClickException, match="is a table of another plan"):
        se.merge(rec, str(tmp_path / "x.npz"), base=str(tmp_path / "tw.npz"))
    with pytest.raises(ValueError, match="options must be one of tensorwise, rowwise-bias"):
        se.plan_combos("rowwise")


def test_plan_ranges_are_checked(tmp_path):
    """A plan's n_min and the run command's --n-min and --k-min name their rule when wrong."""
    from click.testing import CliRunner

    rec = str(tmp_path / "rec")
    os.makedirs(rec)
    for bad in (24, 8, 80):
        plan = dict(_small_plan(), n_min=bad)
        with open(os.path.join(rec, "plan.json"), "w") as f:
            json.dump(plan, f)
        with pytest.raises(click.ClickException, match=r"n_min must be a multiple of 16 from 16 to n_max = 64"):
            se.load_plan(rec)
    runner = CliRunner()
    for args, want in ((["--k-min", "6400"], "--k-min.*16 above a multiple of 128"),
                       (["--k-min", "70032", "--k-max", "65536"], "--k-min.*at most --k-max = 65536"),
                       (["--n-min", "72"], "--n-min.*multiple of 16"),
                       (["--n-min", "65552"], "--n-min.*at most --n-max = 65536")):
        r = runner.invoke(se.cli, ["run", "--dir", str(tmp_path / "r2"), *args])
        assert r.exit_code == 2 and re.search(want, " ".join(r.output.split())), (args, r.output)
        assert not os.path.exists(tmp_path / "r2" / "plan.json")


def test_profile_schema_takes_a_list_of_complete_tables():
    import copy

    from cpemu.profile import check_schema

    data = copy.deepcopy(cpemu.get_profile().data)
    par = data["modes"]["tensorwise"]["split_k"]["params"]
    par["complete_file"] = [par["complete_file"], "hopper-h200-torch.splitk-complete-k131072.npz"]
    check_schema(data, "profile", "x.json", "profile")
    for bad in ([], ["a.npz", "a.npz"], [3]):
        par["complete_file"] = bad
        with pytest.raises(ValueError, match=r"complete_file"):
            check_schema(data, "profile", "x.json", "profile")
