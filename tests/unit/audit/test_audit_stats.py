"""Audit statistics: known values, an independent transcription, monotonicity."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sp
import scipy.stats as st
from hypothesis import given, settings
from hypothesis import strategies as st_h

from raco_cli.audit import stats


def _authors_p_value(r, v, eps, m, delta):
    """The authors' appendix code (``p_value_DP_audit``), transcribed loop for loop."""
    q = np.exp(eps) / (1 + np.exp(eps))
    beta = st.binom.sf(v - 1, r, q)
    alpha = 0.0
    total = 0.0
    for i in range(1, v + 1):
        total += st.binom.pmf(v - i, r, q)
        alpha = max(alpha, total / i)
    return min(beta + alpha * delta * 2 * m, 1.0)


def _authors_eps(m, r, v, delta, beta):
    """The authors' 30-step bisection (``get_eps_audit``)."""
    lo, hi = 0.0, 10.0
    if _authors_p_value(r, v, 0.0, m, delta) > beta:
        return 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if _authors_p_value(r, v, mid, m, delta) < beta:
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize("m,r,v,expected", [(1000, 1000, 1000, 5.78), (100, 100, 100, 3.49)])
def test_reference_values_of_the_research_note(m, r, v, expected):
    assert stats.eps_lower_bound_one_run(m, r, v, delta=1e-5, beta=0.05) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("m,r,v", [(2000, 900, 900), (2000, 900, 700), (500, 200, 130), (200, 50, 40)])
def test_matches_the_authors_code(m, r, v):
    ours = stats.eps_lower_bound_one_run(m, r, v, delta=1e-5, beta=0.05)
    assert ours == pytest.approx(_authors_eps(m, r, v, 1e-5, 0.05), abs=1e-4)


def test_pure_dp_all_correct_closed_form():
    # delta = 0 and v = r: p = q_eps^r, so eps_LB = logit(beta^(1/r))
    r, beta = 300, 0.05
    expected = sp.logit(beta ** (1 / r))
    assert stats.eps_lower_bound_one_run(r, r, r, delta=0.0, beta=beta) == pytest.approx(expected, abs=1e-5)


def test_chance_level_gives_zero():
    assert stats.eps_lower_bound_one_run(2000, 900, 450, delta=1e-5, beta=0.05) == 0.0
    assert stats.eps_lower_bound_one_run(2000, 0, 0, delta=1e-5, beta=0.05) == 0.0


@settings(max_examples=30, deadline=None)
@given(st_h.integers(10, 400), st_h.data())
def test_more_correct_guesses_never_lower_the_bound(r, data):
    v = data.draw(st_h.integers(0, r - 1))
    a = stats.eps_lower_bound_one_run(2 * r, r, v, delta=1e-5, beta=0.05)
    b = stats.eps_lower_bound_one_run(2 * r, r, v + 1, delta=1e-5, beta=0.05)
    assert b >= a - 1e-6


def test_clopper_pearson_table_of_the_research_note():
    for n, expected in ((20, 1.60), (50, 2.57), (100, 3.28), (500, 4.91)):
        assert stats.eps_lower_bound_clopper_pearson(0, n, 0, n, delta=1e-5, beta=0.05) == pytest.approx(expected, abs=0.01)
    assert stats.eps_lower_bound_clopper_pearson(50, 100, 50, 100, delta=1e-5, beta=0.05) == 0.0


def test_top_k_breaks_ties_at_random():
    scores = np.zeros(100)
    scores[:10] = 1.0
    rng = np.random.default_rng(0)
    picks = stats.top_k_guesses(scores, 20, rng)
    assert set(range(10)) <= set(picks.tolist())
    others = [stats.top_k_guesses(scores, 20, rng)[10:].tolist() for _ in range(5)]
    assert len({tuple(sorted(o)) for o in others}) > 1  # not always the lowest indices
