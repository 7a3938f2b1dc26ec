"""The recorder's sentinels: a worker asks recorded answers again as it goes, and stops where its host
answers otherwise, dropping what it wrote since its last passing check (tests/data/h200-splitk/rowbias)."""

import glob
import json
import os
import tarfile

import numpy as np
import pytest

from cpemu.recording import splitk_enum as se
from cpemu.splitk import combo_key, lookup
from cpemu.splitk_complete import expand_runs
from splitk_fixtures import fake_answer, small_plan

DATA = os.path.join(os.path.dirname(__file__), "data", "h200-splitk")
H200 = {"device_name": "NVIDIA H200", "cublaslt_version": 130100}


def _sentinels(plan, ask, n=4):
    """Questions of the small plan, answers learned from ``ask`` (a stand-in for a host's first answers)."""
    out = []
    for M, N in se.open_pairs(plan)[-n:]:
        q = {"M": M, "N": N, "K": plan["k_max"], "combo": 1}
        a = ask(M, N, q["K"], plan["combos"][1])
        q["answer"] = None if a is None else list(a[:len(se.CONFIG_FIELDS)])
        out.append(q)
    return out


def test_a_worker_whose_host_drifts_drops_its_unchecked_pairs_and_stops(tmp_path):
    rec = str(tmp_path / "rec")
    plan = small_plan()
    se._start(rec, plan)
    drift = {"on": False}

    def ask(M, N, K, c):
        a = fake_answer(M, N, K, c)
        if drift["on"] and a is not None:
            a = a[:7] + (a[7] + 1,) + a[8:]  # another custom option: what the rejected record showed
        return a

    sent = _sentinels(plan, ask)
    done = []

    def watch(M, N, K, c):  # the host drifts after the worker's fifth pair
        done.append((M, N))
        drift["on"] = drift["on"] or len(set(done) - {(q["M"], q["N"]) for q in sent}) > 5
        return ask(M, N, K, c)

    kept = se.run_worker(rec, 0, 1, watch, sentinels=[dict(q) for q in sent], sentinel_every=0.0)
    assert kept == 5  # every pair is followed by a check; the one asked while drifting is dropped
    fails = se.sentinel_failures(rec)
    assert len(fails) == 1 and fails[0]["dropped_pairs"] == 1 and fails[0]["got"] != fails[0]["want"]
    assert se.status(rec)["pairs_done"] == 5 and se.status(rec)["sentinel_failures"] == 1
    # on the same host the next run stops at its first check; on a healthy one it goes on
    assert se.run_worker(rec, 0, 1, ask, sentinels=[dict(q) for q in sent]) == 0
    assert len(se.sentinel_failures(rec)) == 2
    drift["on"] = False
    rest = se.run_worker(rec, 0, 1, ask, sentinels=[dict(q) for q in sent])
    assert rest == len(se.open_pairs(plan)) - 5
    out = str(tmp_path / "t.npz")
    assert se.merge(rec, out)["pairs"] == len(se.open_pairs(plan))


def test_a_worker_checks_before_it_stops(tmp_path):
    """A drift after the last timed check is still caught: the worker checks once more at its end."""
    rec = str(tmp_path / "rec")
    plan = small_plan()
    se._start(rec, plan)
    state = {"n": 0}

    def ask(M, N, K, c):
        a = fake_answer(M, N, K, c)
        return None if state["n"] >= 3 else a

    sent = _sentinels(plan, fake_answer)
    sent = [q for q in sent if q["answer"] is not None]
    assert sent

    def counting(M, N, K, c):
        if K == plan["k0"] and c == plan["combos"][0]:
            state["n"] += 1
        return ask(M, N, K, c)

    kept = se.run_worker(rec, 0, 1, counting, max_pairs=6, sentinels=sent, sentinel_every=1e9)
    assert kept == 0 and se.sentinel_failures(rec)[0]["dropped_pairs"] == 6


def test_without_sentinels_or_with_learned_ones_nothing_is_dropped(tmp_path):
    rec = str(tmp_path / "rec")
    plan = small_plan()
    se._start(rec, plan)
    learned = [{k: q[k] for k in ("M", "N", "K", "combo")} for q in _sentinels(plan, fake_answer)]
    assert se.run_worker(rec, 0, 2, fake_answer, sentinels=learned, sentinel_every=0.0) > 0
    assert all("answer" in q for q in learned) and se.sentinel_failures(rec) == []
    assert se.run_worker(rec, 1, 2, fake_answer) > 0 and se.status(rec)["sentinel_failures"] == 0


def test_sentinel_lines_are_checked(tmp_path):
    rec = str(tmp_path / "rec")
    se._start(rec, small_plan())
    with open(os.path.join(rec, "part-000-of-001.jsonl"), "w") as f:
        f.write('{"sentinel": {"M": 1, "N": "x"}}\n')
    with pytest.raises(Exception, match="line 1: a sentinel line holds one field, sentinel, an object with integers"):
        se.status(rec)


def test_recorded_sentinels_are_used_only_on_their_runtime():
    rb = se.default_plan(n_min=8192, options="rowwise-bias")
    got = se.sentinels_for(rb, H200)
    assert len(got) == 27 and all("answer" in q for q in got)
    other = se.sentinels_for(rb, {"device_name": "NVIDIA H100 80GB HBM3", "cublaslt_version": 130100})
    assert len(other) == 27 and not any("answer" in q for q in other)
    assert len(se.sentinels_for(se.default_plan(), H200)) == 24
    assert len(se.sentinels_for(small_plan(), H200)) == 24  # another domain, the same combinations: the questions stand


def test_rowwise_bias_sentinels_are_the_h200s_answers_and_catch_the_rejected_record(tmp_path):
    """Each rowwise-bias sentinel is the H200's answer in rowbias.npz (every field); the rejected record
    (rowbias/record.txz) answers at least a third of them otherwise, the fresh repeat (fresh.txz) none."""
    d = np.load(os.path.join(DATA, "measured", "rowbias.npz"))
    combos = json.loads(str(d["combos"]))
    shapes, ids, configs = d["shapes"].astype(int), d["ids"], d["configs"]
    plan = se.default_plan(n_min=8192, options="rowwise-bias")
    sent = se.sentinels_for(plan, H200)
    row = {tuple(s): i for i, s in enumerate(shapes.tolist())}
    for q in sent:
        j = combos.index(plan["combos"][q["combo"]])
        cid = ids[row[(q["M"], q["N"], q["K"])], j]
        assert q["answer"] == (None if cid < 0 else configs[cid][:len(se.CONFIG_FIELDS)].tolist()), q
    assert sum(q["answer"] is None for q in sent) == 18
    ks = se.k_grid(plan)
    wrong = {}
    for name in ("record", "fresh"):
        with tarfile.open(os.path.join(DATA, "rowbias", f"{name}.txz")) as t:
            t.extractall(tmp_path, filter="data")
        folder = str(tmp_path / ("rowbias" if name == "record" else "fresh"))
        answers = {}
        for p in glob.glob(os.path.join(folder, "part-*.jsonl")):
            local, done = se.read_part(p, plan)
            for mn, runs in done.items():
                answers[mn] = (runs, local)
        wrong[name] = 0
        for q in sent:
            runs, local = answers[(q["M"], q["N"])]
            r = runs[q["combo"]]
            cid = expand_runs(r)[ks.index(q["K"])]
            got = None if cid < 0 else list(local[cid])
            wrong[name] += got != q["answer"]
    assert wrong["fresh"] == 0 and wrong["record"] >= 9, wrong


def test_tensorwise_sentinels_are_the_shipped_table():
    plan = se.default_plan()
    for q in se.sentinels_for(plan, H200):
        c = plan["combos"][q["combo"]]
        g = lookup("hopper-h200-torch.splitk-complete.npz", None, q["M"], q["N"], q["K"],
                   combo_key(c["a_dtype"], c["b_dtype"], c["out_dtype"], c["fast_accum"]))
        assert q["answer"] == [int(g[f]) for f in se.CONFIG_FIELDS], q
