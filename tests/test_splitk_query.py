"""LeanQuerier's self-check (no GPU: the two paths are stood in for; the H200 run compares the real ones)."""

import pytest

from cpemu.recording import splitk_query as sq
from cpemu.recording.splitk_query import LeanQuerier, Querier

COMBO = {"a_dtype": "e4m3", "b_dtype": "e4m3", "out_dtype": "bfloat16", "fast_accum": True}


def _lean(answers):
    q = object.__new__(LeanQuerier)
    q._key, q._made, q._configs, q.asked, q.compared = None, None, {}, 0, 0
    q._lean = lambda M, N, K, c: answers(M, N, K)
    return q


def test_lean_querier_checks_itself(monkeypatch):
    truth = lambda M, N, K: (66, 10, 36, 4, 1 + K // 2560, 0, 0, 1, 0, 16)  # noqa: E731
    monkeypatch.setattr(Querier, "ask", lambda self, M, N, K, c: truth(M, N, K))
    q = _lean(truth)
    for K in range(16, 16 * (sq.LEAN_SELF_CHECK + 2 * sq.LEAN_CHECK_EVERY) + 1, 16):
        assert q.ask(1, 16, K, COMBO) == truth(1, 16, K)
    assert q.compared == sq.LEAN_SELF_CHECK + 2  # the first ones, then every LEAN_CHECK_EVERY-th

    wrong = lambda M, N, K: truth(M, N, K) if K != 48 else None  # noqa: E731
    q = _lean(wrong)
    assert q.ask(1, 16, 16, COMBO) == truth(1, 16, 16)
    with pytest.raises(RuntimeError, match=r"K=48.*not the same question"):
        q.ask(1, 16, 48, COMBO)

    late = sq.LEAN_SELF_CHECK + sq.LEAN_CHECK_EVERY  # a difference after the first checks is seen at the next sample
    q = _lean(lambda M, N, K: truth(M, N, K) if K // 16 < sq.LEAN_SELF_CHECK + 5 else None)
    with pytest.raises(RuntimeError):
        for i in range(1, late + 1):
            q.ask(1, 16, 16 * i, COMBO)
    assert q.asked == sq.LEAN_CHECK_EVERY  # the first sampled answer after the first checks
