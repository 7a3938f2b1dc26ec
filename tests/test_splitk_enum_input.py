"""The complete split-K record's reader (cpemu.recording.splitk_enum) on bad input: corrupt part-file
lines, corrupt or missing plan.json, pairs outside the plan and unreadable tables are refused by
status, merge and run (resuming) with click.ClickException naming the file, the line and the rule;
the last line of a part file, cut off by a stopped worker, is still dropped quietly. A merge that
continues an earlier table (``merge --table``) does not expand that table all at once, and writes
the same bytes as a merge of one record of every pair."""

import json
import os
import re
import shutil

import click
import pytest
from click.testing import CliRunner

from cpemu.recording import splitk_enum as se
from splitk_fixtures import fake_answer as _fake, small_plan as _small_plan  # noqa: E402




@pytest.fixture
def rec(tmp_path):
    """A record of six finished pairs in three part files."""
    d = str(tmp_path / "rec")
    se._start(d, _small_plan())
    assert [se.run_worker(d, w, 3, _fake, max_pairs=2) for w in range(3)] == [2, 2, 2]
    return d


def _part(rec):
    return os.path.join(rec, "part-001-of-003.jsonl")


def _edit_line(path, pick, edit):
    """Replace the first line for which ``pick(line)`` holds by ``edit(line)``; its number (from 1)."""
    lines = open(path).read().splitlines(keepends=True)
    i = next(i for i, x in enumerate(lines) if pick(x))
    lines[i] = edit(lines[i])
    open(path, "w").write("".join(lines))
    return i + 1


def _is_pair(line):
    return line.startswith('{"M"')


def _pair_edit(**fields):
    def edit(line):
        d = json.loads(line)
        d.update(fields)
        return json.dumps(d, separators=(",", ":")) + "\n"
    return edit


def _refusals(rec):
    """The messages of status, merge and a resumed worker on ``rec`` (each must refuse)."""
    out = []
    for call in (lambda: se.status(rec), lambda: se.merge(rec, os.path.join(rec, "t.npz")),
                 lambda: se.run_worker(rec, 0, 3, _fake, max_pairs=1)):
        with pytest.raises(click.ClickException) as e:
            call()
        out.append(e.value.message)
    assert not os.path.exists(os.path.join(rec, "t.npz"))
    return out


def test_a_cut_off_last_line_is_dropped(rec):
    """A worker stopped while writing: the line is dropped by status and merge, and a resumed
    worker asks its pair again."""
    with open(_part(rec), "a") as f:
        f.write('{"M":1,"N":16,"runs":[[3')
    assert se.status(rec)["pairs_done"] == 6
    assert se.merge(rec, os.path.join(rec, "t.npz"))["pairs"] == 6
    assert se.run_worker(rec, 1, 3, _fake, max_pairs=1) == 1
    assert se.status(rec)["pairs_done"] == 7


def test_a_cut_off_line_before_the_last_is_refused(rec):
    n = _edit_line(_part(rec), _is_pair, lambda line: line[:40] + "\n")
    for msg in _refusals(rec):
        assert msg.startswith(f"{_part(rec)}, line {n}: not valid JSON") and "only the last line" in msg, msg


@pytest.mark.parametrize("pick, edit, match", [
    (_is_pair, lambda line: '{"M": 1, "N": 16}\n', r"neither a configuration \(id, cfg\), a pair"),
    (_is_pair, _pair_edit(M="1"), r"a pair line's M and N must be integers \(got '1' and"),
    (_is_pair, _pair_edit(law="maybe"), r"law must be 'derived' or 'checked' where present \(got 'maybe'\)"),
    (_is_pair, _pair_edit(runs=[[5, 0]]), r"runs must be a list of 18 columns, one per combination of the plan "
                                          r"\(got a list of 1\)"),
    (_is_pair, _pair_edit(runs=[[5, 0]] * 18), r"column 0: its runs end at K index 5, not at the end of the plan's "
                                              r"K grid \(80\)"),
    (_is_pair, _pair_edit(runs=[[80, 7]] * 18),
     r"column 0: configuration id 7 is neither -1 \(no algorithm\) nor one of the \d+ defined above it"),
    (_is_pair, _pair_edit(runs=[[40, 0, 20, 0, 80, 0]] * 18), r"column 0: the ends of its runs must increase"),
    (_is_pair, _pair_edit(runs=[["80", 0]] * 18), r"column 0: must hold integers only"),
    (_is_pair, _pair_edit(runs=[[80]] * 18), r"column 0: must be a list \[end, id, end, id, ...\] of even length"),
    (lambda line: '"cfg"' in line, lambda line: '{"id": 5, "cfg": [1, 2]}\n', r"configuration id 5 out of order"),
    (lambda line: '"cfg"' in line, lambda line: '{"id": 0, "cfg": [1, 2]}\n', r"cfg must be a list of 9 integers"),
    (lambda line: True, lambda line: "[1, 2]\n", r"must be a JSON object: a configuration, a pair or a violation"),
    (lambda line: True, lambda line: '{"violation": {"M": 1}}\n', r"a violation needs integers M and N"),
])
def test_wrong_fields_are_refused(rec, pick, edit, match):
    n = _edit_line(_part(rec), pick, edit)
    for msg in _refusals(rec):
        assert msg.startswith(f"{_part(rec)}, line {n}: "), msg
        assert re.search(match, msg), msg


@pytest.mark.parametrize("M, N", [(5000, 16), (1, 24), (1, 80), (0, 16)])
def test_pairs_outside_the_plan_are_refused(rec, M, N):
    """A pair the plan never asks (split bound below 2, N off the grid or past n_max) is not merged."""
    n = _edit_line(_part(rec), _is_pair, _pair_edit(M=M, N=N))
    with pytest.raises(click.ClickException, match=rf"^{_part(rec)}, line {n}: pair \(M, N\) = \({M}, {N}\) is "
                                                   r"outside the record's plan"):
        se.merge(rec, os.path.join(rec, "t.npz"))
    assert not os.path.exists(os.path.join(rec, "t.npz"))


@pytest.mark.parametrize("text, match", [
    (None, r"plan.json: missing; a record folder holds the plan.json that run writes first"),
    ('{"n_max": 64, ', r"plan.json: not valid JSON \(Expecting property name enclosed in double quotes at line 1"),
    ("[]", r"plan.json: must hold a JSON object, a plan \(got list\)"),
    (lambda p: {k: v for k, v in p.items() if k != "k_step"}, r"plan.json: lacks the plan's field\(s\) k_step"),
    (lambda p: dict(p, k_max=10 ** 12), r"plan.json: k_max must be an integer from 16 to 131072 \(got 1000000000000\)"),
    (lambda p: dict(p, k_step=24), r"plan.json: k_step must be a multiple of 16"),
    (lambda p: dict(p, bound=dict(p["bound"], bytes_per_partial=0)),
     r"plan.json: bound: k_per_split, bytes_per_partial and n_align must be positive"),
    (lambda p: dict(p, bound={"k_per_split": 2560}), r"plan.json: bound must be an object of the integers"),
    (lambda p: dict(p, bound=dict(p["bound"], workspace_bytes=1 << 50)),
     r"plan.json: the plan holds [\d,]+ open pairs, more than a record may hold"),
    (lambda p: dict(p, combos=[{"a_dtype": "e4m3"}]), r"plan.json: combos must be a non-empty list of objects"),
])
def test_bad_plans_are_refused(rec, text, match):
    path = os.path.join(rec, "plan.json")
    if text is None:
        os.remove(path)
    else:
        plan = json.load(open(path))
        open(path, "w").write(text if isinstance(text, str) else json.dumps(text(plan)))
    for cmd in (["status", "--dir", rec], ["merge", "--dir", rec, "--out", os.path.join(rec, "t.npz")]):
        r = CliRunner().invoke(se.cli, cmd)
        assert r.exit_code == 1 and r.output.startswith(f"Error: {path}: ") and re.search(match, r.output), r.output
    with pytest.raises(click.ClickException, match=match):
        se.run_worker(rec, 0, 3, _fake, max_pairs=1)


def test_run_refuses_a_corrupt_record_before_any_worker_starts(tmp_path):
    """``run`` continuing a record: its plan.json and every part file are read before the GPU workers start."""
    d = str(tmp_path / "rec")
    plan = se.default_plan(n_max=64, k_max=6400)  # what run --n-max 64 --k-max 6400 asks for
    se._start(d, plan)
    assert se.run_worker(d, 0, 2, _fake, max_pairs=1) == 1
    part = os.path.join(d, "part-000-of-002.jsonl")
    n = _edit_line(part, _is_pair, lambda line: line[:30] + "\n")
    args = ["run", "--dir", d, "--n-max", "64", "--k-max", "6400", "--jobs", "1", "--seconds", "1"]
    r = CliRunner().invoke(se.cli, args)
    assert r.exit_code == 1 and r.output.startswith(f"Error: {part}, line {n}: not valid JSON"), r.output
    open(os.path.join(d, "plan.json"), "w").write("{")
    r = CliRunner().invoke(se.cli, args)
    assert r.exit_code == 1 and "plan.json: not valid JSON" in r.output, r.output


def test_a_table_that_is_not_one_is_refused(rec, tmp_path):
    bad = tmp_path / "t.npz"
    bad.write_bytes(b"not a table")
    r = CliRunner().invoke(se.cli, ["merge", "--dir", rec, "--out", str(tmp_path / "o.npz"), "--table", str(bad)])
    assert r.exit_code == 1 and r.output.startswith(f"Error: --table {bad}: profile: complete split-K table"), r.output


def _continued(tmp_path):
    """(a record of every pair, a record continued from the table of its first 40 pairs, that table)."""
    plan = _small_plan()
    pairs = se.open_pairs(plan)
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    for d in (first, second):
        se._start(d, plan)
    ask = lambda M, N, K, c: _fake(M, N, 256 * (-(-K // 128)) + min(K & -K, 64), dict(c, fast_accum=True))  # noqa: E731
    assert sum(se.run_worker(first, w, 2, ask, max_pairs=20, fast_law=True, k_law=True) for w in range(2)) == 40
    table = str(tmp_path / "first.npz")
    se.merge(first, table)
    from cpemu.splitk_complete import load_complete

    t = load_complete("first.npz", str(tmp_path))
    skip = frozenset((k >> 20, k & 0xFFFFF) for k in t.pairs.tolist())
    assert sum(se.run_worker(second, w, 3, ask, fast_law=True, k_law=True, skip=skip) for w in range(3)) == \
        len(pairs) - 40
    both = str(tmp_path / "both")
    shutil.copytree(second, both)
    for name in os.listdir(first):  # the two records' part files have other names (2 and 3 workers)
        if name.startswith("part-"):
            shutil.copy(os.path.join(first, name), both)
    return both, second, table


def test_merge_with_a_table_writes_the_bytes_of_one_record(tmp_path):
    both, second, table = _continued(tmp_path)
    se.merge(both, str(tmp_path / "one.npz"))
    se.merge(second, str(tmp_path / "cont.npz"), base=table)
    assert open(tmp_path / "one.npz", "rb").read() == open(tmp_path / "cont.npz", "rb").read()


def test_merge_with_a_table_expands_it_pair_by_pair(tmp_path, monkeypatch):
    """The earlier table's columns are expanded while the table is written, one pair at a time, not
    all of them before (that took 8-13 GB for the shipped table)."""
    from cpemu import splitk_complete as sc

    _, second, table = _continued(tmp_path)
    calls, at_write = [], []
    column = sc._Table.column

    def counted(self, p, j):
        calls.append(p)
        return column(self, p, j)

    write = se.write_table

    def spy(*args, **kw):
        at_write.append(len(calls))
        return write(*args, **kw)

    monkeypatch.setattr(sc._Table, "column", counted)
    monkeypatch.setattr(se, "write_table", spy)
    se.merge(second, str(tmp_path / "cont.npz"), base=table)
    assert at_write == [0] and len(calls) > 0
    # each pair's columns are made together, once: pair after pair
    firsts = [p for i, p in enumerate(calls) if i == 0 or calls[i - 1] != p]
    assert len(firsts) == len(set(firsts)) == 40
