"""Shapes beyond the recorded domain: ``domain.no_split`` and the ``beyond`` sample set.

Above the domain's ranges a profile answers only where ``domain["no_split"]`` holds the shape and
nothing can split there. The split bound is computed here from the profile's parameters in numpy,
not by cpemu.splitk's code, so a wrong decision in either direction fails."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

import cpemu
from cpemu.profile import Profile
from cpemu.recording import splitk_measure as sm
from cpemu.schedule import UnsupportedShape
from cpemu.splitk import SplitKRule
from splitk_fixtures import bound_u

H200 = cpemu.get_profile("hopper-h200-torch")
TW = H200.data["modes"]["tensorwise"]["split_k"]
BOUND = TW["params"]["bound"]
WIDE = {"M": [1, 1 << 20], "N": [16, 1 << 20], "K": [16, 1 << 20], "source": "test"}


def _u(M, N, K):
    return int(bound_u(BOUND, M, N, K))


def _rule(no_split=WIDE, kind="rule"):
    dom = dict(TW["domain"])
    if no_split is not None:
        dom["no_split"] = no_split
    return SplitKRule(kind, domain=dom, params=TW["params"] if kind == "rule" else None)


def test_lm_head_decode_is_answered_only_with_no_split():
    """(1, 151936, 4096): N above 131072, and the workspace holds one partial only (u = 1)."""
    assert _u(1, 151936, 4096) == 1
    assert _rule().splits(1, 151936, 4096, True) == 1
    with pytest.raises(UnsupportedShape, match=r"N=151936 is outside the range 16\.\.131072") as e:
        _rule(None).splits(1, 151936, 4096, True)
    assert e.value.reason == "outside-domain"


def test_beyond_the_domain_a_split_shape_is_refused_with_its_bound():
    assert _u(1, 16, 262144) == 102
    with pytest.raises(UnsupportedShape, match=r"only shapes where nothing can split are answered, and up to 102 "
                                               r"slices fit") as e:
        _rule().splits(1, 16, 262144, True)
    assert e.value.reason == "outside-domain"


def test_beyond_no_split_ranges_is_refused_naming_them():
    with pytest.raises(UnsupportedShape, match=r"N=2097152 is outside the range 16\.\.131072 .*, and outside "
                                               r"M 1\.\.1048576, N 16\.\.1048576, K 16\.\.1048576"):
        _rule().splits(1, 1 << 21, 4096, True)


def test_no_split_decisions_follow_the_bound_on_random_shapes():
    """Every shape beyond the domain: 1 exactly where the independent bound is at most 1."""
    rng = np.random.default_rng(5)
    rule, answered, refused = _rule(), 0, 0
    for M, N, K in sm.beyond_shapes(rng, n=2000):
        if _u(M, N, K) <= 1:
            assert rule.splits(M, N, K, True) == 1, (M, N, K)
            answered += 1
        else:
            with pytest.raises(UnsupportedShape):
                rule.splits(M, N, K, False)
            refused += 1
    assert answered > 1000 and refused > 100, (answered, refused)


def test_inside_the_domain_no_split_changes_nothing():
    """The same answers and refusals as the shipped rule inside the recorded ranges."""
    wide, shipped = _rule(), H200.split_rule("tensorwise")
    for M, N, K in [(1, 4096, 4096), (16, 4096, 14336), (4096, 4096, 4096), (1, 106496, 53248)]:
        try:
            want = shipped.splits(M, N, K, True)
        except UnsupportedShape as e:
            with pytest.raises(UnsupportedShape, match=re.escape(str(e).split(";")[0][:40])):
                wide.splits(M, N, K, True)
        else:
            assert wide.splits(M, N, K, True) == want


def test_kind_none_answers_every_shape_of_its_no_split_ranges():
    rule = _rule(kind="none")
    assert rule.splits(1 << 20, 4096, 4096, True) == 1
    assert rule.splits(1, 16, 1 << 20, True) == 1
    with pytest.raises(UnsupportedShape, match="and outside M 1..1048576"):
        rule.splits(1, 16, 1 << 21, True)


def test_the_profile_schema_takes_no_split_with_its_source(tmp_path):
    data = copy.deepcopy(H200.data)
    data["modes"]["tensorwise"]["split_k"]["domain"]["no_split"] = dict(WIDE)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert Profile.from_file(str(path)).split_rule("tensorwise").domain["no_split"]["N"] == [16, 1 << 20]
    del data["modes"]["tensorwise"]["split_k"]["domain"]["no_split"]["source"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="source"):
        Profile.from_file(str(path))


def test_beyond_set_lies_beyond_the_domain():
    shapes = np.array(sm.beyond_shapes(np.random.default_rng(21)))
    assert len(shapes) == 3824 and len({tuple(s) for s in shapes}) == len(shapes)
    assert (shapes.max(axis=1) > sm.DOMAIN_MAX).all() and shapes.max() <= sm.BEYOND_MAX and shapes.min() >= 1
    assert (shapes[:, 1:] % 16 == 0).all()
    for shape in [(1, 151936, 4096), (16384, 262144, 16384), (1 << 20, 4096, 4096), (1, 16, 1 << 20)]:
        assert (shapes == shape).all(axis=1).any(), shape


def test_measure_names_an_unknown_set():
    res = CliRunner().invoke(sm.main, ["--sets", "gran,nope", "--out", "/nonexistent/x"])
    assert res.exit_code == 2 and "'nope' is not a sample set; the sets are gran, large, deepk, beyond" in res.output


def test_info_prints_the_no_split_ranges(monkeypatch):
    """``cpemu info`` names the domain and, where a mode has one, its no-split ranges."""
    import cpemu.cli as cli

    real = cli.get_profile

    def with_no_split(name=cli.DEFAULT_PROFILE):
        p = real(name)
        if p.name != "hopper-h200-torch":
            return p
        data = copy.deepcopy(p.data)
        data["modes"]["tensorwise"]["split_k"]["domain"]["no_split"] = dict(WIDE)
        return Profile(p.name, data)

    monkeypatch.setattr(cli, "get_profile", with_no_split)
    r = CliRunner().invoke(cli.main, ["info"])
    assert r.exit_code == 0, r.output
    assert "domain: M 1..131072, N 16..131072, K 16..131072" in r.output
    assert r.output.count("beyond it, where nothing can split: M 1..1048576, N 16..1048576, K 16..1048576") == 1
