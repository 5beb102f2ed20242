"""The certificate of a released model (raco_cli/constraints/certificate.py): its statistics by
hand, its coverage by Monte Carlo (a certified model fails on fresh data at most 1 - c of the
time, whatever its true rates), its union bound, and the release's sensitivity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raco_cli.constraints.certificate import FRESH_PER_VAL, certify, prediction_counts
from raco_cli.constraints.families import demographic_parity
from raco_cli.constraints.rate import ConstraintSet
from raco_cli.privacy.discrete import discrete_gaussian


def _dp(gamma: float) -> ConstraintSet:
    return ConstraintSet.build(demographic_parity(n_classes=2, n_groups=2, gamma=gamma), n_classes=2, n_groups=2)


def test_the_estimate_and_its_sd_by_hand():
    """Two groups of 5 000 and 10 000 validation rows, positive rates 0.2 and 0.25: the gap is
    0.05; s^2 = (1 + 1 / FRESH_PER_VAL) sum_g p_g (1 - p_g) / n_g exactly (no noise), and the
    noise adds sigma^2 sum_g ((1 - p_g)^2 + p_g^2) / N_g^2 with N_g two sds of a sum of two
    counts lower (the delta method)."""
    counts = np.array([[4000, 1000], [7500, 2500]])
    exact = certify(_dp(0.1), counts, confidence=0.9, count_sd=0.0)
    assert np.abs(exact.estimate).max() == pytest.approx(0.05, abs=1e-12)
    p, n = np.array([0.2, 0.25]), np.array([5000.0, 10000.0])
    sampling = (p * (1 - p) / n).sum() * (1 + 1 / FRESH_PER_VAL)
    assert exact.sd.max() == pytest.approx(np.sqrt(sampling), rel=1e-9)
    sigma = 30.0
    noisy = certify(_dp(0.1), counts, confidence=0.9, count_sd=sigma)
    low = n - 2 * sigma * np.sqrt(2)
    reach = 2 * sigma * np.sqrt(2) / low  # each cell's rate moved towards 1/2 by two noise sds
    p_star = p + reach
    sampling_low = (p_star * (1 - p_star) / low).sum() * (1 + 1 / FRESH_PER_VAL)
    noise = sigma**2 * (((1 - p) ** 2 + p**2) / low**2).sum()
    assert noisy.sd.max() == pytest.approx(np.sqrt(sampling_low + noise), rel=1e-9)


def test_it_holds_at_gamma_plus_slack_and_not_below():
    counts = np.array([[1300, 300], [2600, 800]])  # a gap of 0.048: below gamma, not by enough
    found = certify(_dp(0.05), counts, confidence=0.9, count_sd=11.0)
    assert not found.holds and found.slack > 0
    assert certify(_dp(0.05 + found.slack + 1e-6), counts, confidence=0.9, count_sd=11.0).holds
    assert not certify(_dp(0.05 + found.slack - 1e-4), counts, confidence=0.9, count_sd=11.0).holds
    # achieved: the largest confidence at which it holds at gamma itself
    assert 0 < found.achieved < 0.9
    assert certify(_dp(0.05), counts, confidence=found.achieved - 1e-6, count_sd=11.0).holds


def test_a_choice_among_checkpoints_is_paid_for_by_the_union_bound():
    """best_feasible reads the validation rows: N candidates divide the failure probability,
    so the same counts certify less (a larger slack, a smaller achieved confidence)."""
    counts = np.array([[1300, 300], [2600, 650]])  # a gap of 0.0125
    one = certify(_dp(0.05), counts, confidence=0.9, count_sd=11.0, candidates=1)
    many = certify(_dp(0.05), counts, confidence=0.9, count_sd=11.0, candidates=20)
    assert many.slack > one.slack + 0.005 and not certify(_dp(0.05), [[1300, 300], [2600, 1000]], confidence=0.5,
                                                              count_sd=0.0).achieved  # past gamma: nothing
    assert 1 - many.achieved == pytest.approx(20 * (1 - one.achieved), rel=1e-6)


# --- coverage: Monte Carlo over validation samples, the release's noise and fresh samples ------

N_VAL = np.array([300, 1200])  # a small group: the margin and the noise matter
N_FRESH = np.round(N_VAL * FRESH_PER_VAL).astype(int)
BASE = 0.3
TRIALS = 500


def _fail_and_certified(gap: float, count_sd: int, gamma: float, rng: np.random.Generator, generator: torch.Generator) -> float:
    """P(certified and the fresh gap > gamma) of a model with true positive rates BASE + gap and BASE."""
    p = np.array([BASE + gap, BASE])
    val_pos = rng.binomial(N_VAL, p, size=(TRIALS, 2))
    counts = np.stack([N_VAL - val_pos, val_pos], axis=2)  # (TRIALS, group, class)
    if count_sd:
        counts = counts + discrete_gaussian((TRIALS * 4,), count_sd, generator).numpy().reshape(TRIALS, 2, 2)
    fresh = rng.binomial(N_FRESH, p, size=(TRIALS, 2)) / N_FRESH
    fails = np.abs(fresh[:, 0] - fresh[:, 1]) > gamma
    cons = _dp(gamma)
    both = sum(bool(fails[t]) and certify(cons, counts[t], confidence=0.9, count_sd=float(count_sd)).holds for t in range(TRIALS))
    return both / TRIALS


@pytest.mark.parametrize("count_sd", [0, 21])
def test_a_certified_model_fails_on_fresh_data_at_most_one_minus_c_of_the_time(count_sd):
    """Whatever the true gap (swept across gamma, where certified-and-failing is likeliest),
    the chance of a certificate for a model that then fails on a fresh sample of the test
    split's size is <= 1 - c = 0.1 (MC error sd ~0.013 at 500 trials: 3 sds of slack)."""
    rng, generator = np.random.default_rng(1), torch.Generator().manual_seed(1)
    gamma = 0.12
    worst = max(_fail_and_certified(gap, count_sd, gamma, rng, generator) for gap in (0.08, 0.1, 0.12, 0.14))
    assert worst <= 0.1 + 3 * np.sqrt(0.1 * 0.9 / TRIALS)


def test_the_coverage_check_has_power():
    """Without the certificate (every model claimed) the same models fail far more often than 0.1:
    the check above would see a rule that certifies too much."""
    rng = np.random.default_rng(2)
    p = np.array([BASE + 0.12, BASE])
    fresh = rng.binomial(N_FRESH, p, size=(TRIALS, 2)) / N_FRESH
    assert (np.abs(fresh[:, 0] - fresh[:, 1]) > 0.12).mean() > 0.3


def test_one_record_moves_one_count_by_one():
    """The release's sensitivity: removing any one validation record changes exactly one
    (cell, class) count by exactly 1 (L1 = L2 = 1), whatever the model predicts."""
    rng = np.random.default_rng(0)
    y, group, pred = rng.integers(0, 2, 200), rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    cons = _dp(0.1)
    full = prediction_counts(cons, y, group, pred)
    assert full.sum() == 200
    for i in range(0, 200, 17):
        keep = np.arange(200) != i
        diff = full - prediction_counts(cons, y[keep], group[keep], pred[keep])
        assert np.abs(diff).sum() == 1 and diff.max() == 1
