"""Progress lines with an estimate on stderr: drawn on a terminal only, after the first second."""

from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

import cpemu
from cpemu import progress as P
from cpemu.cli import main


class _Terminal(io.StringIO):
    def isatty(self):
        return True


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_estimate_and_format():
    clock, out = _Clock(), _Terminal()
    p = P.Progress(400, "work", stream=out, clock=clock)
    clock.t += 10
    p.add(100, "100 of 400")
    assert out.getvalue() == "\r[work] 25.0 % (100 of 400), 10 s elapsed, about 30 s left\033[K"
    clock.t += 200
    p.add(100)
    assert "50.0 %, 3 min 30 s elapsed, about 3 min 30 s left" in out.getvalue()
    p.close()
    assert out.getvalue().endswith("\n")


def test_quiet_in_the_first_second_and_off_a_terminal():
    clock, tty, pipe = _Clock(), _Terminal(), io.StringIO()
    early = P.Progress(10, "x", stream=tty, clock=clock)
    early.add(5)
    early.close()
    assert tty.getvalue() == ""
    redirected = P.Progress(10, "x", stream=pipe, clock=clock)
    clock.t += 5
    redirected.add(5)
    redirected.close()
    assert pipe.getvalue() == ""


def test_duration_text():
    assert [P.duration(s) for s in (4.4, 65, 7322)] == ["4 s", "1 min 05 s", "2 h 02 min"]


def _now(monkeypatch):
    monkeypatch.setattr(P, "DELAY", 0.0)
    monkeypatch.setattr(P, "EVERY", 0.0)


def test_api_progress_on_a_forced_terminal(monkeypatch):
    _now(monkeypatch)
    err = _Terminal()
    monkeypatch.setattr("sys.stderr", err)
    a = np.ones((16, 2048), ml_dtypes.float8_e4m3fn)
    b = np.ones((2048, 32), ml_dtypes.float8_e4m3fn)
    y = cpemu.gemm(a, b, progress=True)
    text = err.getvalue()
    assert "[cpemu.gemm 16x32x2048] " in text and "100.0 %" in text and " left" in text and text.endswith("\n")
    assert np.array_equal(y.view(np.uint16), cpemu.gemm(a, b).view(np.uint16))


def test_api_progress_silent_off_a_terminal(monkeypatch, capsys):
    _now(monkeypatch)
    a = np.ones((16, 2048), ml_dtypes.float8_e4m3fn)
    cpemu.gemm(a, np.ones((2048, 32), ml_dtypes.float8_e4m3fn), progress=True)
    assert capsys.readouterr().err == ""


def test_api_progress_must_be_bool():
    a = np.ones((16, 32), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="^progress: must be a bool"):
        cpemu.gemm(a, np.ones((32, 16), ml_dtypes.float8_e4m3fn), progress="yes")


def test_cli_gemm_progress_on_a_forced_terminal(monkeypatch):
    _now(monkeypatch)
    monkeypatch.setattr(P, "is_terminal", lambda stream: True)
    r = CliRunner().invoke(main, ["gemm", "--demo", "evo2-1b", "--M", "1"])
    assert r.exit_code == 0, r.output
    assert "[cpemu.gemm 1x5760x1920] " in r.stderr and " left" in r.stderr
    assert "[cpemu.gemm" not in r.stdout


def test_cli_gemm_no_progress_off_a_terminal():
    r = CliRunner().invoke(main, ["gemm", "--demo", "evo2-1b", "--M", "1"])
    assert r.exit_code == 0 and "[cpemu.gemm" not in r.stderr


def test_cli_verify_progress_on_a_forced_terminal(monkeypatch, tmp_path):
    from test_api_errors import TEST_DATA, _truth_folder  # the tiny recording made with cpemu

    _now(monkeypatch)
    monkeypatch.setattr(P, "is_terminal", lambda stream: True)
    _truth_folder(tmp_path, corrupt=False)
    prof = tmp_path / "p.json"
    import json

    prof.write_text(json.dumps(TEST_DATA))
    r = CliRunner().invoke(main, ["verify", str(tmp_path), "--profile", str(prof)])
    assert r.exit_code == 0, r.output
    assert "[cpemu verify] 100.0 % (3/3 cases: match 2" in r.stderr and "3/3 cases" in r.stderr
