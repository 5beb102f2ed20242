"""``python -m raco_cli.bench``: the Opacus side-by-side lines (tiny steps and reps)."""

from __future__ import annotations

import sys

import pytest

from raco_cli import bench

pytestmark = pytest.mark.data("adult")

TINY = ["--methods", "raco_dp,dp_sgd", "--steps", "3", "--reps", "1", "--batched", ""]


def test_opacus_line_and_ratio(capsys):
    assert bench.main(TINY) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("opacus_dp_sgd mean "))
    assert "ms/step" in line and "opacus 1." in line
    ratio = next(ln for ln in out.splitlines() if ln.startswith("ratio opacus_dp_sgd/dp_sgd: "))
    assert float(ratio.split()[2]) > 0
    assert "ratio raco_dp/dp_sgd: " in out


def test_no_opacus_prints_no_opacus_line(capsys):
    assert bench.main([*TINY, "--no-opacus"]) == 0
    assert "opacus" not in capsys.readouterr().out


def test_opacus_missing_is_one_line_not_a_crash(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus", None)  # import opacus -> ImportError
    assert bench.main(TINY) == 0
    out = capsys.readouterr().out
    skipped = [ln for ln in out.splitlines() if "opacus" in ln]
    assert len(skipped) == 1 and skipped[0].startswith("opacus_dp_sgd: skipped, Opacus cannot be imported (ModuleNotFoundError")
    assert "ratio raco_dp/dp_sgd: " in out


def test_a_baseline_outside_the_methods_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.cli(["--methods", "raco_dp", "--baseline", "dp_sgd"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("error: --baseline dp_sgd is not among --methods raco_dp; add it to --methods or pick one of them")


def test_the_shared_suffix_times_the_papers_one_batch_step(capsys, monkeypatch):
    """``raco_dp:shared`` trains with sampling=shared (the default methods time it beside the
    default sampling); its ratio line is printed."""
    from raco_cli.methods.sgda import batched

    seen: list[tuple[str, str]] = []
    run = batched.run_one

    def spy(data, model, constraints, spec, **kw):
        seen.append((spec.name, spec.sampling))
        return run(data, model, constraints, spec, **kw)

    monkeypatch.setattr(batched, "run_one", spy)
    assert bench.main(["--steps", "3", "--reps", "1", "--batched", "", "--no-opacus"]) == 0
    assert set(seen) == {("raco_dp", "independent"), ("raco_dp", "shared"), ("dp_sgd", "independent")}
    out = capsys.readouterr().out
    assert "ratio raco_dp/dp_sgd: " in out and "ratio raco_dp:shared/dp_sgd: " in out


def test_an_unknown_suffix_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.cli(["--methods", "raco_dp:bogus,dp_sgd"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("error: --methods raco_dp:bogus: unknown suffix :bogus; allowed: :secure, :shared (e.g. raco_dp:shared)")
