"""The DP standardisation (``dataset.preprocessing=dp``, raco_cli/privacy/preprocessing.py):
its sensitivity, its noise scale, its post-processing and its place in the event tree."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.stats import norm

from raco_cli.privacy import accountant
from raco_cli.privacy.preprocessing import (
    dp_standardize,
    moments_to_scaling,
    noisy_moments,
    sensitivity,
)


def _exact(u: np.ndarray) -> np.ndarray:
    return np.concatenate([u.sum(axis=0), (u * u).sum(axis=0)])


@given(arrays(np.float64, st.tuples(st.integers(2, 12), st.integers(1, 6)), elements=st.floats(0.0, 1.0)),
       st.integers(0, 11))
def test_removing_one_record_moves_the_sums_by_at_most_the_sensitivity(u, drop):
    """Add/remove adjacency: the released statistic of a neighbour differs by <= sqrt(2m) in L2."""
    drop %= len(u)
    diff = _exact(u) - _exact(np.delete(u, drop, axis=0))
    assert np.linalg.norm(diff) <= sensitivity(u.shape[1]) + 1e-12


def test_the_bound_is_attained_so_it_is_not_loose():
    u = np.ones((3, 4))
    assert np.linalg.norm(_exact(u) - _exact(u[:2])) == pytest.approx(sensitivity(4)) == pytest.approx(math.sqrt(8))


def test_noise_std_is_sigma_times_sensitivity():
    """Monte Carlo over repeated releases at fixed data: the per-coordinate std is sigma * sqrt(2m)
    (a mutant with std sigma, or without noise, fails), mean zero (unbiased)."""
    u = np.random.default_rng(0).uniform(size=(50, 3))
    g = torch.Generator().manual_seed(1)
    sigma = 2.0
    draws = np.stack([noisy_moments(u, sigma, g) - _exact(u) for _ in range(4000)])
    planned = sigma * math.sqrt(6)
    assert np.allclose(draws.std(axis=0), planned, rtol=0.05)
    assert np.abs(draws.mean(axis=0)).max() < 4 * planned / math.sqrt(4000)


def test_values_outside_the_public_range_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        noisy_moments(np.array([[1.5]]), 1.0, torch.Generator())


def test_post_processing_recovers_mean_and_std_at_negligible_noise():
    u = np.random.default_rng(2).beta(2, 5, size=(10_000, 4))
    mean, std = moments_to_scaling(_exact(u), len(u), 1e-9)
    assert np.allclose(mean, u.mean(axis=0)) and np.allclose(std, u.std(axis=0))


def test_a_variance_below_the_noise_level_is_floored():
    """A constant column: the variance estimate is pure noise, clamped to the noise's std."""
    u = np.full((100, 1), 0.3)
    sigma = 5.0
    _, std = moments_to_scaling(_exact(u), 100, sigma)
    assert std[0] == pytest.approx(math.sqrt(sigma * sensitivity(1) / 100))


def _table(preprocessing="public"):
    import pandas as pd

    from raco_cli.data.tabular import ColumnSpec, build_tabular

    rng = np.random.default_rng(0)
    n = 600
    df = pd.DataFrame({"a": rng.normal(10, 2, n), "b": rng.uniform(0, 50, n), "c": rng.integers(0, 3, n).astype(str)})
    y, group = rng.integers(0, 2, n), rng.integers(0, 2, n)
    return build_tabular("t", df, y=y, group=group, columns=ColumnSpec(numeric=("a", "b"), categorical={"c": ("0", "1", "2")}),
                         class_names=("0", "1"), group_names=("g0", "g1"), split_seed=0, source="test",
                         preprocessing=preprocessing, bounds={"a": [0, 20], "b": [0, 100]})


def test_standardises_only_the_numeric_columns_from_training_rows():
    data = _table()
    out = dp_standardize(data, noise_multiplier=1e-6, source=torch.Generator().manual_seed(0))
    X, X0 = np.asarray(out.X), np.asarray(data.X)
    train = data.splits["train"]
    assert out.preprocessing == "dp" and set(out.meta["dp_scaling"]) == {"a", "b"}
    assert np.allclose(X[train, :2].mean(axis=0), 0, atol=1e-4) and np.allclose(X[train, :2].std(axis=0), 1, atol=1e-4)
    assert np.array_equal(X[:, 2:], X0[:, 2:])  # one-hot columns untouched


def test_test_rows_do_not_enter_the_release():
    """Changing a test-split row leaves the noisy moments (same seed) unchanged."""
    from raco_cli.privacy import releases

    data = _table()
    X2 = np.array(data.X, copy=True)
    X2[data.splits["test"], :2] = -1.0
    from dataclasses import replace

    tapes = []
    for d in (data, replace(data, X=X2)):
        with releases.recording() as tape:
            dp_standardize(d, noise_multiplier=3.0, source=torch.Generator().manual_seed(7))
        tapes.append(tape.entries)
    assert [k for k, _ in tapes[0]] == ["preprocessing"]
    assert np.array_equal(tapes[0][0][1], tapes[1][0][1])


def test_a_dataset_without_public_numeric_columns_makes_no_release():
    data = _table("empirical")
    assert dp_standardize(data, noise_multiplier=1.0, source=torch.Generator()) is data


def test_the_gaussian_release_is_accounted_as_the_analytic_gaussian_mechanism():
    """Independent check: the accountant's eps of GaussianDpEvent(sigma) against the exact
    (eps, delta) curve of the Gaussian mechanism (Balle and Wang 2018, Theorem 8)."""
    sigma, delta = 20.0, 1e-5
    eps = accountant.epsilon(dpa.GaussianDpEvent(sigma), delta, discretization=1e-5)

    def delta_of(e: float) -> float:
        return norm.cdf(1 / (2 * sigma) - e * sigma) - math.exp(e) * norm.cdf(-1 / (2 * sigma) - e * sigma)

    assert delta_of(eps) <= delta * (1 + 1e-6)
    assert delta_of(eps * 0.99) > delta  # and not loose by more than 1 %


@pytest.mark.parametrize(("scope", "expected"), [("model", True), ("paper", False)])
def test_the_plan_composes_the_release_in_scope_model(scope, expected):
    from raco_cli.cli.validate import compose_config
    from raco_cli.run.prepare import prepare_run

    # constraint.confidence=null: 20 steps on the small synthetic table cannot support the default margin
    prep = prepare_run(compose_config(["dataset=synthetic", "eps=2", "method.max_steps=20", f"privacy.scope={scope}",
                                       "constraint.confidence=null"]))
    assert ("GaussianDpEvent(noise_multiplier=20.0)" in str(prep.plan.event)) is expected
    assert prep.data.preprocessing == ("dp" if expected else "empirical")
    assert accountant.epsilon(prep.plan.event, 1e-5) <= 2.0
